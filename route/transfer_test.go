package route_test

import (
	"math"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/engine"
	"github.com/kvrouter/kvrouter/route"
)

// transferFleet is two replicas of preset rates: replica 0 holds the
// first 8,000 tokens of the request's 8,192 but has a long queue; replica
// 1 is idle and holds nothing. Both transfer over links of gbps GB/s.
func transferFleet(cfg engine.Config, gbps float64, linkWait time.Duration) (*route.Request, *route.Snapshot) {
	rates := cfg.Rates()
	rates.TransferPerMTokens = time.Duration(1e6 * float64(cfg.KVBytesPerToken) / (gbps * 1e9) * float64(time.Second))
	s := &route.Snapshot{BlockSize: 16, Replicas: []route.Replica{
		{ID: "holder", Healthy: true, InFlight: 4, PrefillTokens: 500_000, Rates: rates, LinkWait: linkWait},
		{ID: "idle", Healthy: true, Rates: rates},
	}}
	r := &route.Request{ID: "r", Tokens: 8192, MaxTokens: 64, Blocks: 512, Match: []int{500, 0}, Pinned: -1}
	return r, s
}

// prefill is the model's prefill of n tokens after c cached on an idle
// replica: the compute (linear and attention terms) and one idle
// iteration (the step overhead) per MaxBatchedTokens of it.
func prefill(rt route.Rates, n, c float64) float64 {
	compute := n*float64(rt.PrefillPerToken) + n*(c+n/2)*float64(rt.AttnPerMPairs)*1e-6
	return compute + math.Ceil(n/float64(rt.MaxBatchedTokens))*float64(rt.StepOverhead)
}

// TestTransferBreakEven sweeps the interconnect from 1 to 400 GB/s: on
// the idle replica, importing the holder's 8,000 tokens beats computing
// them exactly where the import's time, 8,000 × KV bytes per token ÷
// bandwidth, drops below what the prefill it spares would cost: its own
// time, P = P(8,192 after 0) − P(192 after 8,000), and the wait of the
// requests that arrive at the replica while it computes, λ·P²/2 summed
// the same way (λ the fleet's per-replica arrival rate, by Little's law
// the mean batch over MeanOutput mean steps; an import holds no GPU, so
// nobody waits behind it). Without arrivals the break-even bandwidth is
// KV bytes per token × the tokens per second of prefill at that context
// (about 2.5 GB/s for Llama-3-8B on one H100, 5 GB/s for Llama-3-70B on
// eight); arrivals lower it.
func TestTransferBreakEven(t *testing.T) {
	const step = 0.25 // GB/s
	for _, name := range []string{"llama3-8b-h100", "llama3-70b-8xh100"} {
		t.Run(name, func(t *testing.T) {
			cfg, err := engine.Preset(name)
			if err != nil {
				t.Fatal(err)
			}
			rt := cfg.Rates().WithDefaults()
			full, rest := prefill(rt, 8192, 0), prefill(rt, 192, 8000)
			meanBatch := 2.0                                                                            // 4 and 0
			lambda := meanBatch / (256 * (float64(rt.DecodeStep) + meanBatch*float64(rt.DecodePerSeq))) // per ns
			saved := full - rest + lambda*(full*full-rest*rest)/2
			want := 8000 * float64(cfg.KVBytesPerToken) / saved // bytes per ns = GB/s
			switched := 0.0
			for gbps := 1.0; gbps <= 400; gbps += step {
				r, s := transferFleet(cfg, gbps, 0)
				d := route.KVAware{}.Pick(r, s)
				if d.Replica != 1 {
					t.Fatalf("at %v GB/s chose replica %d (%s), want the idle one", gbps, d.Replica, d.Reason)
				}
				importing := d.Transfer.Blocks > 0
				switch {
				case importing && switched == 0:
					switched = gbps
					if d.Reason != route.ReasonTransfer || d.Transfer.From != 0 || d.Transfer.Blocks != 500 || d.Matched != 8000 {
						t.Errorf("at %v GB/s: %+v, want a transfer of the holder's 500 blocks", gbps, d)
					}
				case !importing && switched > 0:
					t.Fatalf("back to recompute at %v GB/s after importing from %v", gbps, switched)
				}
			}
			t.Logf("switched to transfer at %.2f GB/s; break-even %.2f GB/s", switched, want)
			if switched == 0 || math.Abs(switched-want) > step {
				t.Errorf("switched to transfer at %v GB/s, want the break-even %.2f ± %v", switched, want, step)
			}
		})
	}
}

// TestTransferWaitsForTheLink: a link still busy for a second with other
// transfers makes computing the prefix cheaper than importing it, even
// over 50 GB/s.
func TestTransferWaitsForTheLink(t *testing.T) {
	cfg, err := engine.Preset("llama3-8b-h100")
	if err != nil {
		t.Fatal(err)
	}
	r, s := transferFleet(cfg, 50, 0)
	if d := (route.KVAware{}).Pick(r, s); d.Transfer.Blocks == 0 {
		t.Fatalf("idle 50 GB/s link: %+v, want a transfer", d)
	} else if want := time.Duration(8000 * float64(s.Replicas[1].Rates.TransferPerMTokens) * 1e-6); d.Transfer.Time != want {
		t.Errorf("predicted transfer %v, want %v", d.Transfer.Time, want)
	}
	r, s = transferFleet(cfg, 50, time.Second)
	if d := (route.KVAware{}).Pick(r, s); d.Transfer.Blocks != 0 || d.Replica != 1 {
		t.Errorf("link busy for 1 s: %+v, want a recompute on the idle replica", d)
	}
}

