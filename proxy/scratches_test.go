package proxy

import (
	"fmt"
	"log/slog"
	"net/http/httptest"
	"runtime"
	"testing"

	"github.com/kvrouter/kvrouter/fleet"
	"github.com/kvrouter/kvrouter/prefix"
	"github.com/prometheus/client_golang/prometheus"
)

// TestScratchOutlivesPool: a call's decision scratch goes back to the
// router's list when the call ends, survives the garbage collections that
// empty the call pool, and is the one the next decision borrows; the
// list keeps at most maxIdleScratches.
func TestScratchOutlivesPool(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Policy = "kv-aware"
	for i := range 8 {
		cfg.Backends = append(cfg.Backends, Backend{URL: fmt.Sprintf("http://10.0.%d.1:8000", i)})
	}
	rt, err := New(cfg, Deps{Registry: prometheus.NewRegistry(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	p, err := prefix.Parse([]byte(`{"model":"m","messages":[{"role":"user","content":"hello there"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	decide := func() *fleet.Scratch {
		c := rt.newCall(httptest.NewRequest("POST", "/v1/chat/completions", nil), true)
		if c.seen().Request.Tokens != 0 {
			t.Fatal("a call before its decision has seen a request")
		}
		c.prompt, c.session = p, "s"
		if !c.route(nil) {
			t.Fatal("no replica chosen")
		}
		sc := c.sc
		if sc == nil || c.seen() != sc || sc.Request.Tokens == 0 {
			t.Fatalf("after the decision: scratch %p, seen %+v", sc, c.seen().Request)
		}
		c.ticket.Done(rt.now(), fleet.NoUsage, nil)
		rt.putCall(c)
		return sc
	}
	first := decide()
	runtime.GC() // twice: a sync.Pool keeps its items through one collection
	runtime.GC()
	if next := decide(); next != first {
		t.Error("the decision after two collections borrowed a new scratch, want the one given back")
	}

	var l scratchList
	for range maxIdleScratches + 5 {
		l.put(new(fleet.Scratch))
	}
	if len(l.idle) != maxIdleScratches {
		t.Errorf("kept %d idle scratches, want %d", len(l.idle), maxIdleScratches)
	}
}
