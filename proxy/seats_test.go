package proxy

import (
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/emulator"
	"github.com/kvrouter/kvrouter/internal/wait"
	"github.com/kvrouter/kvrouter/route"
)

// TestParseBackendMaxNumSeqs: max_num_seqs= is read, written back, and
// refused when not a positive integer; the YAML mapping takes it too.
func TestParseBackendMaxNumSeqs(t *testing.T) {
	b, err := ParseBackend("http://e:8000,max_num_seqs=8,model=m")
	if err != nil || b.MaxNumSeqs != 8 || b.String() != "http://e:8000,model=m,max_num_seqs=8" {
		t.Errorf("got %+v %q, %v; want 8 seats", b, b.String(), err)
	}
	for _, bad := range []string{"0", "-1", "eight", "99999999"} {
		if _, err := ParseBackend("http://e:8000,max_num_seqs=" + bad); err == nil {
			t.Errorf("max_num_seqs=%s accepted", bad)
		}
	}
}

// seatsOf returns replica i's max_num_seqs as the policy sees it.
func seatsOf(rt *Router, i int) int {
	var s route.Snapshot
	rt.st.fleet.Snapshot(&s, time.Now(), 0)
	return s.Replicas[i].Rates.MaxSeqs
}

// TestEnginesAsConfigured runs two emulated engines that run 8 sequences
// at once (--max-num-seqs 8), one declared with max_num_seqs=8, the other
// not: the declared one is priced with 8 seats from the start, the other
// with the preset's 256 until a burst of 40 requests queues on it, and
// with 8 once its metrics showed 8 running while others waited and were
// admitted as others left; the
// dashboard shows both and where they come from.
func TestEnginesAsConfigured(t *testing.T) {
	if testing.Short() {
		t.Skip("a burst of a few seconds")
	}
	es := make([]*emulator.Server, 2)
	for i := range es {
		s, err := emulator.Start(emulator.Config{Model: "m", Preset: "llama3-8b-h100", TimeScale: 0.5, MaxNumSeqs: 8}, "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		es[i] = s
	}
	rt, url := startRouter(t, "kv-aware", func(c *Config) {
		c.Backends[0].MaxNumSeqs = 8
	}, es[0].URL(), es[1].URL())
	runRouter(t, rt)
	if got := seatsOf(rt, 0); got != 8 {
		t.Errorf("declared replica: %d seats before any traffic, want 8", got)
	}
	if got := seatsOf(rt, 1); got != route.DefaultMaxSeqs {
		t.Errorf("undeclared replica: %d seats before any traffic, want the preset's %d", got, route.DefaultMaxSeqs)
	}
	var wg sync.WaitGroup
	for k := range 40 {
		wg.Go(func() {
			// Answers of different lengths, as traffic has: requests leave
			// one by one and waiting ones take their seats, which is how
			// the router tells seats from other holds (fleet/seats.go).
			body := fmt.Sprintf(`{"model":"m","max_tokens":%d,"messages":[{"role":"user","content":"burst %d %s"}]}`, 90+17*(k%7), k, words(k, 50))
			if resp, b := do(t, "POST", url+chatPath, body); resp.StatusCode != 200 {
				t.Errorf("request %d: %d %s", k, resp.StatusCode, b)
			}
		})
	}
	wait.For(t, "8 seats learned on the undeclared replica", func() bool { return seatsOf(rt, 1) == 8 })
	wg.Wait()
	if got := seatsOf(rt, 0); got != 8 {
		t.Errorf("declared replica: %d seats after the burst, want 8", got)
	}
	// The dashboard says so, and where each figure comes from.
	_, body := do(t, "GET", url+"/ui/api/fleet", "")
	var f struct {
		Replicas []struct {
			MaxSeqs int    `json:"max_num_seqs"`
			Source  string `json:"max_num_seqs_source"`
		} `json:"replicas"`
	}
	if err := json.Unmarshal([]byte(body), &f); err != nil || len(f.Replicas) != 2 {
		t.Fatalf("/ui/api/fleet: %v: %s", err, body)
	}
	if r := f.Replicas; r[0].MaxSeqs != 8 || r[0].Source != "configured" || r[1].MaxSeqs != 8 || r[1].Source != "learned" {
		t.Errorf("dashboard max_num_seqs %+v, want 8 configured, 8 learned", r)
	}
}
