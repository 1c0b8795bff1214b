package chaos

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/internal/wait"
)

// soakFor overrides the soak's duration: 1 minute by default, 10 with
// -chaos.long.
var soakFor = flag.Duration("chaos.soak", 0, "soak duration (0: 1 minute, 10 minutes with -chaos.long)")

// soakSample is the router's footprint at one moment of the soak.
type soakSample struct {
	at                    time.Duration
	rss                   int64
	goroutines, fds, sess int
}

// sample reads p's RSS, open FDs (/proc/<pid>/fd), and goroutines and
// bound sessions (its /metrics on the admin surface at admin).
func sample(t *testing.T, p *proc, admin string, at time.Duration) soakSample {
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", p.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	return soakSample{at: at, rss: p.RSS(), fds: len(fds),
		goroutines: int(metric(t, admin, "go_goroutines")), sess: int(metric(t, admin, "kvrouter_sessions"))}
}

// Soak load and bounds.
const (
	soakClients     = 32
	soakEngines     = 3
	soakMaxSessions = 5000
	// soakMaxRSS bounds the router's RSS over the soak, soakRSSGrowth its
	// growth from the first third to the last.
	soakMaxRSS, soakRSSGrowth = 256 << 20, 32 << 20
	// soakMaxFDs bounds the FDs opened over the idle router's: one per
	// client connection, at most one per client per engine upstream.
	soakMaxFDs = soakClients*(1+soakEngines) + 16
	// soakPerFD and soakSpare bound the goroutines over the idle router's
	// at every sample: a few per open connection (server, transport read
	// and write loops), soakSpare more; a goroutine not explained by a
	// connection is a leak.
	soakPerFD, soakSpare = 3, 20
)

// TestSoak runs sustained streaming load, a new session per request, from
// 32 clients against a router in front of 3 engines, for 1 minute (10
// with -chaos.long, or -chaos.soak=DURATION) with --max-sessions 5000,
// and checks that the router's RSS and open FDs stay bounded and its RSS
// does not grow, that its goroutines (go_goroutines) are those of its
// open connections, that no request fails, that the
// session table stays within its cap, and that once the clients close
// their connections it holds only its upstream pool:
//
//	go test ./chaos -run TestSoak -v -chaos.soak=1m
func TestSoak(t *testing.T) {
	d := time.Minute
	if *long {
		d = 10 * time.Minute
	}
	if *soakFor > 0 {
		d = *soakFor
	}
	var engines []*proc
	for range soakEngines {
		engines = append(engines, startEngine(t, "--time-scale", "0.01"))
	}
	rt := startRouter(t, engines, "--max-sessions", fmt.Sprint(soakMaxSessions))
	admin := rt.AdminURL()
	waitReady(t, rt.URL(), "/health", 10*time.Second)
	idle := sample(t, rt, admin, 0)

	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: soakClients}}
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var done, failed atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	for c := range soakClients {
		wg.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				err := soakRequest(ctx, client, rt.URL(), c, i)
				switch {
				case ctx.Err() != nil:
				case err != nil:
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err)
				default:
					done.Add(1)
				}
			}
		})
	}
	start := time.Now()
	var samples []soakSample
	for tick := time.NewTicker(max(d/30, time.Second)); ctx.Err() == nil; {
		select {
		case <-tick.C:
			samples = append(samples, sample(t, rt, admin, time.Since(start)))
		case <-ctx.Done():
		}
	}
	wg.Wait()
	took := time.Since(start)
	client.CloseIdleConnections()
	http.DefaultClient.CloseIdleConnections() // the harness's readiness probes
	wait.Within(t, 10*time.Second, "the router to close its client connections after the clients", func() bool { return clientConns(t, rt) == 0 })
	settled := sample(t, rt, admin, time.Since(start))
	evicted := metric(t, admin, "kvrouter_sessions_evicted_total")
	checkSoak(t, samples, idle, settled, soakFigures{
		took: took, done: done.Load(), failed: failed.Load(), evicted: evicted,
	})
	if err, _ := firstErr.Load().(error); err != nil {
		t.Errorf("first failure: %v", err)
	}
}

// soakFigures are the soak's totals.
type soakFigures struct {
	took         time.Duration
	done, failed int64
	evicted      float64
}

