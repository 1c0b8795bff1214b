package proxy

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/kvrouter/kvrouter/route"
)

// seen serves an emulated engine and keeps the path and Authorization
// header of every request that reached it.
type seen struct {
	h     http.Handler
	mu    sync.Mutex
	paths []string
	auth  []string
}

func (s *seen) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.paths = append(s.paths, r.URL.Path)
	s.auth = append(s.auth, r.Header.Get("Authorization"))
	s.mu.Unlock()
	s.h.ServeHTTP(w, r)
}

// all returns the paths that reached the engine.
func (s *seen) all() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.paths...)
}

// reached returns how many requests for path reached the engine.
func (s *seen) reached(path string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, p := range s.paths {
		if p == path {
			n++
		}
	}
	return n
}

// seenEngine starts an emulated engine behind a seen.
func seenEngine(t *testing.T) (*seen, string) {
	t.Helper()
	e := replicas(t, 1, 0.01)[0]
	s := &seen{h: e.Handler()}
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	return s, srv.URL
}

// surfaceRouter serves the router's two surfaces on a server each.
func surfaceRouter(t *testing.T, mod func(*Config), backends ...string) (rt *Router, api, admin string) {
	t.Helper()
	rt = newTestRouter(t, route.Default, mod, backends...)
	a, m := httptest.NewServer(rt.Handler()), httptest.NewServer(rt.AdminHandler())
	t.Cleanup(a.Close)
	t.Cleanup(m.Close)
	return rt, a.URL, m.URL
}

// keyFile writes keys (one file line each) to a temporary file.
func keyFile(t *testing.T, lines ...string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(p, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// wantError fails unless body is OpenAI's error object with code.
func wantError(t *testing.T, what, body, code string) {
	t.Helper()
	var e apiError
	if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error.Code != code || e.Error.Message == "" || e.Error.Type == "" {
		t.Errorf("%s: got body %q, want an OpenAI error with code %q", what, body, code)
	}
}

// TestSurfacesApart: the API serves neither the dashboard nor /debug nor
// /metrics (JSON 404s, nothing reaches a replica); the admin surface
// serves them, and its unknown paths are JSON 404s too.
func TestSurfacesApart(t *testing.T) {
	eng, url := seenEngine(t)
	_, api, admin := surfaceRouter(t, nil, url)
	for _, p := range []string{"/metrics", "/ui/", "/ui/api/fleet", "/debug/decisions"} {
		resp, body := do(t, "GET", api+p, "")
		if resp.StatusCode != 404 || resp.Header.Get("Content-Type") != "application/json" {
			t.Errorf("API GET %s: status %d %q, want a JSON 404", p, resp.StatusCode, resp.Header.Get("Content-Type"))
		}
		wantError(t, "API GET "+p, body, codeUnknownURL)
		if resp, _ := do(t, "GET", admin+p, ""); resp.StatusCode != 200 {
			t.Errorf("admin GET %s: status %d, want 200", p, resp.StatusCode)
		}
	}
	resp, body := do(t, "GET", admin+"/v1/chat/completions", "")
	if resp.StatusCode != 404 {
		t.Errorf("admin GET /v1/chat/completions: status %d, want 404", resp.StatusCode)
	}
	wantError(t, "admin unknown path", body, codeUnknownURL)
	if p := eng.all(); len(p) != 0 {
		t.Errorf("%d requests reached the engine (%v), want 0", len(p), p)
	}
}

// TestMethodNotAllowedJSON: a routed path under another method is a JSON
// 405 with Allow, counted; it does not reach a replica.
func TestMethodNotAllowedJSON(t *testing.T) {
	eng, url := seenEngine(t)
	_, api, admin := surfaceRouter(t, nil, url)
	for _, tc := range []struct{ method, path, allow string }{
		{"GET", "/v1/chat/completions", "POST"},
		{"PUT", "/v1/completions", "POST"},
		{"POST", "/v1/models", "GET, HEAD"},
		{"DELETE", "/readyz", "GET, HEAD"},
	} {
		resp, body := do(t, tc.method, api+tc.path, "")
		if resp.StatusCode != 405 || resp.Header.Get("Allow") != tc.allow {
			t.Errorf("%s %s: status %d, Allow %q; want 405, %q", tc.method, tc.path, resp.StatusCode, resp.Header.Get("Allow"), tc.allow)
		}
		wantError(t, tc.method+" "+tc.path, body, codeMethodNotAllowed)
	}
	if got := metricValue(t, admin, "kvrouter_errors_total", "code", codeMethodNotAllowed); got != 4 {
		t.Errorf("method_not_allowed counted %v, want 4", got)
	}
	if p := eng.all(); len(p) != 0 {
		t.Errorf("%d requests reached the engine (%v), want 0", len(p), p)
	}
}

// TestAPIKeys: without a key, or with a wrong one, the API answers an
// OpenAI-shaped 401 (counted) and nothing reaches a replica; with a key
// from the file it serves, and the key is not forwarded. Probes need no
// key.
func TestAPIKeys(t *testing.T) {
	eng, url := seenEngine(t)
	keys := keyFile(t, "# team keys", "", "sk-live-0123456789abcdef team-a", "  sk-live-fedcba9876543210  ")
	_, api, admin := surfaceRouter(t, func(c *Config) { c.APIKeys = keys }, url)
	body := `{"model":"m","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`
	for _, tc := range []struct {
		name, auth string
		want       int
	}{
		{"no key", "", 401},
		{"wrong key", "Bearer sk-live-0123456789abcdeX", 401},
		{"not bearer", "Basic c2stbGl2ZS0wMTIzNDU2Nzg5YWJjZGVmOg==", 401},
		{"key with a name", "Bearer sk-live-0123456789abcdef", 200},
		{"key alone, scheme in lower case", "bearer sk-live-fedcba9876543210", 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var hdr []string
			if tc.auth != "" {
				hdr = []string{"Authorization", tc.auth}
			}
			resp, out := do(t, "POST", api+"/v1/chat/completions", body, hdr...)
			if resp.StatusCode != tc.want {
				t.Fatalf("status %d (%s), want %d", resp.StatusCode, out, tc.want)
			}
			if tc.want == 401 {
				wantError(t, tc.name, out, codeInvalidKey)
				if !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Bearer") {
					t.Errorf("WWW-Authenticate %q, want Bearer", resp.Header.Get("WWW-Authenticate"))
				}
			}
		})
	}
	for _, p := range []string{"/health", "/livez", "/readyz"} {
		waitReadyz(t, api+p)
	}
	if got := metricValue(t, admin, "kvrouter_errors_total", "code", codeInvalidKey); got != 3 {
		t.Errorf("invalid_api_key counted %v, want 3", got)
	}
	if n := eng.reached("/v1/chat/completions"); n != 2 {
		t.Errorf("%d completions reached the engine, want 2 (the authenticated ones)", n)
	}
	eng.mu.Lock()
	defer eng.mu.Unlock()
	for _, a := range eng.auth {
		if a != "" {
			t.Errorf("the engine received Authorization %q, want none (the key is the router's)", a)
		}
	}
}

