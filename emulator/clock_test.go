package emulator

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// TestWallClockFollowsEngineTime checks, on synctest's virtual clock, that
// a request's wall latency is its engine latency times TimeScale: the loop
// sleeps exactly until the engine's next wake-up.
func TestWallClockFollowsEngineTime(t *testing.T) {
	tests := []struct {
		scale  float64
		prompt int
		max    int
	}{
		{1, 2000, 10},
		{0.05, 2000, 10},
		{0.05, 10, 200},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("scale=%g/prompt=%d/max=%d", tt.scale, tt.prompt, tt.max), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s, err := New(Config{Preset: "llama3-8b-h100", TimeScale: tt.scale, Model: "m"})
				if err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithCancel(t.Context())
				done := make(chan struct{})
				go func() { s.Run(ctx); close(done) }()
				ids := make([]int, tt.prompt)
				for i := range ids {
					ids[i] = i
				}
				body, _ := json.Marshal(map[string]any{"prompt": ids, "max_tokens": tt.max})
				t0 := time.Now()
				rec := httptest.NewRecorder()
				s.Handler().ServeHTTP(rec, httptest.NewRequest("POST", "/v1/completions", strings.NewReader(string(body))))
				wall := time.Since(t0)
				if rec.Code != 200 {
					t.Fatalf("status %d: %s", rec.Code, rec.Body)
				}
				e2e := engineE2E(t, s)
				want := time.Duration(e2e * tt.scale * float64(time.Second))
				if d := wall - want; math.Abs(float64(d)) > float64(time.Microsecond) {
					t.Errorf("wall latency %v, want engine latency %.6fs × %g = %v", wall, e2e, tt.scale, want)
				}
				cancel()
				<-done
			})
		})
	}
}

// engineE2E reads the e2e latency histogram's sum from the registry.
func engineE2E(t *testing.T, s *Server) float64 {
	t.Helper()
	fams, err := s.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == "vllm:e2e_request_latency_seconds" {
			return f.Metric[0].Histogram.GetSampleSum()
		}
	}
	t.Fatal("no e2e histogram")
	return 0
}
