package sim

import (
	"testing"

	"github.com/kvrouter/kvrouter/engine"
	"github.com/kvrouter/kvrouter/route"
	"github.com/kvrouter/kvrouter/trace"
)

// TestDisaggregatedFleet runs 8 replicas, 4 of them prefill workers, on
// unique prompts (log-normal lengths, none shared). vLLM's toy proxy
// (pd-round-robin) sends every prompt to a worker: every decision is a
// leg, the workers decode nothing, every decode replica's request reads
// its blocks from the worker (a transfer each), and since no prompt is
// cached anywhere the hit rate, honestly counted (what the worker
// computed is not a hit on the decode replica), is 0. kv-aware prices
// each: it sends some prompts to the workers and prefills others
// locally. A worker killed mid-run leaves its legs' prompts to their
// decode replicas: nothing fails.
func TestDisaggregatedFleet(t *testing.T) {
	preset, err := engine.Preset("llama3-8b-h100")
	if err != nil {
		t.Fatal(err)
	}
	w, err := trace.Generate("unique", trace.GenOptions{Seed: 1, Requests: 300})
	if err != nil {
		t.Fatal(err)
	}
	for _, kill := range []bool{false, true} {
		cfg := Config{Workload: "unique", Requests: w.Requests, Replicas: 8, PrefillReplicas: 4, Load: 0.8, Preset: preset,
			Policies: []string{"pd-round-robin", "kv-aware"}}
		if kill {
			cfg.Fleet = []trace.FleetEvent{{At: w.Requests[100].At, Kind: trace.Kill, Replica: 0}}
		}
		run, err := Run(cfg)
		if err != nil {
			t.Fatal(err)
		}
		rr, kv := resultOf(t, &run, "pd-round-robin"), resultOf(t, &run, "kv-aware")
		for _, r := range []struct {
			name string
			n    int
		}{{"pd-round-robin", rr.Completed}, {"kv-aware", kv.Completed}} {
			if r.n != len(w.Requests) {
				t.Errorf("kill %v: %s completed %d of %d", kill, r.name, r.n, len(w.Requests))
			}
		}
		t.Logf("kill %v: pd-round-robin %v, transfers %d, hit %.3f; kv-aware %v, slo %.3f vs %.3f", kill, rr.Reasons, rr.Transfers, rr.HitRate, kv.Reasons, kv.SLOMet, rr.SLOMet)
		if kill {
			continue
		}
		if rr.Reasons[route.ReasonDisagg] != len(w.Requests) || rr.Transfers != len(w.Requests) {
			t.Errorf("pd-round-robin: reasons %v, transfers %d: want a leg and a transfer for each of %d", rr.Reasons, rr.Transfers, len(w.Requests))
		}
		for i := range 4 {
			if i < len(rr.PerReplica) && rr.PerReplica[i] != 0 {
				t.Errorf("pd-round-robin: prefill worker %d decoded %d requests", i, rr.PerReplica[i])
			}
		}
		if rr.HitRate != 0 {
			t.Errorf("pd-round-robin hit rate %.3f on unique prompts, want 0", rr.HitRate)
		}
		if kv.Reasons[route.ReasonDisagg] == 0 || kv.Reasons[route.ReasonLocalPrefill] == 0 {
			t.Errorf("kv-aware reasons %v: want both legs and local prefills", kv.Reasons)
		}
	}
}

// TestMooncakeGlobalReadsTheStore: on multi-tenant-context with links
// between replicas, mooncake-global's transfers come from Mooncake's
// pooled store: the engines import blocks (transfers) and no holder runs
// a prefill leg for them, while kv-aware's imports run as the live
// router's two legs.
func TestMooncakeGlobalReadsTheStore(t *testing.T) {
	preset, err := engine.Preset("llama3-8b-h100")
	if err != nil {
		t.Fatal(err)
	}
	const replicas = 4
	w, err := trace.Generate("multi-tenant-context", trace.GenOptions{Seed: 1, Requests: 300, FleetKVTokens: FleetKVTokens(preset, replicas)})
	if err != nil {
		t.Fatal(err)
	}
	o, err := simulate(Config{Requests: w.Requests, Replicas: replicas, Load: 1.2, Preset: preset, InterconnectGBps: 50,
		Policies: []string{"mooncake-global", "kv-aware"}})
	if err != nil {
		t.Fatal(err)
	}
	mg, kv := o.runs[0], o.runs[1]
	t.Logf("mooncake-global: %d transfers, %d legs; kv-aware: %d transfers, %d legs", mg.transfers, mg.legs, kv.transfers, kv.legs)
	if mg.transfers == 0 || mg.legs != 0 {
		t.Errorf("mooncake-global: %d transfers, %d legs; want transfers and no leg", mg.transfers, mg.legs)
	}
	if kv.legs == 0 {
		t.Errorf("kv-aware: no leg; want its imports run as legs on the holder")
	}
}
