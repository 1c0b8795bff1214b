package proxy

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/emulator"
	"github.com/kvrouter/kvrouter/internal/wait"
)

// oaiError is an OpenAI error object as a client reads it.
type oaiError struct {
	Message, Type string
	Param, Code   any // nil: JSON null
}

// decodeError decodes body as exactly {"error":{"message","type","param",
// "code"}}: no other member, none missing, message and type non-empty
// strings, param null or a string, code null or a string.
func decodeError(t *testing.T, body string) oaiError {
	t.Helper()
	var top map[string]map[string]any
	if err := json.Unmarshal([]byte(body), &top); err != nil {
		t.Fatalf("error body %q: %v", body, err)
	}
	e, ok := top["error"]
	if len(top) != 1 || !ok {
		t.Fatalf("error body %q: want one member, \"error\"", body)
	}
	keys := make([]string, 0, len(e))
	for k := range e {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	if want := []string{"code", "message", "param", "type"}; !slices.Equal(keys, want) {
		t.Fatalf("error body %q: members %v, want %v", body, keys, want)
	}
	out := oaiError{Param: e["param"], Code: e["code"]}
	out.Message, _ = e["message"].(string)
	out.Type, _ = e["type"].(string)
	if out.Message == "" || out.Type == "" {
		t.Fatalf("error body %q: message and type must be non-empty strings", body)
	}
	for _, v := range []any{out.Param, out.Code} {
		if _, isString := v.(string); v != nil && !isString {
			t.Fatalf("error body %q: param and code must be a string or null", body)
		}
	}
	return out
}

// checkError asserts a response's status, JSON content type and error.
func checkError(t *testing.T, resp *http.Response, body string, status int, typ string, param, code any) oaiError {
	t.Helper()
	if resp.StatusCode != status {
		t.Fatalf("status %d (%s), want %d", resp.StatusCode, body, status)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Errorf("Content-Type %q, want application/json", ct)
	}
	e := decodeError(t, body)
	if e.Type != typ || e.Param != param || e.Code != code {
		t.Errorf("got type %q param %v code %v, want %q %v %v (%s)", e.Type, e.Param, e.Code, typ, param, code, body)
	}
	return e
}

// errorRouter is a router with its loops running in front of one emulated
// engine serving model "m", passing /tokenize through, its models known.
func errorRouter(t *testing.T, mod func(*Config)) (*Router, string) {
	t.Helper()
	e := replicas(t, 1, 0.01)[0]
	rt, url := startRouter(t, "kv-aware", func(c *Config) {
		c.PassThrough = []string{"/tokenize"}
		if mod != nil {
			mod(c)
		}
	}, e.URL())
	runRouter(t, rt)
	wait.For(t, "models listed", func() bool { return rt.View(time.Now()).Replicas[0].ModelsKnown })
	return rt, url
}

const chatPath = "/v1/chat/completions"

// TestErrorTruncatedJSON: a valid request cut at every byte is answered
// 400 invalid_json with param null, never a field's "wrong type".
func TestErrorTruncatedJSON(t *testing.T) {
	_, url := errorRouter(t, nil)
	full := `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":5,"stream":false}`
	for n := 1; n < len(full); n++ {
		resp, body := do(t, "POST", url+chatPath, full[:n])
		e := checkError(t, resp, body, 400, errInvalidRequest, nil, "invalid_json")
		if strings.Contains(e.Message, "wrong type") {
			t.Errorf("%q: message %q", full[:n], e.Message)
		}
	}
}

// TestErrorNegativeMaxTokens: max_tokens (or max_completion_tokens) -5 is
// a 400 naming the value out of range and the field, not invalid_json.
func TestErrorNegativeMaxTokens(t *testing.T) {
	_, url := errorRouter(t, nil)
	for _, field := range []string{"max_tokens", "max_completion_tokens"} {
		resp, body := do(t, "POST", url+chatPath, `{"model":"m","messages":[{"role":"user","content":"hi"}],"`+field+`":-5}`)
		e := checkError(t, resp, body, 400, errInvalidRequest, field, "integer_below_min_value")
		if !strings.Contains(e.Message, "-5") {
			t.Errorf("message %q does not say the value", e.Message)
		}
	}
}

// TestErrorInvalidType: a field of the wrong JSON type is a 400
// invalid_type naming the top-level field.
func TestErrorInvalidType(t *testing.T) {
	_, url := errorRouter(t, nil)
	for _, tc := range []struct{ path, body, param string }{
		{chatPath, `{"model":3,"messages":[]}`, "model"},
		{chatPath, `{"model":"m","messages":"hi"}`, "messages"},
		{chatPath, `{"model":"m","messages":[{"role":"user","content":7}]}`, "messages"},
		{chatPath, `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":"yes"}`, "stream"},
		{"/v1/completions", `{"model":"m","prompt":{"a":1}}`, "prompt"},
	} {
		resp, body := do(t, "POST", url+tc.path, tc.body)
		checkError(t, resp, body, 400, errInvalidRequest, tc.param, "invalid_type")
	}
}

// TestErrorMissingParameter: no model, no messages, no prompt: 400 with
// the missing field as param.
func TestErrorMissingParameter(t *testing.T) {
	_, url := errorRouter(t, nil)
	for _, tc := range []struct{ path, body, param, code string }{
		{chatPath, `{"messages":[{"role":"user","content":"hi"}]}`, "model", "missing_model"},
		{chatPath, `{"model":"m"}`, "messages", "missing_prompt"},
		{"/v1/completions", `{"model":"m"}`, "prompt", "missing_prompt"},
	} {
		resp, body := do(t, "POST", url+tc.path, tc.body)
		checkError(t, resp, body, 400, errInvalidRequest, tc.param, tc.code)
	}
}

// TestErrorModelNotFound: a completion for a model no replica lists is a
// 404 model_not_found with param "model".
func TestErrorModelNotFound(t *testing.T) {
	_, url := errorRouter(t, nil)
	resp, body := do(t, "POST", url+chatPath, `{"model":"nope","messages":[{"role":"user","content":"hi"}]}`)
	checkError(t, resp, body, 404, errInvalidRequest, "model", codeModelNotFound)
}

// TestErrorRouterURLAndMethod: the router's own 404 (a path neither served
// nor passed through) and 405 (with Allow) are OpenAI errors.
func TestErrorRouterURLAndMethod(t *testing.T) {
	_, url := errorRouter(t, nil)
	resp, body := do(t, "GET", url+"/v1/embeddings", "")
	checkError(t, resp, body, 404, errInvalidRequest, nil, codeUnknownURL)
	resp, body = do(t, "GET", url+chatPath, "")
	checkError(t, resp, body, 405, errInvalidRequest, nil, codeMethodNotAllowed)
	if got := resp.Header.Get("Allow"); got != "POST" {
		t.Errorf("Allow %q, want POST", got)
	}
}

// TestErrorPassThroughReshaped: the engine's own plain-text 404 and 405
// on a pass-through route reach the client as OpenAI errors, with the
// engine's status, message and Allow header.
func TestErrorPassThroughReshaped(t *testing.T) {
	_, url := errorRouter(t, nil)
	resp, body := do(t, "POST", url+"/tokenize/nothing-here", "{}")
	e := checkError(t, resp, body, 404, errInvalidRequest, nil, codeUnknownURL)
	if !strings.Contains(e.Message, "404 page not found") {
		t.Errorf("message %q lost the engine's", e.Message)
	}
	resp, body = do(t, "GET", url+"/tokenize", "")
	checkError(t, resp, body, 405, errInvalidRequest, nil, codeMethodNotAllowed)
	if got := resp.Header.Get("Allow"); got != "POST" {
		t.Errorf("Allow %q, want the engine's POST", got)
	}
	if got := resp.Header.Get("Content-Length"); got != fmt.Sprint(len(body)) {
		t.Errorf("Content-Length %s, body %d bytes", got, len(body))
	}
}

// kvFullRouter is a router (no retries) in front of one emulated engine
// of 64 KV blocks that answers 500 to a prompt whose blocks do not fit
// (Config.KVFullStatus, as llm-d-inference-sim does), with a stream held
// through the router on 40 of its blocks until the test ends. A
// completion of full500 then gets the engine's 500.
func kvFullRouter(t *testing.T) (rt *Router, url string) {
	t.Helper()
	e, err := emulator.Start(emulator.Config{Model: "m", Preset: "llama3-8b-h100", TimeScale: 3,
		KVBlocks: 64, KVFullStatus: 500}, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	rt, url = startRouter(t, "kv-aware", func(c *Config) { c.Retries = 0 }, e.URL())
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	req, _ := http.NewRequestWithContext(ctx, "POST", url+"/v1/completions",
		strings.NewReader(`{"model":"m","prompt":`+tokenIDs(10_000, 640)+`,"max_tokens":300,"stream":true}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	if _, err := resp.Body.Read(make([]byte, 1)); resp.StatusCode != 200 || err != nil {
		t.Fatalf("held stream: %d %v", resp.StatusCode, err)
	}
	return rt, url
}

// full500 is a completion whose 40 new blocks do not fit beside the held
// stream of kvFullRouter.
var full500 = `{"model":"m","prompt":` + tokenIDs(40_000, 640) + `,"max_tokens":1}`

// tokenIDs is the JSON array of the n token ids from first on.
func tokenIDs(first, n int) string {
	b := []byte{'['}
	for i := range n {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(first+i), 10)
	}
	return string(append(b, ']'))
}

// TestErrorUpstreamOpenAIKept: an engine's error that already is an
// OpenAI error object (the emulator's 500, vLLM's shape: its code is the
// status, a number) reaches the client byte for byte.
func TestErrorUpstreamOpenAIKept(t *testing.T) {
	_, url := kvFullRouter(t)
	resp, body := do(t, "POST", url+"/v1/completions", full500)
	if resp.StatusCode != 500 || !strings.Contains(body, `"code":500`) || !strings.Contains(body, "more blocks") {
		t.Fatalf("got %d %s, want the engine's 500 as it sent it", resp.StatusCode, body)
	}
	var e apiError
	if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error.Type != "InternalServerError" {
		t.Errorf("body %s: %v", body, err)
	}
}

// TestErrorModelsAgreeWithHealth: with every replica down, /health,
// /v1/models and /v1/models/{id} all answer 503 (Retry-After, OpenAI
// error); with one up, /v1/models/{id} answers the model object of a
// listed id and a 404 model_not_found for another.
func TestErrorModelsAgreeWithHealth(t *testing.T) {
	es := replicas(t, 1, 0.01)
	rt, url := startRouter(t, "kv-aware", func(c *Config) { c.HealthInterval = 20 * time.Millisecond }, es[0].URL())
	runRouter(t, rt)
	wait.For(t, "models listed", func() bool { return rt.View(time.Now()).Replicas[0].ModelsKnown })

	resp, body := do(t, "GET", url+"/v1/models/m", "")
	var card struct{ ID, Object string }
	if err := json.Unmarshal([]byte(body), &card); resp.StatusCode != 200 || err != nil || card.ID != "m" || card.Object != "model" {
		t.Fatalf("GET /v1/models/m: %d %s, want 200 and the model object", resp.StatusCode, body)
	}
	resp, body = do(t, "GET", url+"/v1/models/absent", "")
	checkError(t, resp, body, 404, errInvalidRequest, "model", codeModelNotFound)

	es[0].Close()
	wait.For(t, "replica unhealthy", func() bool {
		resp, _ := do(t, "GET", url+"/health", "")
		return resp.StatusCode == 503
	})
	for _, p := range []string{"/health", "/v1/models", "/v1/models/m"} {
		resp, body := do(t, "GET", url+p, "")
		checkError(t, resp, body, 503, errUnavailable, nil, codeNoHealthy)
		if resp.Header.Get("Retry-After") == "" {
			t.Errorf("%s: no Retry-After", p)
		}
	}
}

func TestUpstreamMessage(t *testing.T) {
	for _, tc := range []struct {
		raw          string
		status       int
		msg          string
		code         string
		openAIShaped bool
	}{
		{"404 page not found\n", 404, "upstream replica: 404 page not found", codeUnknownURL, false},
		{`{"detail":"Method Not Allowed"}`, 405, "upstream replica: Method Not Allowed", codeMethodNotAllowed, false},
		{`{"object":"error","message":"too long","type":"BadRequestError","param":null,"code":400}`, 400, "upstream replica: too long", "", false},
		{`{"error":{"message":"busy","code":"x"}}`, 503, "", "", true},
		{``, 502, "upstream replica: Bad Gateway", "", false},
		{`{"detail":[{"loc":["body"],"msg":"field required"}]}`, 422, "upstream replica: Unprocessable Entity", "", false},
	} {
		if got := openAIShaped([]byte(tc.raw)); got != tc.openAIShaped {
			t.Errorf("%q: openAIShaped %v, want %v", tc.raw, got, tc.openAIShaped)
		}
		if tc.openAIShaped {
			continue
		}
		msg, code := upstreamMessage([]byte(tc.raw), tc.status)
		if msg != tc.msg || code != tc.code {
			t.Errorf("%q: got %q %q, want %q %q", tc.raw, msg, code, tc.msg, tc.code)
		}
	}
}
