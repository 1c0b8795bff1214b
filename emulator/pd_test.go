package emulator

import (
	"bytes"
	"encoding/json"
	"maps"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvrouter/kvrouter/internal/wait"
	"github.com/kvrouter/kvrouter/route"
)

// pdConfig is a replica of a P/D pair: fast, with the given role.
func pdConfig(role route.Role) Config {
	return Config{Preset: "llama3-8b-h100", Model: "m", TimeScale: 0.02, KVRole: role}
}

// heldBlocks reads emulator_kv_held_blocks.
func heldBlocks(t *testing.T, s *Server) float64 {
	t.Helper()
	return metric(t, scrape(t, s.URL()), "emulator_kv_held_blocks")
}

// decodeLeg runs a non-streaming completions decode leg for prompt on dst
// with the params kv and returns its cached tokens.
func decodeLeg(t *testing.T, dst *Server, prompt, kv any) int {
	t.Helper()
	code, body := post(t, dst.URL()+"/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 2, "kv_transfer_params": kv})
	if code != 200 {
		t.Fatalf("decode leg: %d %s", code, body)
	}
	return decodeResponse(t, body).Usage.PromptTokensDetails.CachedTokens
}

// normalised are a stream's data payloads with the fields that differ
// between any two responses by nature, the id and the creation time,
// blanked.
func normalised(st streamed) []string {
	id := regexp.MustCompile(`"id":"[^"]*"`)
	created := regexp.MustCompile(`"created":[0-9]+`)
	out := make([]string, len(st.events))
	for i, ev := range st.events {
		out[i] = created.ReplaceAllString(id.ReplaceAllString(ev, `"id":""`), `"created":0`)
	}
	return out
}

// TestPDTwoLegs: the two legs of a disaggregated request, as vLLM's toy
// P/D proxy runs them, between a prefill-role and a decode-role emulator.
// The prefill leg's response is the plain response plus vLLM's
// kv_transfer_params at its top level, with their exact fields and types;
// the prefill worker holds the blocks until the streaming decode leg has
// read them; the decode leg reports the tokens read as cached, and its
// stream is the one a direct request to the decode worker gives.
func TestPDTwoLegs(t *testing.T) {
	src, dst := start(t, pdConfig(route.RolePrefill)), start(t, pdConfig(route.RoleDecode))
	prompt := words("pd", 200)
	n := len(Tokenize(RenderChat([]Message{{Role: "user", Content: prompt}}, true)))
	full := n / 16
	if n%16 == 0 || full < 10 {
		t.Fatalf("test design: a prompt of %d tokens, want a partial last block and at least 10 full ones", n)
	}
	client := map[string]any{"model": "m", "messages": []map[string]string{{"role": "user", "content": prompt}},
		"max_tokens": 8, "stream": true, "stream_options": map[string]any{"include_usage": true}}

	leg := maps.Clone(client)
	leg["stream"], leg["max_tokens"], leg["kv_transfer_params"] = false, 1, prefillParams()
	delete(leg, "stream_options")
	code, body := post(t, src.URL()+"/v1/chat/completions", leg)
	if code != 200 {
		t.Fatalf("prefill leg: %d %s", code, body)
	}
	var resp map[string]json.RawMessage
	if err := json.Unmarshal(body, &resp); err != nil {
		t.Fatal(err)
	}
	plain := maps.Clone(leg)
	delete(plain, "kv_transfer_params")
	_, plainBody := post(t, src.URL()+"/v1/chat/completions", plain)
	var plainResp map[string]json.RawMessage
	json.Unmarshal(plainBody, &plainResp)
	keys, want := slices.Sorted(maps.Keys(resp)), append(slices.Collect(maps.Keys(plainResp)), "kv_transfer_params")
	if slices.Sort(want); !slices.Equal(keys, want) {
		t.Errorf("prefill leg's fields %v, want a plain response's and kv_transfer_params: %v", keys, want)
	}
	for _, k := range []string{"choices", "object", "model"} {
		if string(resp[k]) != string(plainResp[k]) {
			t.Errorf("prefill leg's %s %s, want a plain response's %s", k, resp[k], plainResp[k])
		}
	}

	kv := resp["kv_transfer_params"]
	var fields map[string]any
	if err := json.Unmarshal(kv, &fields); err != nil {
		t.Fatalf("kv_transfer_params %s: %v", kv, err)
	}
	var id string
	json.Unmarshal(resp["id"], &id)
	u, _ := url.Parse(src.URL())
	port, _ := strconv.Atoi(u.Port())
	ids, _ := fields["remote_block_ids"].([]any)
	if len(ids) != full {
		t.Errorf("remote_block_ids %v, want the %d full prompt blocks' ids", fields["remote_block_ids"], full)
	}
	for i, v := range ids {
		if f, ok := v.(float64); !ok || f != float64(int32(f)) || f < 0 {
			t.Errorf("remote_block_ids[%d] = %v, want a block id", i, v)
		}
	}
	wantKV := map[string]any{
		"do_remote_prefill": true, "do_remote_decode": false, "remote_block_ids": ids,
		"remote_engine_id": src.EngineID(), "remote_request_id": id,
		"remote_host": "127.0.0.1", "remote_port": float64(port), "tp_size": float64(1),
	}
	if d := cmp.Diff(wantKV, fields); d != "" {
		t.Errorf("kv_transfer_params (-want +got):\n%s", d)
	}
	if got := heldBlocks(t, src); got != float64(full+1) {
		t.Errorf("held blocks %v, want %d (the full ones and the partial one)", got, full+1)
	}

	decode := maps.Clone(client)
	decode["kv_transfer_params"] = kv
	st := streamPost(t, dst.URL()+"/v1/chat/completions", decode)
	if u := streamUsage(t, st); u.PromptTokensDetails.CachedTokens != full*16 || u.PromptTokens != n {
		t.Errorf("decode leg's usage %+v, want %d prompt tokens, all %d full blocks cached", u, n, full)
	}
	wait.For(t, "the hold's release", func() bool { return heldBlocks(t, src) == 0 })
	if got := src.Stats().SentBlocks; got != int64(full) {
		t.Errorf("the prefill worker sent %d blocks, want %d", got, full)
	}
	if got := metric(t, scrape(t, src.URL()), "emulator_kv_hold_expired_total"); got != 0 {
		t.Errorf("expired holds %v, want 0", got)
	}
	if got := metric(t, scrape(t, dst.URL()), "vllm:external_prefix_cache_hits_total"); got != float64(full*16) {
		t.Errorf("decode worker's external hits %v, want %d", got, full*16)
	}

	// The decode worker now caches the prompt as it read it: a direct
	// request gives the same stream, usage included.
	direct := streamPost(t, dst.URL()+"/v1/chat/completions", client)
	if d := cmp.Diff(normalised(direct), normalised(st)); d != "" {
		t.Errorf("decode leg's stream differs from a direct request's (-direct +leg):\n%s", d)
	}
	if got := len(st.events); got != 1+8+1+1 {
		t.Errorf("%d events, want the role, 8 tokens, the usage and [DONE]", got)
	}
}

// TestPDHoldExpires: blocks nobody reads are held until --kv-hold-timeout
// (engine time), then freed and counted; a decode leg after that
// recomputes, counted as not_held and as a failed NIXL transfer.
func TestPDHoldExpires(t *testing.T) {
	cfg := pdConfig(route.RolePrefill)
	// 2 s of wall time: long enough that a loaded machine returns the
	// prefill leg and reads the held blocks before the hold expires.
	cfg.KVHoldTimeout = 100 * time.Second
	src, dst := start(t, cfg), start(t, pdConfig(route.RoleDecode))
	prompt := seq(1000, 6*16+3)
	kv := prefill(t, src, prompt)
	t0 := time.Now()
	if got := heldBlocks(t, src); got != 7 {
		t.Fatalf("held blocks %v, want 7", got)
	}
	if got := src.Stats().UsedBlocks; got != 7 {
		t.Errorf("%d blocks in use, want the 7 held", got)
	}
	wait.For(t, "the hold's expiry", func() bool { return heldBlocks(t, src) == 0 })
	if d := time.Since(t0); d < time.Second {
		t.Errorf("hold freed after %v, want about 2 s", d)
	}
	if got := metric(t, scrape(t, src.URL()), "emulator_kv_hold_expired_total"); got != 1 {
		t.Errorf("expired holds %v, want 1", got)
	}
	if got := src.Stats().UsedBlocks; got != 0 {
		t.Errorf("%d blocks in use after the expiry", got)
	}

	if got := decodeLeg(t, dst, prompt, kv); got != 0 {
		t.Errorf("cached_tokens %d after the expiry, want 0", got)
	}
	if got := transfers(t, dst, outcomeNotHeld); got != 1 {
		t.Errorf("not_held transfers %v, want 1", got)
	}
	if got := metric(t, scrape(t, dst.URL()), "vllm:nixl_num_failed_transfers_total"); got != 1 {
		t.Errorf("failed NIXL transfers %v, want 1", got)
	}
}

// TestPDShortPrompt: a prompt shorter than a block holds nothing and
// names no blocks; the decode leg computes the whole prompt without asking
// the prefill worker.
func TestPDShortPrompt(t *testing.T) {
	src, dst := start(t, pdConfig(route.RolePrefill)), start(t, pdConfig(route.RoleDecode))
	prompt := seq(1000, 10)
	kv := prefill(t, src, prompt)
	var p struct {
		IDs json.RawMessage `json:"remote_block_ids"`
	}
	if err := json.Unmarshal(kv, &p); err != nil || string(p.IDs) != "[]" {
		t.Errorf("remote_block_ids %s, want []", p.IDs)
	}
	if got := heldBlocks(t, src); got != 0 {
		t.Errorf("held blocks %v, want 0", got)
	}
	if got := decodeLeg(t, dst, prompt, kv); got != 0 {
		t.Errorf("cached_tokens %d, want 0", got)
	}
	for _, o := range []string{outcomeReceived, outcomePartial, outcomeNotHeld, outcomeMismatch, outcomeUnreachable, outcomeRefused, outcomeInvalid} {
		if got := transfers(t, dst, o); got != 0 {
			t.Errorf("%s transfers %v, want none", o, got)
		}
	}
}

// TestPDRoles: a decode-role engine serves a prefill leg as a plain
// request (no params, nothing held), a prefill-role engine a decode leg
// (it computes the prompt; the source keeps its hold); both count what
// they ignored. A prefill leg without max_tokens finishes with "stop" and
// holds nothing, as in vLLM.
func TestPDRoles(t *testing.T) {
	src, dec, both := start(t, pdConfig(route.RolePrefill)), start(t, pdConfig(route.RoleDecode)), start(t, pdConfig(route.RoleBoth))
	prompt := seq(1000, 4*16+3)

	code, body := post(t, dec.URL()+"/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 1, "kv_transfer_params": prefillParams()})
	if code != 200 || bytes.Contains(body, []byte(`"kv_transfer_params"`)) {
		t.Errorf("prefill leg on a decode engine: %d %s, want 200 without kv_transfer_params", code, body)
	}
	if got := heldBlocks(t, dec); got != 0 {
		t.Errorf("decode engine holds %v blocks", got)
	}
	if got := labeled(t, dec, "emulator_kv_params_ignored_total", "param", "do_remote_decode"); got != 1 {
		t.Errorf("decode engine ignored %v prefill legs, want 1", got)
	}

	kv := prefill(t, src, prompt)
	if got := decodeLeg(t, src, seq(5000, 4*16+3), kv); got != 0 {
		t.Errorf("decode leg on a prefill engine cached %d tokens, want a recompute", got)
	}
	if got := labeled(t, src, "emulator_kv_params_ignored_total", "param", "do_remote_prefill"); got != 1 {
		t.Errorf("prefill engine ignored %v decode legs, want 1", got)
	}
	if got := heldBlocks(t, src); got != 5 {
		t.Errorf("the prefill engine holds %v blocks, want its 5 still", got)
	}

	code, body = post(t, both.URL()+"/v1/completions", map[string]any{"prompt": prompt, "kv_transfer_params": prefillParams()})
	if code != 200 || bytes.Contains(body, []byte(`"kv_transfer_params"`)) || heldBlocks(t, both) != 0 {
		t.Errorf("prefill leg without max_tokens: %d %s, want no params and nothing held", code, body)
	}
	code, body = post(t, both.URL()+"/v1/completions", map[string]any{"prompt": seq(7000, 40), "max_tokens": 1, "kv_transfer_params": prefillParams()})
	if code != 200 || !bytes.Contains(body, []byte(`"kv_transfer_params"`)) || heldBlocks(t, both) != 3 {
		t.Errorf("prefill leg on a both engine: %d %s, want params and 3 blocks held", code, body)
	}
	if got := metric(t, scrape(t, both.URL()), "emulator_kv_transfer_config_info"); got != 1 {
		t.Errorf("config info %v", got)
	}
	if l := scrape(t, src.URL())["emulator_kv_transfer_config_info"].labels; l["kv_role"] != "prefill" || l["engine_id"] != src.EngineID() || l["kv_hold_timeout_seconds"] != "480" {
		t.Errorf("config info labels %v, want kv_role prefill, engine_id %s, kv_hold_timeout_seconds 480", l, src.EngineID())
	}
}
