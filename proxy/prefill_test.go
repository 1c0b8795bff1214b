package proxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kvrouter/kvrouter/view"
)

// fixtureWorker serves testdata/nixl_prefill_answer.json, a vLLM
// prefill worker's answer (see testdata/README.md), to every completion
// and records what it received.
type fixtureWorker struct {
	answer []byte
	mu     sync.Mutex
	bodies [][]byte
	hdrs   []http.Header
}

// nixlAnswer is testdata/nixl_prefill_answer.json with its remote_host
// the loopback address the router reaches the test's worker at: the
// router forwards params that name only the worker that ran the leg.
func nixlAnswer(t *testing.T) []byte {
	t.Helper()
	answer, err := os.ReadFile("testdata/nixl_prefill_answer.json")
	if err != nil {
		t.Fatal(err)
	}
	return bytes.ReplaceAll(answer, []byte(`"remote_host": "10.0.3.17"`), []byte(`"remote_host": "127.0.0.1"`))
}

func (f *fixtureWorker) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		return // probes: 200
	}
	b, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	f.bodies, f.hdrs = append(f.bodies, b), append(f.hdrs, r.Header.Clone())
	f.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.Write(f.answer)
}

// TestPrefillLegAgainstVLLMAnswer: against the answer of a real vLLM
// prefill worker, the router sends the prefill leg vLLM's proxy sends
// (its body fields exactly, X-Request-Id the request id, the client's
// Authorization and, the router not tracing, its traceparent), and the decode leg is the client's body with the
// worker's kv_transfer_params verbatim; the transfer shows in the
// header, the record, the access log's fields and the metrics, and every
// ticket is released.
func TestPrefillLegAgainstVLLMAnswer(t *testing.T) {
	answer := nixlAnswer(t)
	var fx struct {
		Params json.RawMessage `json:"kv_transfer_params"`
	}
	if err := json.Unmarshal(answer, &fx); err != nil {
		t.Fatal(err)
	}
	pw := &fixtureWorker{answer: answer}
	p := httptest.NewServer(pw)
	t.Cleanup(p.Close)
	d := newTap(t, startEmulator(t))
	d.strip = true // the fixture's blocks are nowhere: the engine computes the prompt
	rt, url := pdRouter(t, nil, nil, prefillWorker(p.URL), decodeWorker(d.URL()))

	const parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	resp, out := do(t, "POST", url+"/v1/chat/completions", pdChat(), "Authorization", "Bearer sk-client", "Traceparent", parent)
	if resp.StatusCode != 200 || !strings.HasSuffix(strings.TrimSpace(out), "data: [DONE]") {
		t.Fatalf("status %d: %s", resp.StatusCode, out)
	}
	rec := settledRecord(t, rt)

	if len(pw.bodies) != 1 {
		t.Fatalf("the prefill worker got %d requests, want 1", len(pw.bodies))
	}
	var leg map[string]any
	if err := json.Unmarshal(pw.bodies[0], &leg); err != nil {
		t.Fatal(err)
	}
	var client map[string]any
	json.Unmarshal([]byte(pdChat()), &client)
	want := map[string]any{
		"model": "m", "messages": client["messages"], "stream": false, "max_tokens": 1.0, "max_completion_tokens": 1.0,
		"kv_transfer_params": map[string]any{"do_remote_decode": true, "do_remote_prefill": false,
			"remote_engine_id": nil, "remote_block_ids": nil, "remote_host": nil, "remote_port": nil},
	}
	if diff := cmp.Diff(want, leg); diff != "" {
		t.Errorf("prefill-leg body (-want +got):\n%s", diff)
	}
	if h := pw.hdrs[0]; h.Get("X-Request-Id") != rec.ID || h.Get("Authorization") != "Bearer sk-client" || h.Get("Content-Type") != "application/json" || h.Get("Traceparent") != parent {
		t.Errorf("prefill-leg headers: X-Request-Id %q (want %q), Authorization %q, Content-Type %q, Traceparent %q (want the client's)",
			h.Get("X-Request-Id"), rec.ID, h.Get("Authorization"), h.Get("Content-Type"), h.Get("Traceparent"))
	}

	got := d.received(t)
	if len(got) != 1 {
		t.Fatalf("the decode worker got %d requests, want 1", len(got))
	}
	if !bytes.Contains(d.raw(0), append([]byte(`"kv_transfer_params":`), fx.Params...)) {
		t.Errorf("the decode leg does not carry the worker's params verbatim:\n%s\nwant %s", d.raw(0), fx.Params)
	}
	for k, v := range map[string]string{"stream": "true", "max_tokens": "6", "max_completion_tokens": "6", "min_tokens": "2", "stream_options": `{"include_usage":true}`} {
		if string(got[0][k]) != v {
			t.Errorf("decode leg %s = %s, want the client's %s", k, got[0][k], v)
		}
	}

	const tokens = 421 // remote_block_ids × the default block size (432), within the prompt's 421 tokens
	if h := resp.Header.Get(HeaderDecision); !strings.Contains(h, "; transfer=from "+p.URL+" 2.000ms") {
		t.Errorf("%s %q lacks the transfer", HeaderDecision, h)
	}
	if rec.Transfer != "from "+p.URL || rec.TransferTokens != tokens || rec.PrefillReplica != p.URL || rec.PrefillOutcome != legOK || rec.PrefillLegs != 1 || rec.PrefillMS <= 0 {
		t.Errorf("record: transfer %q %d tokens, prefill %q %q %d legs %.3f ms; want from %s, %d, ok, 1 leg",
			rec.Transfer, rec.TransferTokens, rec.PrefillReplica, rec.PrefillOutcome, rec.PrefillLegs, rec.PrefillMS, p.URL, tokens)
	}
	for _, m := range []struct {
		name   string
		labels []string
		want   float64
	}{
		// The fixture's blocks are nowhere: the decode worker's usage shows
		// nothing read, and the transfer is not counted as run.
		{"kvrouter_kv_transfers_total", []string{"from", p.URL, "to", d.URL()}, 0},
		{"kvrouter_kv_transfers_unread_total", []string{"why", unreadNotRead}, 1},
		{"kvrouter_kv_transfer_legs_total", []string{"leg", legPrefill, "outcome", legOK}, 1},
		{"kvrouter_kv_transfer_legs_total", []string{"leg", legDecode, "outcome", view.OutcomeOK}, 1},
	} {
		if got := metricValue(t, url, m.name, m.labels...); got != m.want {
			t.Errorf("%s%v = %v, want %v", m.name, m.labels, got, m.want)
		}
	}
	wantIdle(t, rt)
}

