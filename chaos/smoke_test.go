package chaos

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestHarnessRoutes checks the harness itself: a router process in front
// of two engine processes answers a streamed chat completion to [DONE].
func TestHarnessRoutes(t *testing.T) {
	engines := []*proc{startEngine(t, "--time-scale", "0.01"), startEngine(t, "--time-scale", "0.01")}
	rt := startRouter(t, engines)
	waitReady(t, rt.URL(), "/health", 10e9)
	resp, err := post(context.Background(), t, rt.URL(), "/v1/chat/completions", chat("hello there", 8, true))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), "data: [DONE]") {
		t.Fatalf("status %d, body %q; want 200 ending in [DONE]", resp.StatusCode, b)
	}
}