// TestTransferOrdersTheWholeMatch: the holder's match is old enough that
// each of its blocks is still resident only with some probability, so
// the import is priced on fewer tokens than it matched; but it orders all
// 500 matched blocks. The source sends what it still holds: an order cut
// to the expected share would leave the rest of the prefix to be computed
// on the idle replica whenever the holder still had it.
func TestTransferOrdersTheWholeMatch(t *testing.T) {
	cfg, err := engine.Preset("llama3-8b-h100")
	if err != nil {
		t.Fatal(err)
	}
	r, s := transferFleet(cfg, 50, 0)
	for i := range s.Replicas {
		s.Replicas[i].CacheBlocks = 2000
		s.Replicas[i].Rates.Horizon = 10 * time.Minute
	}
	r.Age = []time.Duration{9 * time.Minute, 0}
	d := route.KVAware{}.Pick(r, s)
	if d.Replica != 1 || d.Transfer.From != 0 {
		t.Fatalf("%+v, want an import from the holder to the idle replica", d)
	}
	if d.Matched <= 0 || d.Matched >= 8000 {
		t.Errorf("predicted cached %d, want the expected share of the holder's 8,000 (0 < it < 8,000)", d.Matched)
	}
	if d.Transfer.Blocks != 500 {
		t.Errorf("ordered %d blocks, want all 500 the holder matched", d.Transfer.Blocks)
	}
}

// TestTransferTakesOnlySettledBlocks: the holder's index matches 500
// blocks, but a request it has yet to prefill is computing them
// (Request.Settled): none can be imported, and the idle replica computes
// the prompt. With 300 of them computed it imports those 300, priced as
// such.
func TestTransferTakesOnlySettledBlocks(t *testing.T) {
	cfg, err := engine.Preset("llama3-8b-h100")
	if err != nil {
		t.Fatal(err)
	}
	r, s := transferFleet(cfg, 50, 0)
	r.Settled = []int{0, 0}
	if d := (route.KVAware{}).Pick(r, s); d.Transfer.Blocks != 0 || d.Replica != 1 || d.Matched != 0 {
		t.Errorf("nothing settled: %+v, want a recompute on the idle replica", d)
	}
	r.Settled = []int{300, 0}
	d := route.KVAware{}.Pick(r, s)
	if d.Replica != 1 || d.Transfer.From != 0 || d.Transfer.Blocks != 300 || d.Matched != 300*16 {
		t.Errorf("300 blocks settled: %+v, want an import of those 300", d)
	}
	if want := time.Duration(300 * 16 * float64(s.Replicas[1].Rates.TransferPerMTokens) * 1e-6); d.Transfer.Time != want {
		t.Errorf("predicted transfer %v, want %v", d.Transfer.Time, want)
	}
}

// TestKVAwarePricesCopies: an import, like a recompute, stores on the idle
// replica a copy of the 8,000 tokens the holder caches, and each token it
// stores evicts one that requests ask for again with probability
// Displaced (the replica's measured share): Memory carries 2 × Displaced ×
// the prefill of the copy, which the next request pays in both
// latencies. With nothing displaced the import to the idle replica wins
// over the holder's queue; when what it evicts is asked for again, the
// holder's queue is the cheaper price, and going there copies nothing.
func TestKVAwarePricesCopies(t *testing.T) {
	cfg, err := engine.Preset("llama3-8b-h100")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		displaced float64
		want      int
	}{{0, 1}, {0.25, 1}, {1, 0}} {
		r, s := transferFleet(cfg, 50, 0)
		s.Replicas[0].PrefillTokens = 6000
		for i := range s.Replicas {
			s.Replicas[i].Rates.Displaced = tc.displaced
		}
		d := route.KVAware{}.Pick(r, s)
		if d.Replica != tc.want {
			t.Errorf("Displaced %g: chose %d (%s), want %d", tc.displaced, d.Replica, d.Reason, tc.want)
		}
		rt := s.Replicas[1].Rates.WithDefaults()
		copied := 8000.0
		want := 2 * tc.displaced * (copied*float64(rt.PrefillPerToken) + copied*copied/2*float64(rt.AttnPerMPairs)*1e-6)
		for _, k := range d.Costs {
			switch {
			case k.Replica == 1 && math.Abs(float64(k.Memory)-want) > 1e3:
				t.Errorf("Displaced %g: the idle replica's Memory %v, want %v", tc.displaced, k.Memory, time.Duration(want))
			case k.Replica == 0 && k.Memory != 0:
				t.Errorf("Displaced %g: the holder's Memory %v, want 0 (it copies nothing)", tc.displaced, k.Memory)
			}
		}
	}
}
