package loadgen

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvrouter/kvrouter/trace"
)

// TestErrorKinds drives loadgen against loopback servers that answer
// badly and checks each request's error kind.
func TestErrorKinds(t *testing.T) {
	const okStream = "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}],\"usage\":null}\n\n" +
		"data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}],\"usage\":null}\n\n" +
		"data: {\"choices\":[{\"delta\":{\"content\":\" there\"}}],\"usage\":null}\n\n" +
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":40,\"completion_tokens\":2,\"prompt_tokens_details\":{\"cached_tokens\":32}}}\n\n" +
		"data: [DONE]\n\n"
	for _, tc := range []struct {
		name    string
		handler http.HandlerFunc
		timeout time.Duration
		want    Sample // the fields compared: Err, Chunks, tokens, Usage, Replica, Reason, PredictedCached
	}{
		{"ok", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set(HeaderReplica, "http://r1")
			w.Header().Set(HeaderDecision, "reason=prefix; predicted-cached=32; cost=1.500ms; session=header; id=kvr-1-1")
			w.Write([]byte(okStream))
		}, 0, Sample{Chunks: 2, PromptTokens: 40, CachedTokens: 32, OutputTokens: 2, Usage: true, Replica: "http://r1", Reason: "prefix", PredictedCached: 32}},
		{"no usage", func(w http.ResponseWriter, r *http.Request) {
			w.Write([]byte("data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: [DONE]\n\n"))
		}, 0, Sample{Chunks: 1, OutputTokens: 1, PredictedCached: -1}},
		{"status", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set(HeaderDecision, "reason=least-cost; predicted-cached=0; cost=3.000ms; session=; id=kvr-1-2")
			http.Error(w, `{"error":{"message":"busy"}}`, http.StatusServiceUnavailable)
		}, 0, Sample{Err: "http 503", Reason: "least-cost", PredictedCached: 0}},
		{"no done", func(w http.ResponseWriter, r *http.Request) {
			w.Write([]byte(okStream[:strings.Index(okStream, "data: [DONE]")]))
		}, 0, Sample{Err: ErrStream, Chunks: 2, PromptTokens: 40, CachedTokens: 32, OutputTokens: 2, Usage: true, PredictedCached: -1}},
		{"bad json", func(w http.ResponseWriter, r *http.Request) {
			w.Write([]byte("data: {not json\n\n"))
		}, 0, Sample{Err: ErrStream, PredictedCached: -1}},
		{"timeout", func(w http.ResponseWriter, r *http.Request) {
			w.Write([]byte(": keep-alive\n\n"))
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		}, 50 * time.Millisecond, Sample{Err: ErrTimeout, PredictedCached: -1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(tc.handler)
			defer srv.Close()
			res, err := Run(context.Background(), Config{Target: srv.URL, Model: "m", RequestTimeout: tc.timeout,
				Requests: []trace.Request{{ID: "a", Segments: []trace.Segment{{ID: 1, Tokens: 8}}, Prompt: 8, Output: 2}}})
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Samples) != 1 {
				t.Fatalf("got %d samples, want 1", len(res.Samples))
			}
			s := res.Samples[0]
			got := Sample{Err: s.Err, Chunks: s.Chunks, PromptTokens: s.PromptTokens, CachedTokens: s.CachedTokens,
				OutputTokens: s.OutputTokens, Usage: s.Usage, Replica: s.Replica, Reason: s.Reason, PredictedCached: s.PredictedCached}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("sample (-want +got):\n%s", d)
			}
		})
	}
}

