package proxy

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/kvrouter/kvrouter/emulator"
)

// uiFleet is as much of /ui/api/fleet as the tests read.
type uiFleet struct {
	Policy   string `json:"policy"`
	Index    string `json:"index"`
	Replicas []struct {
		ID           string   `json:"id"`
		Completed    int64    `json:"completed"`
		Predicted    int64    `json:"predicted_cached_tokens"`
		Actual       int64    `json:"actual_cached_tokens"`
		Prompt       int64    `json:"prompt_tokens"`
		HitActual    *float64 `json:"hit_rate_actual"`
		HitPredicted *float64 `json:"hit_rate_predicted"`
		Events       *struct {
			Connected      bool     `json:"connected"`
			LastEventAgeMS *float64 `json:"last_event_age_ms"`
			Fallback       bool     `json:"fallback"`
		} `json:"events"`
	} `json:"replicas"`
}

func getFleet(t *testing.T, url string) uiFleet {
	t.Helper()
	resp, body := do(t, "GET", url+"/ui/api/fleet", "")
	if resp.StatusCode != 200 {
		t.Fatalf("/ui/api/fleet: status %d: %s", resp.StatusCode, body)
	}
	var f uiFleet
	if err := json.Unmarshal([]byte(body), &f); err != nil {
		t.Fatalf("/ui/api/fleet: %v: %s", err, body)
	}
	return f
}

// TestDashboardMounted: the router serves the dashboard at /ui (redirected
// to /ui/), its assets and API, and nothing under /ui/ reaches a replica.
func TestDashboardMounted(t *testing.T) {
	up := newFake(t, 0)
	_, url := startRouter(t, "round-robin", nil, up.URL)
	tests := []struct {
		path, contains string
		status         int
	}{
		{"/ui", `<table id="replicas">`, 200},
		{"/ui/?refresh=100", `<script src="/ui/app.js">`, 200},
		{"/ui/app.js", "/ui/api/decisions", 200},
		{"/ui/api/fleet", `"policy": "round-robin"`, 200},
		{"/ui/api/decisions?n=1", `"decisions": []`, 200},
		{"/ui/nope", "", 404},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			resp, body := do(t, "GET", url+tt.path, "")
			if resp.StatusCode != tt.status || !strings.Contains(body, tt.contains) {
				t.Errorf("status %d, want %d; body contains %q: %v", resp.StatusCode, tt.status, tt.contains, strings.Contains(body, tt.contains))
			}
		})
	}
	if n := len(up.received()); n != 0 {
		t.Errorf("%d /ui requests reached the replica, want 0", n)
	}
}

// TestDashboardHitRates: the dashboard's per-replica hit rates come from
// the engines' usage: cached / prompt tokens of the requests that reported
// both. A usage without prompt_tokens counts toward neither.
func TestDashboardHitRates(t *testing.T) {
	tests := []struct {
		name   string
		usage  string // the upstream's usage object
		actual int64
		prompt int64
		hit    float64 // -1: null
	}{
		{"both", `{"prompt_tokens":100,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":48}}`, 3 * 48, 300, 0.48},
		{"cached only", `{"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":48}}`, 0, 0, -1},
		{"no details", `{"prompt_tokens":100,"completion_tokens":2}`, 0, 0, -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				fmt.Fprintf(w, `{"id":"c","object":"chat.completion","choices":[{"message":{"role":"assistant","content":"Hi"}}],"usage":%s}`, tt.usage)
			}))
			t.Cleanup(up.Close)
			_, url := startRouter(t, "round-robin", nil, up.URL)
			for range 3 {
				if resp, body := do(t, "POST", url+"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`); resp.StatusCode != 200 {
					t.Fatalf("status %d: %s", resp.StatusCode, body)
				}
			}
			r := getFleet(t, url).Replicas[0]
			if r.Completed != 3 || r.Actual != tt.actual || r.Prompt != tt.prompt {
				t.Errorf("completed %d, actual cached %d, prompt %d; want 3, %d, %d", r.Completed, r.Actual, r.Prompt, tt.actual, tt.prompt)
			}
			switch {
			case tt.hit < 0 && r.HitActual != nil:
				t.Errorf("actual hit rate %v, want null", *r.HitActual)
			case tt.hit >= 0 && (r.HitActual == nil || *r.HitActual != tt.hit):
				t.Errorf("actual hit rate %v, want %v", r.HitActual, tt.hit)
			}
			if r.Events != nil {
				t.Errorf("events %+v outside precise mode, want none", r.Events)
			}
		})
	}
}

// TestDashboardPrecise: in precise mode over emulated replicas, the
// dashboard shows the router-wide index, every replica's live event
// stream, and per replica the engines' reported cached and prompt tokens,
// equal to the decision records' sums.
func TestDashboardPrecise(t *testing.T) {
	engines := []*emulator.Server{eventEngine(t, 0, "", "", ""), eventEngine(t, 0, "", "", "")}
	rt, url := preciseRouter(t, []Backend{eventBackend(engines[0]), eventBackend(engines[1])})
	for i := range engines {
		preciseReady(t, rt, i)
	}
	for seed := range 3 {
		converse(t, url, 3, seed+1)
	}
	f := getFleet(t, url)
	if f.Index != IndexPrecise || f.Policy != "kv-aware" {
		t.Errorf("index %q policy %q, want precise kv-aware", f.Index, f.Policy)
	}
	type sums struct{ actual, prompt int64 }
	want := map[string]sums{}
	for _, rec := range rt.Decisions(100) {
		s := want[rec.Replica]
		s.actual += int64(rec.ActualCached)
		s.prompt += int64(rec.PromptTokens)
		want[rec.Replica] = s
	}
	var served int64
	for _, r := range f.Replicas {
		w := want[r.ID]
		if r.Actual != w.actual || r.Prompt != w.prompt {
			t.Errorf("%s: actual cached %d, prompt %d; records say %d, %d", r.ID, r.Actual, r.Prompt, w.actual, w.prompt)
		}
		if w.prompt > 0 && (r.HitActual == nil || *r.HitActual != float64(w.actual)/float64(w.prompt)) {
			t.Errorf("%s: actual hit rate %v, want %v", r.ID, r.HitActual, float64(w.actual)/float64(w.prompt))
		}
		if e := r.Events; e == nil || !e.Connected || e.Fallback || (r.Completed > 0 && e.LastEventAgeMS == nil) {
			t.Errorf("%s: events %+v, want connected, live, with an event if it served", r.ID, e)
		}
		served += r.Completed
	}
	if served != 9 {
		t.Errorf("%d completed, want 9", served)
	}
}
