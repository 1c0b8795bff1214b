package proxy

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/internal/wait"
)

// longChat is a streamed chat request of about tokens prompt tokens in
// text mode (four characters a token), distinct per seed.
func longChat(seed, tokens, maxTokens int) string {
	return fmt.Sprintf(`{"model":"m","stream":true,"max_tokens":%d,"messages":[{"role":"user","content":%q}]}`,
		maxTokens, words(seed, tokens*4/9))
}

// admitted is one client's outcome: status, Retry-After, error code, and
// when its first byte arrived.
type admitted struct {
	status     int
	retryAfter string
	body       string
	first      time.Time
}

func send(t *testing.T, url, body string, hdr ...string) admitted {
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Error(err)
		return admitted{}
	}
	defer resp.Body.Close()
	var one [1]byte
	io.ReadFull(resp.Body, one[:])
	a := admitted{status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After"), first: time.Now()}
	rest, _ := io.ReadAll(resp.Body)
	a.body = string(one[:]) + string(rest)
	return a
}

// waitQueued waits until the router's admission queue holds n requests.
func waitQueued(t *testing.T, rt *Router, n int) {
	t.Helper()
	wait.For(t, fmt.Sprintf("the queue to hold %d", n), func() bool { return rt.adm.q.Len() == n })
}

// TestAdmissionQueuesWhenSaturated: on one real-time emulated replica, a
// request whose predicted wait (the queued prefill ahead) is past
// --max-wait waits in the router rather than in the engine; the queue
// serves the highest priority first, a full queue leaves out the lowest
// (429 with Retry-After), a sheddable request (negative priority) is
// rejected at once, and /metrics counts each rejection.
func TestAdmissionQueuesWhenSaturated(t *testing.T) {
	reps := replicas(t, 1, 1)
	rt, url := startRouter(t, "kv-aware", func(c *Config) {
		c.Admission.MaxWait, c.Admission.MaxQueue, c.Admission.QueueTimeout = 50*time.Millisecond, 2, 20*time.Second
	}, urls(reps)...)
	runRouter(t, rt)

	// 16,000 tokens prefill in ~0.9 s on the preset: the first request is
	// taken at once, and until its first token every later one finds a
	// backlog past 50 ms.
	out := make([]chan admitted, 5)
	run := func(i int, hdr ...string) {
		out[i] = make(chan admitted, 1)
		go func() { out[i] <- send(t, url, longChat(i, 16000, 2), hdr...) }()
	}
	run(0)
	wait.For(t, "the first request in flight", func() bool { return rt.st.fleet.View(time.Now()).Replicas[0].InFlight > 0 })
	run(1)
	waitQueued(t, rt, 1)
	run(2)
	waitQueued(t, rt, 2)
	full := send(t, url, longChat(3, 16000, 2)) // no room, no rank: left out
	run(4, HeaderPriority, "5")                 // outranks 2, which is left out
	evicted := <-out[2]
	shed := send(t, url, longChat(5, 16000, 2), HeaderPriority, "-1")
	waitQueued(t, rt, 2)
	if rt.st.fleet.View(time.Now()).Replicas[0].InFlight != 1 {
		t.Fatal("the steps above outlasted the first request's prefill; the test needs a longer prompt")
	}

	for name, a := range map[string]admitted{"full queue": full, "left out": evicted, "sheddable": shed} {
		if a.status != http.StatusTooManyRequests || a.retryAfter == "" {
			t.Errorf("%s: status %d, Retry-After %q; want 429 with Retry-After", name, a.status, a.retryAfter)
		}
	}
	if !strings.Contains(shed.body, `"queue_sheddable"`) || !strings.Contains(full.body, `"queue_full"`) {
		t.Errorf("error codes: sheddable %s, full %s", shed.body, full.body)
	}
	first, high, low := <-out[0], <-out[4], <-out[1]
	for name, a := range map[string]admitted{"first": first, "priority 5": high, "priority 0": low} {
		if a.status != http.StatusOK || !strings.Contains(a.body, "[DONE]") {
			t.Errorf("%s: status %d, body %.200q; want a whole stream", name, a.status, a.body)
		}
	}
	if !high.first.Before(low.first) {
		t.Errorf("priority 5 first byte at %v, priority 0 at %v: want the higher priority served first", high.first, low.first)
	}
	if n := metricValue(t, url, "kvrouter_errors_total", "code", "queue_full"); n != 2 {
		t.Errorf("kvrouter_errors_total{code=queue_full} = %v, want 2", n)
	}
	if n := metricValue(t, url, "kvrouter_errors_total", "code", "queue_sheddable"); n != 1 {
		t.Errorf("kvrouter_errors_total{code=queue_sheddable} = %v, want 1", n)
	}
}

