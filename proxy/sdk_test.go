package proxy

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// openAINodeDir is the OpenAI Node SDK (npm package openai, pinned in
// .ci/run, which unpacks it there): $KVROUTER_OPENAI_NODE_DIR, else
// .cache/openai-node at the module root. Without it, or without node, the
// test skips, except in CI, where it fails.
func openAINodeDir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("KVROUTER_OPENAI_NODE_DIR")
	if dir == "" {
		dir = filepath.Join("..", ".cache", "openai-node")
	}
	_, errPkg := os.Stat(filepath.Join(dir, "index.mjs"))
	_, errNode := exec.LookPath("node")
	if err := errPkg; err != nil || errNode != nil {
		if err == nil {
			err = errNode
		}
		if os.Getenv("CI") != "" {
			t.Fatalf("OpenAI Node SDK or node missing in CI (.ci/run installs them): %v", err)
		}
		t.Skipf("OpenAI Node SDK not installed (run .ci/run once, or set KVROUTER_OPENAI_NODE_DIR): %v", err)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		t.Fatal(err)
	}
	return abs
}

// TestOpenAINodeSDKResponses: the OpenAI Node SDK's responses.create works
// through the router, not streamed and streamed: the chain's follow-up
// reaches the replica that holds the first response, finds the first
// turn in that engine's cache, and the SDK parses every event.
func TestOpenAINodeSDKResponses(t *testing.T) {
	sdk := openAINodeDir(t)
	reps := replicas(t, 3, 0.01)
	rt, url := startRouter(t, "kv-aware", nil, urls(reps)...)
	runRouter(t, rt)
	cmd := exec.Command("node", filepath.Join("testdata", "responses_sdk.mjs"), sdk, url)
	cmd.WaitDelay = time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("node: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != 2 {
		t.Fatalf("want two result lines, got:\n%s", out)
	}
	type result struct {
		ID, Status, Text string
		Types            []string
		Usage            struct {
			InputTokens        int `json:"input_tokens"`
			OutputTokens       int `json:"output_tokens"`
			InputTokensDetails struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"input_tokens_details"`
		}
	}
	var first, second result
	if json.Unmarshal([]byte(lines[0]), &first) != nil || json.Unmarshal([]byte(lines[1]), &second) != nil {
		t.Fatalf("results are not JSON:\n%s", out)
	}
	if !strings.HasPrefix(first.ID, "resp_") || first.Text == "" || first.Usage.OutputTokens != 8 {
		t.Errorf("first: %+v, want an id, output_text and 8 output tokens", first)
	}
	if second.Text == "" || second.Status != "incomplete" || len(second.Types) < 9 || second.Types[0] != "response.created" {
		t.Errorf("stream: %+v, want text, status incomplete and OpenAI's events from response.created", second)
	}
	if second.Usage.InputTokensDetails.CachedTokens < first.Usage.InputTokens-16 {
		t.Errorf("follow-up cached %d tokens, want the first turn's %d but its last partial block", second.Usage.InputTokensDetails.CachedTokens, first.Usage.InputTokens)
	}
	recs := rt.Decisions(2)
	if len(recs) != 2 || recs[0].Replica != recs[1].Replica {
		t.Errorf("records %+v, want both requests on one replica", recs)
	}
}
