package emulator

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/kvrouter/kvrouter/route"
)

// TestSideChannelHostile: asks that are too large, malformed, name too
// many or foreign ids, or a request that holds nothing get a clear
// OpenAI-shaped error; none disturbs the hold, which a proper read then
// takes.
func TestSideChannelHostile(t *testing.T) {
	cfg := pdConfig(route.RolePrefill)
	cfg.KVBlocks = 256 // prompts of up to 4,096 tokens: asks of up to 257 ids
	src := start(t, cfg)
	kv := prefill(t, src, seq(1000, 3*16+1))
	var p struct {
		ID  string  `json:"remote_request_id"`
		IDs []int64 `json:"remote_block_ids"`
	}
	if err := json.Unmarshal(kv, &p); err != nil || len(p.IDs) != 3 {
		t.Fatalf("kv_transfer_params %s (%v), want 3 block ids", kv, err)
	}
	many := make([]int64, src.maxBlocks()+1)
	ids := func(v []int64) string { b, _ := json.Marshal(v); return string(b) }
	for _, c := range []struct {
		name, body string
		status     int
		msg        string
	}{
		{"oversize body", `{"request_id": "` + strings.Repeat("x", 64<<10) + `"}`, 413, "exceeds"},
		{"malformed JSON", `{"request_id": "a", "block_ids": [1,`, 400, "invalid JSON"},
		{"not an object", `[]`, 400, "invalid JSON"},
		{"ids not numbers", `{"request_id": "a", "block_ids": ["one"]}`, 400, "invalid JSON"},
		{"no request id", `{"block_ids": [1]}`, 400, "request_id"},
		{"long request id", fmt.Sprintf(`{"request_id": %q, "block_ids": [1]}`, strings.Repeat("x", 300)), 400, "request_id"},
		{"no ids", `{"request_id": "a", "block_ids": []}`, 400, "block_ids"},
		{"too many ids", fmt.Sprintf(`{"request_id": %q, "block_ids": %s}`, p.ID, ids(many)), 400, "block_ids"},
		{"negative id", fmt.Sprintf(`{"request_id": %q, "block_ids": [-1]}`, p.ID), 400, "block_ids[0]"},
		{"id out of range", fmt.Sprintf(`{"request_id": %q, "block_ids": [%d]}`, p.ID, int64(1)<<40), 400, "block_ids[0]"},
		{"unknown request", `{"request_id": "cmpl-nobody", "block_ids": [1]}`, 404, "no KV blocks held"},
		{"foreign ids", fmt.Sprintf(`{"request_id": %q, "block_ids": %s}`, p.ID, ids([]int64{p.IDs[1], p.IDs[0]})), 409, "not the blocks held"},
	} {
		code, body := post(t, src.URL()+TransferPath, c.body)
		if code != c.status {
			t.Errorf("%s: status %d, want %d (%s)", c.name, code, c.status, body)
			continue
		}
		if e := decodeError(t, body); !strings.Contains(e.Message, c.msg) || e.Code != c.status {
			t.Errorf("%s: error %+v, want code %d and a message with %q", c.name, e, c.status, c.msg)
		}
	}
	if got := heldBlocks(t, src); got != 4 {
		t.Fatalf("held blocks %v after the hostile asks, want 4", got)
	}
	code, body := post(t, src.URL()+TransferPath, fmt.Sprintf(`{"request_id": %q, "block_ids": %s}`, p.ID, ids(p.IDs)))
	var ans readAnswer
	if code != 200 || json.Unmarshal(body, &ans) != nil || len(ans.Hashes) != 3 || ans.RequestID != p.ID || ans.SentInNS <= 0 {
		t.Fatalf("proper read: %d %s, want 3 hashes", code, body)
	}
	if resp, err := http.Get(src.URL() + "/health"); err != nil || resp.StatusCode != 200 {
		t.Errorf("health after the hostile asks: %v %v", resp, err)
	}
}