// TestAdmissionQueueTimeout: a request that stays queued past
// --queue-timeout gets 429, and one with a malformed priority 400.
func TestAdmissionQueueTimeout(t *testing.T) {
	reps := replicas(t, 1, 1)
	rt, url := startRouter(t, "kv-aware", func(c *Config) {
		c.Admission.MaxWait, c.Admission.QueueTimeout = 50*time.Millisecond, 100*time.Millisecond
	}, urls(reps)...)
	runRouter(t, rt)
	first := make(chan admitted, 1)
	go func() { first <- send(t, url, longChat(0, 30000, 2)) }()
	wait.For(t, "the first request in flight", func() bool { return rt.st.fleet.View(time.Now()).Replicas[0].InFlight > 0 })
	start := time.Now()
	late := send(t, url, longChat(1, 1000, 2))
	if late.status != http.StatusTooManyRequests || !strings.Contains(late.body, `"queue_timeout"`) {
		t.Errorf("queued past the timeout: status %d, body %s; want 429 queue_timeout", late.status, late.body)
	}
	if d := time.Since(start); d < 100*time.Millisecond || d > 2*time.Second {
		t.Errorf("answered after %v, want about the 100 ms timeout", d)
	}
	if bad := send(t, url, longChat(2, 100, 2), HeaderPriority, "high"); bad.status != http.StatusBadRequest {
		t.Errorf("X-Priority: high: status %d, want 400", bad.status)
	}
	if a := <-first; a.status != http.StatusOK {
		t.Errorf("first request: status %d", a.status)
	}
}

// TestAdmissionKeyPriority: an API key's priority=N is the default
// priority of its requests and the highest they may claim: a key marked
// priority=-1 is sheddable when every replica is saturated, also when
// its request claims X-Priority: 1000; a key may lower its own.
func TestAdmissionKeyPriority(t *testing.T) {
	reps := replicas(t, 1, 1)
	keys := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(keys, []byte("sk-online online priority=10\nsk-batch batch priority=-1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	rt, url := startRouter(t, "kv-aware", func(c *Config) {
		c.Admission.MaxWait, c.APIKeys = 50*time.Millisecond, keys
	}, urls(reps)...)
	runRouter(t, rt)
	first := make(chan admitted, 1)
	go func() { first <- send(t, url, longChat(0, 16000, 2), "Authorization", "Bearer sk-online") }()
	wait.For(t, "the first request in flight", func() bool { return rt.st.fleet.View(time.Now()).Replicas[0].InFlight > 0 })
	shed := send(t, url, longChat(1, 16000, 2), "Authorization", "Bearer sk-batch")
	claimed := send(t, url, longChat(2, 100, 2), "Authorization", "Bearer sk-batch", HeaderPriority, "1000")
	lowered := send(t, url, longChat(3, 100, 2), "Authorization", "Bearer sk-online", HeaderPriority, "-5")
	kept := send(t, url, longChat(4, 100, 2), "Authorization", "Bearer sk-online", HeaderPriority, "5")
	for _, a := range []struct {
		name string
		got  admitted
	}{{"a priority=-1 key", shed}, {"a priority=-1 key claiming X-Priority: 1000", claimed}, {"a priority=10 key with X-Priority: -5", lowered}} {
		if a.got.status != http.StatusTooManyRequests || !strings.Contains(a.got.body, `"queue_sheddable"`) {
			t.Errorf("%s when saturated: status %d %s; want 429 queue_sheddable", a.name, a.got.status, a.got.body)
		}
	}
	if kept.status != http.StatusOK {
		t.Errorf("a priority=10 key with X-Priority: 5: status %d %s; want it queued, then 200", kept.status, kept.body)
	}
	if a := <-first; a.status != http.StatusOK {
		t.Errorf("first request: status %d", a.status)
	}
}
