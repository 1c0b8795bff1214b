package chaos

import (
	"net/http"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestFleetStall stops (SIGSTOP) every engine for 3 s, as CPU starvation
// of their host does, while requests wait for their first token, and
// resumes them: probes eject every replica meanwhile, and the requests
// are held on their replicas (no other is in service to retry on), not
// failed: all of them end 200 with the whole reply.
func TestFleetStall(t *testing.T) {
	if testing.Short() {
		t.Skip("stalls a fleet for seconds")
	}
	engines := []*proc{startEngine(t), startEngine(t)}
	rt := startRouter(t, engines, "--policy", "round-robin", "--ttft-timeout", "30s")
	waitReady(t, rt.URL(), "/health", 10*time.Second)
	const tokens = 40
	want := wholeText(t, engines[0].URL(), tokens)
	for _, e := range engines {
		e.Signal(syscall.SIGSTOP)
	}
	res := make([]plainResult, 6)
	var wg sync.WaitGroup
	for i := range res {
		wg.Go(func() { res[i] = plainChat(t, rt.URL(), tokens, i) })
	}
	time.Sleep(3 * time.Second) // a stall: probes (every 100 ms) eject both
	for _, e := range engines {
		e.Signal(syscall.SIGCONT)
	}
	wg.Wait()
	for i, r := range res {
		if r.status != http.StatusOK || r.text != want {
			t.Errorf("request %d: status %d, text %q; want 200, the whole reply", i, r.status, r.text)
		}
	}
	// Held, not merely slow: probes did eject the replicas under them.
	if held := metricSum(t, rt.AdminURL(), "kvrouter_stall_holds_total"); held < 1 {
		t.Errorf("kvrouter_stall_holds_total %v, want the held attempts counted", held)
	}
	if ej := metricSum(t, rt.AdminURL(), "kvrouter_ejections_total", `kind="probe"`); ej < 2 {
		t.Errorf("%v probe ejections, want both replicas ejected during the stall", ej)
	}
}