// checkSoak logs the soak's figures and checks its bounds.
func checkSoak(t *testing.T, samples []soakSample, idle, settled soakSample, f soakFigures) {
	t.Helper()
	if len(samples) < 3 {
		t.Fatalf("%d samples, want at least 3 (a longer -chaos.soak)", len(samples))
	}
	third := len(samples) / 3
	first, last, all := peak(samples[:third]), peak(samples[len(samples)-third:]), peak(samples)
	t.Logf("soak %v, %d clients, a new session per request: %d requests (%.0f/s), %d failed; %.0f sessions evicted (--max-sessions %d)",
		f.took.Round(time.Second), soakClients, f.done, float64(f.done)/f.took.Seconds(), f.failed, f.evicted, soakMaxSessions)
	t.Logf("router idle: RSS %d MB, %d goroutines, %d FDs", idle.rss>>20, idle.goroutines, idle.fds)
	t.Logf("router under load, peak of the first third / last third / all: RSS %d / %d / %d MB, goroutines %d / %d / %d, FDs %d / %d / %d, sessions %d / %d / %d",
		first.rss>>20, last.rss>>20, all.rss>>20, first.goroutines, last.goroutines, all.goroutines,
		first.fds, last.fds, all.fds, first.sess, last.sess, all.sess)
	t.Logf("router once the clients closed their connections (it holds none): RSS %d MB, %d goroutines, %d FDs", settled.rss>>20, settled.goroutines, settled.fds)
	if f.failed > 0 || f.done == 0 {
		t.Errorf("%d requests failed, %d succeeded; want 0 failures", f.failed, f.done)
	}
	if all.rss > soakMaxRSS || last.rss-first.rss > soakRSSGrowth {
		t.Errorf("RSS peaked at %d MB, grew by %d MB from the first third to the last; want at most %d and %d MB",
			all.rss>>20, (last.rss-first.rss)>>20, soakMaxRSS>>20, soakRSSGrowth>>20)
	}
	if all.fds-idle.fds > soakMaxFDs {
		t.Errorf("%d FDs open, %d more than idle, want at most %d more", all.fds, all.fds-idle.fds, soakMaxFDs)
	}
	for _, s := range samples {
		if want := idle.goroutines + soakPerFD*(s.fds-idle.fds) + soakSpare; s.goroutines > want {
			t.Errorf("at %v: %d goroutines with %d FDs open, want at most %d (the idle %d, %d per extra FD, %d more)",
				s.at.Round(time.Second), s.goroutines, s.fds, want, idle.goroutines, soakPerFD, soakSpare)
			break
		}
	}
	if all.sess > soakMaxSessions {
		t.Errorf("%d sessions bound, want at most %d", all.sess, soakMaxSessions)
	}
	// Once the clients have closed theirs, the router holds only its pool
	// of keep-alive connections to the engines (at most one per client
	// per engine), each with its two transport goroutines.
	pooled := settled.fds - idle.fds
	if pooled > soakClients*soakEngines || settled.goroutines > idle.goroutines+2*pooled+5 {
		t.Errorf("after the load: %d goroutines and %d FDs (%d more than idle), want at most %d more FDs and the idle %d goroutines plus 2 per extra FD",
			settled.goroutines, settled.fds, pooled, soakClients*soakEngines, idle.goroutines)
	}
}

// peak returns the largest of each figure over samples.
func peak(samples []soakSample) soakSample {
	var p soakSample
	for _, s := range samples {
		p.rss, p.goroutines, p.fds, p.sess = max(p.rss, s.rss), max(p.goroutines, s.goroutines), max(p.fds, s.fds), max(p.sess, s.sess)
	}
	return p
}

// soakRequest streams one chat completion of client c's request i, in a
// session of its own, and checks it ends with [DONE].
func soakRequest(ctx context.Context, client *http.Client, url string, c, i int) error {
	body := chat(fmt.Sprintf("You are a helpful assistant. Soak client %d, request %d: tell me about the number %d.", c, i, i*7919), 8, true)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", strings.NewReader(string(body)))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Session-ID", fmt.Sprintf("soak-%d-%d", c, i))
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), "data: [DONE]") {
		return fmt.Errorf("status %d, body %.200q", resp.StatusCode, b)
	}
	return nil
}

// clientConns counts the TCP connections p holds on its listening port
// (accepted ones, not the listener): the sockets among its FDs that
// /proc/net/tcp lists with that local port.
func clientConns(t *testing.T, p *proc) int {
	t.Helper()
	_, portStr, _ := net.SplitHostPort(p.addr)
	port, _ := strconv.ParseUint(portStr, 10, 16)
	dir := fmt.Sprintf("/proc/%d/fd", p.cmd.Process.Pid)
	fds, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	inodes := map[string]bool{}
	for _, fd := range fds {
		if l, err := os.Readlink(dir + "/" + fd.Name()); err == nil {
			if in, ok := strings.CutPrefix(l, "socket:["); ok {
				inodes[strings.TrimSuffix(in, "]")] = true
			}
		}
	}
	n := 0
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(table)
		if err != nil {
			continue
		}
		for line := range strings.Lines(string(b)) {
			f := strings.Fields(line)
			// sl local_address rem_address st ... inode (field 9)
			if len(f) < 10 || !inodes[f[9]] || f[3] == "0A" { // 0A: LISTEN
				continue
			}
			if i := strings.LastIndexByte(f[1], ':'); i >= 0 {
				if lp, err := strconv.ParseUint(f[1][i+1:], 16, 16); err == nil && lp == port {
					n++
				}
			}
		}
	}
	return n
}
