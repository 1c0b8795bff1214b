package kube

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// vclock is a virtual clock for Follow: sleeping advances it at once, so
// the tests count requests per virtual second whatever the machine's
// speed.
type vclock struct {
	mu sync.Mutex
	t  time.Time
}

func (v *vclock) now() time.Time {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.t
}

func (v *vclock) advance(d time.Duration) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.t = v.t.Add(d)
}

func (v *vclock) sleep(ctx context.Context, d time.Duration) bool {
	if ctx.Err() != nil {
		return false
	}
	v.advance(d)
	return true
}

// counted is a loopback API server whose answers the test writes: it
// records each request (list or watch) at its virtual time and stops the
// follower after limit requests.
type counted struct {
	clock  *vclock
	limit  int
	cancel context.CancelFunc
	answer func(w http.ResponseWriter, r *http.Request, n int) // n: this request's index

	mu    sync.Mutex
	kinds []string        // "list" or "watch"
	at    []time.Duration // virtual time since the start
}

func (s *counted) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	n := len(s.at)
	kind := "list"
	if r.URL.Query().Get("watch") == "true" {
		kind = "watch"
	}
	s.kinds = append(s.kinds, kind)
	s.at = append(s.at, s.clock.now().Sub(time.Time{}))
	if len(s.at) >= s.limit {
		s.cancel()
	}
	s.mu.Unlock()
	s.answer(w, r, n)
}

// follow runs Follow against answer until limit requests came, and
// returns what the server counted.
func follow(t *testing.T, limit int, answer func(w http.ResponseWriter, r *http.Request, n int)) *counted {
	return followOn(t, &vclock{}, limit, answer)
}

// followOn is follow on a clock the answers can advance.
func followOn(t *testing.T, clock *vclock, limit int, answer func(w http.ResponseWriter, r *http.Request, n int)) *counted {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := &counted{clock: clock, limit: limit, cancel: cancel, answer: answer}
	ts := httptest.NewServer(s)
	defer ts.Close()
	c, err := New(Config{Server: ts.URL})
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	c.now, c.sleep, c.jitter = s.clock.now, s.clock.sleep, rng.Float64
	done := make(chan error, 1)
	go func() { done <- c.Follow(ctx, Collection{Path: "/api/v1/namespaces/llm/pods"}, nopHandler{}, nil) }()
	select {
	case <-done:
	case <-time.After(time.Minute): // a bound on a hung test, not a threshold: the loop runs at loopback speed
		t.Fatalf("Follow made %d requests and did not stop", len(s.at))
	}
	return s
}

type nopHandler struct{}

func (nopHandler) Replace([]Object)     {}
func (nopHandler) Apply(string, Object) {}

func emptyList(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprint(w, `{"kind":"PodList","metadata":{"resourceVersion":"7"},"items":[]}`)
}

// rate checks that after the first ramp requests every request came at
// least 1 s (virtual) after the one before it, and none more than
// 2 × maxBackoff after, unless allowed says so.
func (s *counted) rate(t *testing.T, ramp int) {
	t.Helper()
	for i := ramp; i < len(s.at); i++ {
		if gap := s.at[i] - s.at[i-1]; gap < time.Second || gap >= 2*maxBackoff {
			t.Fatalf("request %d (%s) came %v after the one before; want 1 s ≤ gap < %v", i, s.kinds[i], gap, 2*maxBackoff)
		}
	}
	total := s.at[len(s.at)-1]
	if perSec := float64(len(s.at)-ramp) / total.Seconds(); perSec > 1 {
		t.Fatalf("%d requests in %v: %.2f a second, want ≤ 1", len(s.at), total, perSec)
	}
}

// TestWatchEndingAtOnceBacksOff: a server that ends every watch at once
// (200, no event) is asked at most once a virtual second after the
// backoff's first waits, and never relisted (the version is still good):
// 200 requests take more than 40 minutes of virtual time, where the
// follower without backoff made ~600 a second.
func TestWatchEndingAtOnceBacksOff(t *testing.T) {
	s := follow(t, 200, func(w http.ResponseWriter, r *http.Request, n int) {
		if r.URL.Query().Get("watch") != "true" {
			emptyList(w)
			return
		}
		w.Header().Set("Content-Type", "application/json")
	})
	if s.kinds[0] != "list" || strings.Count(strings.Join(s.kinds, ","), "list") != 1 {
		t.Errorf("requests %v: want one list, then watches", s.kinds[:min(10, len(s.kinds))])
	}
	s.rate(t, 3)
	if last := s.at[len(s.at)-1]; last < 40*time.Minute {
		t.Errorf("200 requests in %v of virtual time, want more than 40 min (the backoff's cap)", last)
	}
}