// waitReadyz fails unless url answers 200 without a key.
func waitReadyz(t *testing.T, url string) {
	t.Helper()
	if resp, body := do(t, "GET", url, ""); resp.StatusCode != 200 {
		t.Errorf("GET %s without a key: status %d (%s), want 200", url, resp.StatusCode, body)
	}
}

// TestAdminKeys: the admin surface asks for its own key, as a bearer
// token or a basic-auth password (browsers); API keys do not open it.
func TestAdminKeys(t *testing.T) {
	_, url := seenEngine(t)
	_, _, admin := surfaceRouter(t, func(c *Config) {
		c.APIKeys = keyFile(t, "sk-api-0123456789abcdef")
		c.AdminAPIKeys = keyFile(t, "adm-0123456789abcdef ops")
	}, url)
	for _, tc := range []struct {
		name string
		set  func(*http.Request)
		want int
	}{
		{"no key", func(*http.Request) {}, 401},
		{"api key", func(r *http.Request) { r.Header.Set("Authorization", "Bearer sk-api-0123456789abcdef") }, 401},
		{"bearer", func(r *http.Request) { r.Header.Set("Authorization", "Bearer adm-0123456789abcdef") }, 200},
		{"basic", func(r *http.Request) { r.SetBasicAuth("anyone", "adm-0123456789abcdef") }, 200},
	} {
		req, _ := http.NewRequest("GET", admin+"/metrics", nil)
		tc.set(req)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("%s: status %d, want %d", tc.name, resp.StatusCode, tc.want)
		}
		if tc.want == 401 && !strings.Contains(strings.Join(resp.Header.Values("WWW-Authenticate"), ";"), "Basic") {
			t.Errorf("%s: WWW-Authenticate %q, want a Basic challenge for browsers", tc.name, resp.Header.Values("WWW-Authenticate"))
		}
	}
	waitReadyz(t, admin+"/livez")
}

