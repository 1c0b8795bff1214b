package proxy

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/emulator"
	"github.com/kvrouter/kvrouter/fleet"
	"github.com/kvrouter/kvrouter/internal/wait"
)

// modelEngine starts an emulated engine serving models (the first is the
// base) and LoRA adapters.
func modelEngine(t *testing.T, models []string, loras ...string) *emulator.Server {
	t.Helper()
	e, err := emulator.Start(emulator.Config{Model: models[0], Aliases: models[1:], LoRAs: loras,
		Preset: "llama3-8b-h100", TimeScale: 0.01}, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// TestRoutesByModel: two engines serving different models behind one
// router, their models learned from /v1/models: 200 requests alternating
// models (and an adapter of one) all reach an engine serving their model,
// under every policy; a model no engine serves is a 404.
func TestRoutesByModel(t *testing.T) {
	a := modelEngine(t, []string{"m"})
	b := modelEngine(t, []string{"other", "other-alias"}, "sql-lora")
	serves := map[string]string{"m": a.URL(), "other": b.URL(), "other-alias": b.URL(), "sql-lora": b.URL()}
	for _, policy := range []string{"kv-aware", "round-robin", "session-hash", "chwbl", "sglang-cache-aware", "least-loaded", "preble-e2"} {
		t.Run(policy, func(t *testing.T) {
			rt, url := startRouter(t, policy, nil, a.URL(), b.URL())
			runRouter(t, rt)
			wait.For(t, "models listed", func() bool {
				v := rt.View(time.Now())
				return v.Replicas[0].ModelsKnown && v.Replicas[1].ModelsKnown
			})
			models := []string{"m", "other", "m", "sql-lora", "m", "other-alias"}
			wrong := 0
			for i := range 200 {
				model := models[i%len(models)]
				body := fmt.Sprintf(`{"model":%q,"max_tokens":2,"messages":[{"role":"user","content":"%d %s"}]}`, model, i, words(i%7, 40))
				resp, out := do(t, "POST", url+"/v1/chat/completions", body, "X-Session-ID", fmt.Sprint("s", i%5))
				if resp.StatusCode != 200 {
					t.Fatalf("request %d (%s): status %d: %s", i, model, resp.StatusCode, out)
				}
				if got := resp.Header.Get(HeaderReplica); got != serves[model] {
					wrong++
				}
			}
			if wrong != 0 {
				t.Errorf("%d of 200 requests reached a replica without their model", wrong)
			}
			resp, out := do(t, "POST", url+"/v1/chat/completions", `{"model":"nope","messages":[{"role":"user","content":"hi"}]}`)
			var e apiError
			if json.Unmarshal([]byte(out), &e) != nil || resp.StatusCode != 404 || e.Error.Code != "model_not_found" {
				t.Errorf("unknown model: status %d, %s; want 404 model_not_found", resp.StatusCode, out)
			}
		})
	}
}

// TestDeclaredModels: a backend's declared models (model=) are its own,
// whatever its /v1/models lists, and it is a candidate for no other.
func TestDeclaredModels(t *testing.T) {
	a := modelEngine(t, []string{"m"})
	b := modelEngine(t, []string{"m"})
	rt, url := startRouter(t, "round-robin", func(c *Config) {
		c.Backends[1].Models = []string{"other"}
	}, a.URL(), b.URL())
	runRouter(t, rt)
	for i := range 20 {
		resp, out := do(t, "POST", url+"/v1/completions", fmt.Sprintf(`{"model":"m","max_tokens":1,"prompt":"hi %d"}`, i))
		if resp.StatusCode != 200 || resp.Header.Get(HeaderReplica) != a.URL() {
			t.Fatalf("request %d: status %d on %s: %s; want 200 on %s", i, resp.StatusCode, resp.Header.Get(HeaderReplica), out, a.URL())
		}
	}
}

// TestLoRAPrecise: an adapter's blocks are keyed as the engine keys them
// (its base model plus the adapter's name), so that in precise mode the
// router predicts an adapter's cached tokens exactly, and never from the
// base model's blocks.
func TestLoRAPrecise(t *testing.T) {
	e, err := emulator.Start(emulator.Config{Model: "m", LoRAs: []string{"sql-lora"}, Preset: "llama3-8b-h100", TimeScale: 0.01,
		KVEventsEndpoint: "tcp://127.0.0.1:*", ReplayEndpoint: "tcp://127.0.0.1:*"}, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	rt, url := preciseRouter(t, []Backend{eventBackend(e)})
	wait.For(t, "precise mode and models", func() bool {
		r := rt.View(time.Now()).Replicas[0]
		return r.IndexMode == IndexPrecise && r.ModelsKnown && r.BlockSize > 0
	})
	text := words(5, 200)
	for i, model := range []string{"m", "sql-lora", "sql-lora", "m"} {
		body := fmt.Sprintf(`{"model":%q,"max_tokens":2,"prompt":"%s"}`, model, text)
		if resp, out := do(t, "POST", url+"/v1/completions", body); resp.StatusCode != 200 {
			t.Fatalf("request %d: status %d: %s", i, resp.StatusCode, out)
		}
		settled(t, rt, 0, e)
		rec := rt.Decisions(1)[0]
		if rec.PredictedCached != rec.ActualCached {
			t.Errorf("request %d (%s): predicted %d cached tokens, engine %d", i, model, rec.PredictedCached, rec.ActualCached)
		}
		if first := i < 2; first != (rec.ActualCached == 0) {
			t.Errorf("request %d (%s): engine cached %d tokens; want none on a model's first request, some after", i, model, rec.ActualCached)
		}
	}
	// The overlay of just-routed blocks would hide a wrong key for a few
	// seconds: check that the keys the router routes an adapter's request
	// by are those the engine's events put in the precise index.
	c := decide(t, rt, fmt.Sprintf(`{"model":"sql-lora","prompt":"%s"}`, text))
	defer c.ticket.Done(rt.now(), fleet.NoUsage, nil)
	hs := c.freq.Chains[0].Hashes
	if len(hs) == 0 || !rt.st.fleet.Tracker().Precise().Has(0, hs[len(hs)-1]) {
		t.Errorf("the precise index lacks the adapter request's last block (of %d)", len(hs))
	}
}
