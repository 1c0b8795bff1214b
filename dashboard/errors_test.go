package dashboard_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/emulator"
	"github.com/kvrouter/kvrouter/proxy"
)

// failing serves an emulated replica whose chat completions answer 500
// when fail says so for the request's body; everything else (health,
// metrics, models) is the emulator's.
func failing(t *testing.T, fail func(body []byte) bool) string {
	t.Helper()
	s, err := emulator.New(emulator.Config{Model: "m", Preset: "llama3-8b-h100", TimeScale: 0.05})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	h := s.Handler()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/chat/completions" {
			body, _ := io.ReadAll(r.Body)
			if fail(body) {
				http.Error(w, `{"error":{"message":"injected failure"}}`, http.StatusInternalServerError)
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(func() {
		srv.Close()
		cancel()
		<-done
		s.Close()
	})
	return srv.URL
}

// TestErrorRatePerRequest: clients send M requests through a router with
// retries in front of two replicas, one of which fails every request and
// the other the N requests marked FAIL. A client sees N failures; the
// replicas see more failed attempts (every request first sent to the
// broken one is retried on the other). The dashboard's totals count the
// client requests, N failed of M, and the attempts apart.
func TestErrorRatePerRequest(t *testing.T) {
	const m, n = 24, 3
	cfg := proxy.DefaultConfig()
	cfg.Policy = "round-robin"
	cfg.Retries = 1
	cfg.HealthInterval = time.Hour // the broken replica stays in rotation: its failures are attempts to retry
	cfg.Backends = []proxy.Backend{
		{URL: failing(t, func([]byte) bool { return true })},
		{URL: failing(t, func(b []byte) bool { return bytes.Contains(b, []byte("FAIL")) })},
	}
	api, admin := serveRouter(t, cfg)

	failed := 0
	for i := range m {
		prompt := "hello"
		if i%(m/n) == 0 {
			prompt = "FAIL"
		}
		b, _ := json.Marshal(map[string]any{"model": "m", "max_tokens": 2,
			"messages": []map[string]string{{"role": "user", "content": prompt}}})
		resp, err := http.Post(api+"/v1/chat/completions", "application/json", strings.NewReader(string(b)))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			failed++
		}
	}
	if failed != n {
		t.Fatalf("clients saw %d failures in %d requests, want %d", failed, m, n)
	}
	resp, err := http.Get(admin + "/ui/api/fleet")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var f struct {
		Totals struct {
			Requests       int64 `json:"requests"`
			RequestsFailed int64 `json:"requests_failed"`
			Completed      int64 `json:"completed"`
			Failed         int64 `json:"failed"`
		} `json:"totals"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&f); err != nil {
		t.Fatal(err)
	}
	tot := f.Totals
	if tot.RequestsFailed != n || tot.Requests != m {
		t.Errorf("dashboard: %d failed of %d requests, want %d of %d (what the clients saw)", tot.RequestsFailed, tot.Requests, n, m)
	}
	if tot.Failed <= n || tot.Completed != m-n {
		t.Errorf("dashboard attempts: %d failed, %d completed; want more than %d failed (the retried ones too) and %d completed", tot.Failed, tot.Completed, n, m-n)
	}
}
