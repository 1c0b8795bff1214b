package proxy

import (
	"cmp"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// Keys of TestClientHeaders: plain has no setting, ops has headers=on,
// mute headers=off.
const (
	keyPlain = "sk-plain-0123456789abcdef"
	keyOps   = "sk-ops-0123456789abcdef"
	keyMute  = "sk-mute-0123456789abcdef"
)

// routingHeaders returns the response's X-Kvrouter-* headers.
func routingHeaders(h http.Header) []string {
	var out []string
	for k := range h {
		if strings.HasPrefix(k, headerPrefix) {
			out = append(out, k+": "+h.Get(k))
		}
	}
	return out
}

// TestClientHeaders: without --client-headers a client whose key has no
// headers=on never sees an X-Kvrouter-* header: on a stream, a JSON
// answer, answers retried past a busy (503) and a dead replica, an
// upstream's error passed through (400), the router's own 502 when no
// replica answers, and a replica that sends X-Kvrouter-* headers itself;
// the decision is still recorded. A key with headers=on sees them on the
// same paths, and with --client-headers a key with headers=off does not.
func TestClientHeaders(t *testing.T) {
	busy, bad, good := newFake(t, http.StatusServiceUnavailable), newFake(t, http.StatusBadRequest), newFake(t, 0)
	dead := httptest.NewServer(http.NotFoundHandler())
	dead.Close()
	spoof := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(HeaderReplica, "http://10.0.0.9:8000")
		w.Header().Set("X-Kvrouter-Internal", "topology")
		good.serve(w, r)
	}))
	t.Cleanup(spoof.Close)
	keys := keyFile(t, keyPlain+" app", keyOps+" ops headers=on", keyMute+" mute headers=off")
	hidden := func(c *Config) { c.APIKeys, c.Policy, c.ClientHeaders = keys, "round-robin", false }
	shown := func(c *Config) { c.APIKeys, c.Policy, c.ClientHeaders = keys, "round-robin", true }
	const jsonReq = `{"model":"m","messages":[{"role":"user","content":"x"}]}`
	cases := []struct {
		name     string
		mod      func(*Config)
		backends []string
		status   int
		key      string
		see      bool
		requests int // zero: 6, stream and JSON in turn
	}{
		{"retried/plain", hidden, []string{busy.URL, dead.URL, good.URL}, 200, keyPlain, false, 0},
		{"retried/ops", hidden, []string{busy.URL, dead.URL, good.URL}, 200, keyOps, true, 0},
		{"upstream-400/plain", hidden, []string{bad.URL}, 400, keyPlain, false, 0},
		{"upstream-400/ops", hidden, []string{bad.URL}, 400, keyOps, true, 0},
		{"all-down/plain", hidden, []string{dead.URL}, 502, keyPlain, false, 1}, // then 503: ejected
		{"all-down/ops", hidden, []string{dead.URL}, 502, keyOps, true, 1},
		{"spoofing-replica/plain", hidden, []string{spoof.URL}, 200, keyPlain, false, 0},
		{"flag-on/mute", shown, []string{busy.URL, dead.URL, good.URL}, 200, keyMute, false, 0},
		{"flag-on/plain", shown, []string{busy.URL, dead.URL, good.URL}, 200, keyPlain, true, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rt, api, _ := surfaceRouter(t, tc.mod, tc.backends...)
			n := cmp.Or(tc.requests, 6)
			for i, body := range []string{streamReq, jsonReq, streamReq, jsonReq, streamReq, jsonReq}[:n] {
				resp, out := do(t, "POST", api+"/v1/chat/completions", body, "Authorization", "Bearer "+tc.key)
				if resp.StatusCode != tc.status {
					t.Fatalf("request %d: status %d, want %d: %s", i, resp.StatusCode, tc.status, out)
				}
				got := routingHeaders(resp.Header)
				if !tc.see && len(got) > 0 {
					t.Errorf("request %d: client sees %q, want no X-Kvrouter-* header", i, got)
				}
				if tc.see && resp.Header.Get(HeaderReplica) == "" {
					t.Errorf("request %d: no %s, want one (headers %q)", i, HeaderReplica, got)
				}
			}
			recs := rt.Decisions(n)
			if len(recs) != n {
				t.Fatalf("%d decision records, want %d", len(recs), n)
			}
			for _, rec := range recs {
				if tc.status == 200 && rec.Replica == "" {
					t.Errorf("record %s names no replica", rec.ID)
				}
			}
		})
	}
}

// TestKeyHeadersOption: the key file's headers= option parses with and
// without a name and a priority, in either order, and refuses a bad value.
func TestKeyHeadersOption(t *testing.T) {
	k, err := parseKeys(strings.NewReader("sk-a headers=on\nsk-b team priority=2 headers=off\nsk-c team headers=on priority=-1\nsk-d\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		name    string
		prio    int
		headers int8
	}{{"key-1", 0, 1}, {"team", 2, -1}, {"team", -1, 1}, {"key-4", 0, 0}}
	for i, w := range want {
		if k.names[i] != w.name || k.prios[i] != w.prio || k.headers[i] != w.headers {
			t.Errorf("key %d: got %s %d %d, want %s %d %d", i, k.names[i], k.prios[i], k.headers[i], w.name, w.prio, w.headers)
		}
	}
	if _, err := parseKeys(strings.NewReader("sk-a headers=yes\n")); err == nil || !strings.Contains(err.Error(), "headers") {
		t.Errorf("headers=yes: got %v, want an error naming headers", err)
	}
}