// TestConnectError sends to a closed port.
func TestConnectError(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	res, err := Run(context.Background(), Config{Target: "http://" + addr, Model: "m",
		Requests: []trace.Request{{ID: "a", Segments: []trace.Segment{{ID: 1, Tokens: 8}}, Prompt: 8, Output: 2}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := res.Samples[0].Err; got != ErrConnect {
		t.Errorf("error kind %q, want %q", got, ErrConnect)
	}
}

// TestMessages checks how prompts become chat messages: a conversation's
// next turn extends the previous turn's messages.
func TestMessages(t *testing.T) {
	seg := func(id uint64, n int) trace.Segment { return trace.Segment{ID: id, Tokens: n} }
	text := func(id uint64, n int) string { return string(trace.AppendSegmentText(nil, seg(id, n))) }
	for _, tc := range []struct {
		name   string
		req    trace.Request
		system int
		want   []Message
	}{
		{"no session", trace.Request{Segments: []trace.Segment{seg(1, 3), seg(2, 2)}}, 0,
			[]Message{{"user", text(1, 3) + text(2, 2)}}},
		{"turn 1", trace.Request{Session: "s", Segments: []trace.Segment{seg(1, 3), seg(2, 2)}}, 0,
			[]Message{{"system", text(1, 3)}, {"user", text(2, 2)}}},
		{"turn 2", trace.Request{Session: "s", Segments: []trace.Segment{seg(1, 3), seg(2, 2), seg(3, 4), seg(4, 1)}}, 0,
			[]Message{{"system", text(1, 3)}, {"user", text(2, 2)}, {"assistant", text(3, 4)}, {"user", text(4, 1)}}},
		{"two system segments", trace.Request{Session: "s", Segments: []trace.Segment{seg(1, 3), seg(2, 2), seg(3, 4)}}, 2,
			[]Message{{"system", text(1, 3) + text(2, 2)}, {"user", text(3, 4)}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if d := cmp.Diff(tc.want, Messages(&tc.req, tc.system)); d != "" {
				t.Errorf("messages (-want +got):\n%s", d)
			}
		})
	}
}

// TestArrivals checks the open-loop schedule: scaled by the time scale,
// or rescaled to a rate.
func TestArrivals(t *testing.T) {
	reqs := []trace.Request{{At: 10 * time.Second}, {At: 11 * time.Second}, {At: 14 * time.Second}}
	for _, tc := range []struct {
		name        string
		rate, scale float64
		want        []time.Duration
	}{
		{"as is", 0, 1, []time.Duration{0, time.Second, 4 * time.Second}},
		{"time scale", 0, 0.5, []time.Duration{0, 500 * time.Millisecond, 2 * time.Second}},
		{"rate 1/s", 1, 1, []time.Duration{0, 500 * time.Millisecond, 2 * time.Second}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if d := cmp.Diff(tc.want, arrivals(reqs, tc.rate, tc.scale)); d != "" {
				t.Errorf("arrivals (-want +got):\n%s", d)
			}
		})
	}
}

func TestParseDecision(t *testing.T) {
	tests := []struct {
		in        string
		reason    string
		predicted int
		ok        bool
	}{
		{"reason=prefix; predicted-cached=1024; cost=12.500ms; session=header; id=kvr-1-7", "prefix", 1024, true},
		{"reason=round-robin; predicted-cached=0; score=3; session=; id=x; retried=1", "round-robin", 0, true},
		{"reason=prefix", "prefix", -1, true},
		{"reason=prefix; predicted-cached=-4", "prefix", -1, true},
		{"reason=prefix; predicted-cached=lots", "prefix", -1, true},
		{"predicted-cached=5", "", 5, false},
		{"", "", -1, false},
		{"garbage without fields", "", -1, false},
		{"reason=" + strings.Repeat("x", maxDecisionHeader), "", -1, false},
	}
	for _, tt := range tests {
		reason, pred, ok := parseDecision(tt.in)
		if reason != tt.reason || pred != tt.predicted || ok != tt.ok {
			t.Errorf("parseDecision(%.40q): got %q, %d, %v; want %q, %d, %v", tt.in, reason, pred, ok, tt.reason, tt.predicted, tt.ok)
		}
	}
}

// TestSessionOrder: a session's turn waits for its previous turn, except
// the requests Parallel names, which wait for nothing and which no later
// turn waits for.
func TestSessionOrder(t *testing.T) {
	reqs := []trace.Request{
		{ID: "a0", Session: "a"}, {ID: "b0", Session: "b"}, {ID: "a1", Session: "a"},
		{ID: "p0", Session: "p", Tenant: "agent"}, {ID: "p1", Session: "p", Tenant: "agent"}, {ID: "a2", Session: "a"},
	}
	parallel := func(q *trace.Request) bool { return q.Tenant == "agent" }
	prev, done := sessionOrder(reqs, parallel)
	want := []int{-1, -1, 0, -1, -1, 2} // index of the request each waits for
	for i, w := range want {
		switch {
		case w < 0 && prev[i] != nil:
			t.Errorf("%s waits, want it not to", reqs[i].ID)
		case w >= 0 && prev[i] != done[w]:
			t.Errorf("%s does not wait for %s", reqs[i].ID, reqs[w].ID)
		}
	}
	prev, _ = sessionOrder(reqs, nil)
	if prev[4] == nil {
		t.Errorf("without Parallel, p1 does not wait for p0")
	}
}