// TestPassThroughAllowList: only the listed paths reach a replica; the
// engines' admin paths, look-alikes and paths that hide a dot segment or a
// separator are JSON 404s, counted, and never reach it.
func TestPassThroughAllowList(t *testing.T) {
	eng, url := seenEngine(t)
	_, api, admin := surfaceRouter(t, nil, url)
	blocked := []string{"/sleep", "/wake_up", "/collective_rpc", "/reset_prefix_cache", "/v1/load_lora_adapter",
		"/v1/unload_lora_adapter", "/start_profile", "/tokenizex", "/tokenize%2F..%2Fsleep", "/metrics/x"}
	for _, p := range blocked {
		resp, body := do(t, "POST", api+p, "{}")
		if resp.StatusCode != 404 {
			t.Errorf("POST %s: status %d, want 404", p, resp.StatusCode)
		}
		wantError(t, "POST "+p, body, codeUnknownURL)
	}
	resp, _ := do(t, "POST", api+"/tokenize", `{"model":"m","prompt":"hello"}`)
	if resp.StatusCode != 200 || resp.Header.Get(HeaderReplica) != url {
		t.Errorf("POST /tokenize: status %d replica %q; want 200 from %s", resp.StatusCode, resp.Header.Get(HeaderReplica), url)
	}
	if got := metricValue(t, admin, "kvrouter_errors_total", "code", codeUnknownURL); got != float64(len(blocked)) {
		t.Errorf("unknown_url counted %v, want %d", got, len(blocked))
	}
	for _, p := range eng.all() {
		if p != "/tokenize" {
			t.Errorf("%s reached the engine, want only /tokenize", p)
		}
	}
}

// TestPassList: the matching rule, path by path.
func TestPassList(t *testing.T) {
	l := newPassList([]string{"/tokenize", "/v1/audio/", "/v1/models"})
	for _, tc := range []struct {
		url  string
		want bool
	}{
		{"/tokenize", true},
		{"/tokenize/x", true},
		{"/tokenizer", false},
		{"/v1/audio/transcriptions", true},
		{"/v1/audio", false},
		{"/v1/models/m", true},
		{"/tokenize/../sleep", false},
		{"/tokenize/%2e%2e/sleep", false},
		{"/tokenize%2F..%2Fsleep", false},
		{"/tokenize//x", false},
		{"/tokenize%2Fx", false},
		{"/tokenize/%252e%252e/sleep", false},
		{"/tokenize/a%20b", true},
		{"/sleep", false},
	} {
		r := httptest.NewRequest("POST", tc.url, nil)
		if got := l.allows(r); got != tc.want {
			t.Errorf("%s: got %v, want %v", tc.url, got, tc.want)
		}
	}
	if !newPassList([]string{"/"}).allows(httptest.NewRequest("POST", "/sleep", nil)) {
		t.Error(`"/" must pass every path`)
	}
	if newPassList(nil).allows(httptest.NewRequest("POST", "/tokenize", nil)) {
		t.Error("an empty list must pass nothing")
	}
	// The default passes a stored response's paths, not the routed
	// POST /v1/responses itself.
	def := newPassList(DefaultConfig().PassThrough)
	for url, want := range map[string]bool{"/v1/responses/resp_1": true, "/v1/responses/resp_1/input_items": true, "/v1/responses": false} {
		if got := def.allows(httptest.NewRequest("GET", url, nil)); got != want {
			t.Errorf("default list, %s: got %v, want %v", url, got, want)
		}
	}
}

// TestDecisionIDsHashed: decision records show a keyed hash of a
// session id and of the OpenAI user value, never the value itself,
// unless DebugShowIDs.
func TestDecisionIDsHashed(t *testing.T) {
	_, url := seenEngine(t)
	const user, session = "alice@example.com", "sess-bob@example.com"
	body := `{"model":"m","max_tokens":2,"user":"` + user + `","messages":[{"role":"user","content":"hi"}]}`
	for _, show := range []bool{false, true} {
		rt, api, admin := surfaceRouter(t, func(c *Config) { c.DebugShowIDs = show }, url)
		do(t, "POST", api+"/v1/chat/completions", body)
		do(t, "POST", api+"/v1/chat/completions", body, "X-Session-ID", session)
		_, dec := do(t, "GET", admin+"/debug/decisions", "")
		_, ui := do(t, "GET", admin+"/ui/api/decisions", "")
		for _, v := range []string{user, session} {
			for what, out := range map[string]string{"/debug/decisions": dec, "/ui/api/decisions": ui} {
				if strings.Contains(out, v) != show {
					t.Errorf("show %v: %s has %q: %v, want %v", show, what, v, strings.Contains(out, v), show)
				}
			}
		}
		recs := rt.Decisions(2)
		if len(recs) != 2 {
			t.Fatalf("%d records, want 2", len(recs))
		}
		want := []string{shownID(rt.sf.idKey, session), shownID(rt.sf.idKey, user)}
		for i, rec := range recs {
			if rec.Session != want[i] {
				t.Errorf("show %v: record %d session %q, want %q", show, i, rec.Session, want[i])
			}
		}
	}
}

