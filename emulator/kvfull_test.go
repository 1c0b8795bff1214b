package emulator

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/kvrouter/kvrouter/internal/wait"
)

// ids returns n token ids from base on.
func ids(base, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(base + i)
	}
	return out
}

// holdStream starts a streaming request and returns once its first chunk
// arrived (the request runs and holds its blocks), with a func that
// disconnects it.
func holdStream(t *testing.T, url string, body any) (disconnect func()) {
	t.Helper()
	b, _ := json.Marshal(body)
	resp, err := http.Post(url, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		msg, _ := io.ReadAll(resp.Body)
		t.Fatalf("held request: status %d: %s", resp.StatusCode, msg)
	}
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "data: ") {
		t.Fatalf("held request: first line %q, %v", line, err)
	}
	return func() { resp.Body.Close() }
}

// kvFullRequests are the requests made while a 640-token request runs on a
// 64-block cache (41 to 47 blocks held, so 17 to 23 free).
var kvFullRequests = []struct {
	name   string
	prompt []uint32
	stream bool
	full   bool // more uncached blocks than free ones
	cached int
}{
	{"25 new blocks", ids(20_000, 400), false, true, 0},
	{"25 new blocks, streaming", ids(20_000, 400), true, true, 0},
	{"10 new blocks", ids(30_000, 160), false, false, 0},
	// The held prompt's first 39 blocks, then one of its own: 1 new block.
	{"39 cached blocks of 40", append(ids(10_000, 624), ids(40_000, 16)...), false, false, 624},
}

func TestKVFullStatus(t *testing.T) {
	// TimeScale 3: the held request's 100 decode steps last about 2.5 s.
	s := start(t, Config{KVBlocks: 64, KVFullStatus: 500, TimeScale: 3})
	disconnect := holdStream(t, s.URL()+"/v1/completions",
		map[string]any{"prompt": ids(10_000, 640), "max_tokens": 100, "stream": true})
	defer disconnect()
	for _, tt := range kvFullRequests {
		t.Run(tt.name, func(t *testing.T) {
			body := map[string]any{"prompt": tt.prompt, "max_tokens": 1, "stream": tt.stream}
			b, _ := json.Marshal(body)
			resp, err := http.Post(s.URL()+"/v1/completions", "application/json", bytes.NewReader(b))
			if err != nil {
				t.Fatal(err)
			}
			out, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if !tt.full {
				if resp.StatusCode != 200 {
					t.Fatalf("status %d, want 200: %s", resp.StatusCode, out)
				}
				if got := decodeResponse(t, out).Usage.PromptTokensDetails.CachedTokens; got != tt.cached {
					t.Errorf("cached_tokens %d, want %d", got, tt.cached)
				}
				return
			}
			if resp.StatusCode != 500 || resp.Header.Get("Content-Type") != "application/json" {
				t.Fatalf("status %d, content type %q, want 500 and JSON: %s", resp.StatusCode, resp.Header.Get("Content-Type"), out)
			}
			if e := decodeError(t, out); e.Code != 500 || e.Type != "InternalServerError" ||
				!strings.Contains(e.Message, "needs 25 more blocks") {
				t.Errorf("error body %s, want an OpenAI error with code 500 saying 25 blocks are needed", out)
			}
		})
	}
	if got := s.Rejected(); got != 2 {
		t.Errorf("Rejected() = %d, want 2", got)
	}
	disconnect()
	wait.For(t, "the held request to end", func() bool { return s.Stats().UsedBlocks == 0 })
	// The held request's blocks are evictable now: a prompt of 40 new
	// blocks fits.
	if code, b := post(t, s.URL()+"/v1/completions", map[string]any{"prompt": ids(50_000, 640), "max_tokens": 1}); code != 200 {
		t.Errorf("after the held request: status %d: %s", code, b)
	}
}

func TestKVFullQueuesByDefault(t *testing.T) {
	s := start(t, Config{KVBlocks: 64, TimeScale: 3})
	disconnect := holdStream(t, s.URL()+"/v1/completions",
		map[string]any{"prompt": ids(10_000, 640), "max_tokens": 100, "stream": true})
	b, _ := json.Marshal(map[string]any{"prompt": ids(20_000, 400), "max_tokens": 1})
	done := postAsync(s.URL()+"/v1/completions", string(b))
	wait.For(t, "the request to wait for blocks", func() bool { return s.Stats().Waiting == 1 })
	disconnect()
	if code := <-done; code != 200 {
		t.Errorf("queued request: status %d, want 200", code)
	}
	if got := s.Rejected(); got != 0 {
		t.Errorf("Rejected() = %d, want 0", got)
	}
}