// TestParamsOf: a prefill leg's answer is usable when its top-level
// kv_transfer_params is an object with members, taken verbatim.
func TestParamsOf(t *testing.T) {
	for _, tc := range []struct {
		answer, params string
		prompt         int
	}{
		{`{"kv_transfer_params": {"remote_block_ids": [1, 2]}, "usage": {"prompt_tokens": 20}}`, `{"remote_block_ids": [1, 2]}`, 20},
		{`{"choices": [], "kv_transfer_params": {"do_remote_prefill":true}}`, `{"do_remote_prefill":true}`, 0},
		{`{"kv_transfer_params": {}}`, "", 0},
		{`{"kv_transfer_params": { }}`, "", 0},
		{`{"kv_transfer_params": null}`, "", 0},
		{`{"kv_transfer_params": [1]}`, "", 0},
		{`{"choices": []}`, "", 0},
		{`data: {"kv_transfer_params": {"a": 1}}`, "", 0},
	} {
		p, prompt, err := paramsOf([]byte(tc.answer))
		if tc.params == "" {
			if !errors.Is(err, errNoParams) {
				t.Errorf("%s: got %s, %v; want errNoParams", tc.answer, p, err)
			}
			continue
		}
		if err != nil || string(p) != tc.params || prompt != tc.prompt {
			t.Errorf("%s: got %s %d, %v; want %s %d", tc.answer, p, prompt, err, tc.params, tc.prompt)
		}
	}
}

// TestOneTokenBody: the body of a one-token leg leaves every other field
// as the client sent it, sets max_completion_tokens only when present, and
// refuses a body with its own kv_transfer_params.
func TestOneTokenBody(t *testing.T) {
	got, err := oneToken([]byte(`{"model":"m","prompt":"a <b> & c","stream":true,"max_tokens":9,"temperature":0.5}`), nullParams)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"kv_transfer_params":` + string(nullParams) + `,"max_tokens":1,"model":"m","prompt":"a <b> & c","stream":false,"temperature":0.5}`
	if string(got) != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
	if _, err := oneToken([]byte(`{"model":"m","kv_transfer_params":{}}`), nullParams); !errors.Is(err, errOwnParams) {
		t.Errorf("a body with its own params: %v, want errOwnParams", err)
	}
}