// TestReadKeys: the key file's format and limits.
func TestReadKeys(t *testing.T) {
	for _, tc := range []struct {
		name  string
		lines []string
		n     int // keys; -1: an error
	}{
		{"keys, names, comments", []string{"# c", "k1", "", "k2 name", "\tk3  "}, 3},
		{"no keys", []string{"# only a comment"}, -1},
		{"three fields", []string{"k1 name extra"}, -1},
		{"priorities", []string{"k1 batch priority=-1", "k2 priority=5"}, 2},
		{"bad priority", []string{"k1 name priority=high"}, -1},
		{"priority out of range", []string{"k1 priority=2000"}, -1},
	} {
		k, err := ReadKeys(keyFile(t, tc.lines...))
		switch {
		case tc.n < 0 && err == nil:
			t.Errorf("%s: got %d keys, want an error", tc.name, k.Len())
		case tc.n >= 0 && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.n >= 0 && k.Len() != tc.n:
			t.Errorf("%s: got %d keys, want %d", tc.name, k.Len(), tc.n)
		}
	}
	k, _ := ReadKeys(keyFile(t, "k1", "k2 ops priority=-1"))
	name := func(key string) string {
		if i := k.match(key); i >= 0 {
			return fmt.Sprintf("%s/%d", k.names[i], k.prios[i])
		}
		return ""
	}
	if name("k2") != "ops/-1" || name("k1") != "key-1/0" || name("k3") != "" || name("") != "" {
		t.Errorf("match: k2 %q, k1 %q, k3 %q; want ops/-1, key-1/0, none", name("k2"), name("k1"), name("k3"))
	}
	if _, err := ReadKeys(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("a missing file: got no error")
	}
}

// TestNoServeMuxPlainText: the requests http.ServeMux would answer in
// plain text or HTML (a redirect of a path not in its clean form, "404
// page not found" to CONNECT) get the router's JSON errors, counted, on
// both surfaces; nothing reaches a replica.
func TestNoServeMuxPlainText(t *testing.T) {
	eng, url := seenEngine(t)
	_, api, admin := surfaceRouter(t, nil, url)
	for _, tc := range []struct {
		raw, code string
		status    int
	}{
		{"POST //v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}", codeUnknownURL, 404},
		{"GET /v1/../health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", codeUnknownURL, 404},
		{"GET /v1/./models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", codeUnknownURL, 404},
		{"CONNECT x:1 HTTP/1.1\r\nHost: x:1\r\nConnection: close\r\n\r\n", codeMethodNotAllowed, 405},
	} {
		for _, base := range []string{api, admin} {
			c, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
			if err != nil {
				t.Fatal(err)
			}
			io.WriteString(c, tc.raw)
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatalf("%.30q: %v", tc.raw, err)
			}
			body, _ := io.ReadAll(resp.Body)
			c.Close()
			if resp.StatusCode != tc.status || resp.Header.Get("Content-Type") != "application/json" {
				t.Errorf("%s %.30q: %d %q %s; want a JSON %d", base, tc.raw, resp.StatusCode, resp.Header.Get("Content-Type"), body, tc.status)
			}
			wantError(t, fmt.Sprintf("%.30q", tc.raw), string(body), tc.code)
		}
	}
	if got := metricValue(t, admin, "kvrouter_errors_total", "code", codeUnknownURL); got != 3 {
		t.Errorf("unknown_url counted %v on the API, want 3", got)
	}
	if got := metricValue(t, admin, "kvrouter_admin_errors_total", "code", codeUnknownURL); got != 3 {
		t.Errorf("unknown_url counted %v on the admin surface, want 3", got)
	}
	if p := eng.all(); len(p) != 0 {
		t.Errorf("%d requests reached the engine (%v), want 0", len(p), p)
	}
}