// TestGoneRelistsWithoutAStorm: a server that answers every watch 410
// Gone (as an HTTP status, then as an ERROR event) is relisted after a
// jittered, growing wait: lists come at most once a second.
func TestGoneRelistsWithoutAStorm(t *testing.T) {
	for _, form := range []string{"status", "event"} {
		t.Run(form, func(t *testing.T) {
			s := follow(t, 100, func(w http.ResponseWriter, r *http.Request, n int) {
				if r.URL.Query().Get("watch") != "true" {
					emptyList(w)
					return
				}
				gone := `{"kind":"Status","status":"Failure","reason":"Expired","code":410,"message":"too old resource version: 7 (9)"}`
				if form == "status" {
					w.WriteHeader(http.StatusGone)
					fmt.Fprint(w, gone)
					return
				}
				fmt.Fprintf(w, `{"type":"ERROR","object":%s}`+"\n", gone)
			})
			var lists []time.Duration
			for i, k := range s.kinds {
				if k == "list" {
					lists = append(lists, s.at[i])
				}
				if k == "watch" && (i == 0 || s.kinds[i-1] != "list") {
					t.Fatalf("request %d: a watch not after a list; a 410 must relist", i)
				}
			}
			for i := 3; i < len(lists); i++ {
				if gap := lists[i] - lists[i-1]; gap < time.Second {
					t.Fatalf("list %d came %v after the one before, want ≥ 1 s", i, gap)
				}
			}
			if len(lists) < 40 {
				t.Errorf("%d lists in 100 requests, want each 410 relisted", len(lists))
			}
		})
	}
}

// TestRetryAfterHonoured: a 429 with Retry-After (the API server's
// "storage is (re)initializing"), on a list or as a watch's Status
// event's retryAfterSeconds, is waited for as asked (plus ≤ 10 %), not
// for the backoff; an absurd one is bounded by maxRetryAfter.
func TestRetryAfterHonoured(t *testing.T) {
	tooMany := func(secs int) string {
		return fmt.Sprintf(`{"kind":"Status","status":"Failure","reason":"TooManyRequests","code":429,"message":"storage is (re)initializing","details":{"retryAfterSeconds":%d}}`, secs)
	}
	for _, tc := range []struct {
		name string
		want time.Duration // the wait before the request after the 429
		at   int           // the request that answers 429
		send func(w http.ResponseWriter)
	}{
		{"header on a list", 7 * time.Second, 0, func(w http.ResponseWriter) {
			w.Header().Set("Retry-After", "7")
			w.WriteHeader(http.StatusTooManyRequests)
			fmt.Fprint(w, tooMany(1))
		}},
		{"status on a list", 3 * time.Second, 0, func(w http.ResponseWriter) {
			w.WriteHeader(http.StatusTooManyRequests)
			fmt.Fprint(w, tooMany(3))
		}},
		{"event in a watch", 4 * time.Second, 1, func(w http.ResponseWriter) {
			fmt.Fprintf(w, `{"type":"ERROR","object":%s}`+"\n", tooMany(4))
		}},
		{"zero", time.Second, 0, func(w http.ResponseWriter) {
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(http.StatusTooManyRequests)
		}},
		{"a day", maxRetryAfter, 0, func(w http.ResponseWriter) {
			w.Header().Set("Retry-After", "86400")
			w.WriteHeader(http.StatusServiceUnavailable)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := follow(t, tc.at+2, func(w http.ResponseWriter, r *http.Request, n int) {
				switch {
				case n == tc.at:
					tc.send(w)
				case r.URL.Query().Get("watch") != "true":
					emptyList(w)
				default:
					w.Header().Set("Content-Type", "application/json")
				}
			})
			gap := s.at[tc.at+1] - s.at[tc.at]
			if gap < tc.want || gap > tc.want+tc.want/10 {
				t.Errorf("waited %v after the 429, want %v (+ ≤ 10 %%)", gap, tc.want)
			}
		})
	}
}

// TestStableWatchResetsBackoff: after watches that ended at once grew
// the backoff, a watch that lived stableWatch resets it: the next watch
// starts at once, and the one after an early end waits minBackoff again.
func TestStableWatchResetsBackoff(t *testing.T) {
	clock := &vclock{}
	s := followOn(t, clock, 11, func(w http.ResponseWriter, r *http.Request, n int) {
		switch {
		case r.URL.Query().Get("watch") != "true":
			emptyList(w)
		case n == 8: // this watch lives stableWatch (virtual), then ends
			clock.advance(stableWatch)
		}
	})
	if gap := s.at[7] - s.at[6]; gap < maxBackoff {
		t.Fatalf("the 7th watch came %v after the 6th, want the backoff grown to %v", gap, maxBackoff)
	}
	if gap := s.at[9] - s.at[8]; gap != stableWatch {
		t.Errorf("the watch after a stable one came %v after it started, want %v (its life, no wait)", gap, stableWatch)
	}
	if gap := s.at[10] - s.at[9]; gap < minBackoff || gap >= 2*minBackoff {
		t.Errorf("after a stable watch, an early end waited %v, want the backoff reset to [%v, %v)", gap, minBackoff, 2*minBackoff)
	}
}
