package proxy

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/emulator"
	"github.com/kvrouter/kvrouter/internal/wait"
	"github.com/kvrouter/kvrouter/route"
	"github.com/kvrouter/kvrouter/view"
)

// listBackends returns GET /admin/v1/backends by URL.
func listBackends(t *testing.T, admin string, hdr ...string) map[string]BackendState {
	t.Helper()
	resp, body := do(t, "GET", admin+pathBackends, "", hdr...)
	if resp.StatusCode != 200 {
		t.Fatalf("GET backends: %d %s", resp.StatusCode, body)
	}
	var out struct{ Backends []BackendState }
	if err := json.Unmarshal([]byte(body), &out); err != nil {
		t.Fatal(err)
	}
	m := map[string]BackendState{}
	for _, b := range out.Backends {
		m[b.URL] = b
	}
	return m
}

// openStream starts a streamed chat completion of n tokens and returns
// the replica serving it and a function that reads the rest and reports
// whether it ended with [DONE].
func openStream(t *testing.T, url string, n int) (replica string, finish func() bool) {
	t.Helper()
	body := fmt.Sprintf(`{"model":"m","stream":true,"max_tokens":%d,"messages":[{"role":"user","content":"%s"}]}`, n, words(n, 30))
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		t.Fatalf("stream: status %d", resp.StatusCode)
	}
	br := bufio.NewReader(resp.Body)
	if _, err := br.ReadString('\n'); err != nil { // the first event: the request is in flight
		t.Fatal(err)
	}
	return resp.Header.Get(HeaderReplica), func() bool {
		defer resp.Body.Close()
		done := false
		for {
			line, err := br.ReadString('\n')
			if strings.HasPrefix(line, "data: [DONE]") {
				done = true
			}
			if err != nil {
				return done
			}
		}
	}
}

// streamOn opens streams of 150 tokens until one is served by replica,
// reading the others to their end, and returns that one's finish (as
// openStream's).
func streamOn(t *testing.T, url, replica string) (finish func() bool) {
	t.Helper()
	for {
		rep, finish := openStream(t, url, 150)
		if rep == replica {
			return finish
		}
		finish()
	}
}

// spread sends n short requests and counts them per replica.
func spread(t *testing.T, url string, n int) map[string]int {
	t.Helper()
	out := map[string]int{}
	for i := range n {
		body := fmt.Sprintf(`{"model":"m","max_tokens":2,"messages":[{"role":"user","content":"q%d"}]}`, i)
		resp, b := do(t, "POST", url+"/v1/chat/completions", body)
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, b)
		}
		out[resp.Header.Get(HeaderReplica)]++
	}
	return out
}

func TestAdminBackendsLifecycle(t *testing.T) {
	reps := replicas(t, 2, 1)
	a, b := reps[0].URL(), reps[1].URL()
	rt, url, admin := serveLimited(t, nil, a)
	runRouter(t, rt)

	if got := listBackends(t, admin); len(got) != 1 || got[a].State != "serving" || !got[a].Healthy {
		t.Fatalf("at start: %+v, want a alone, serving and healthy", got)
	}
	resp, body := do(t, "POST", admin+pathBackends, fmt.Sprintf(`{"url": %q, "models": ["m"]}`, b))
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("add: %d %s", resp.StatusCode, body)
	}
	if got := spread(t, url, 10); got[a] != 5 || got[b] != 5 {
		t.Errorf("round robin over a and b after the add: %v, want 5 each", got)
	}

	// Drain b with a stream in flight on it: no new request reaches b,
	// the stream finishes.
	onB := streamOn(t, url, b)
	if resp, body := do(t, "POST", admin+pathDrain, fmt.Sprintf(`{"url": %q}`, b)); resp.StatusCode != 200 || !strings.Contains(body, `"draining"`) {
		t.Fatalf("drain: %d %s", resp.StatusCode, body)
	}
	if got := listBackends(t, admin)[b]; got.State != "draining" || got.InFlight != 1 {
		t.Errorf("b after drain: %+v, want draining with 1 in flight", got)
	}
	if got := spread(t, url, 6); got[b] != 0 {
		t.Errorf("requests reached the draining replica: %v", got)
	}
	// Remove b while its stream still runs: 202, listed removed, the
	// stream is not cut.
	resp, body = do(t, "DELETE", admin+pathBackends, fmt.Sprintf(`{"url": %q}`, b))
	if resp.StatusCode != http.StatusAccepted || !strings.Contains(body, `"in_flight":1`) {
		t.Errorf("remove with a stream in flight: %d %s, want 202 and in_flight 1", resp.StatusCode, body)
	}
	if got := listBackends(t, admin)[b]; got.State != "removed" {
		t.Errorf("b after remove: %+v, want removed while its stream runs", got)
	}
	if !onB() {
		t.Error("the stream on the removed replica did not end with [DONE]")
	}
	if got := listBackends(t, admin); len(got) != 1 {
		t.Errorf("after b's stream ended: %v, want a alone", got)
	}
	if got := spread(t, url, 4); got[a] != 4 {
		t.Errorf("after the removal: %v, want all on a", got)
	}
	// Back again, into its old slot.
	if resp, body := do(t, "POST", admin+pathBackends, fmt.Sprintf(`{"url": %q}`, b)); resp.StatusCode != 201 || !strings.Contains(body, `"slot":1`) {
		t.Errorf("re-add: %d %s, want 201 in slot 1", resp.StatusCode, body)
	}
	for _, c := range []struct {
		op, source string
		want       float64
	}{{"add", "admin", 2}, {"drain", "admin", 1}, {"remove", "admin", 1}} {
		if got := metricValue(t, admin, "kvrouter_backend_changes_total", "op", c.op, "source", c.source, "result", "ok"); got != c.want {
			t.Errorf("changes{op=%s}: got %v, want %v", c.op, got, c.want)
		}
	}
}

// TestParseBackendRole: role= reads prefill, decode and both, String
// writes it back (leaving out the default), and an unknown role is an
// error that lists the known ones.
func TestParseBackendRole(t *testing.T) {
	for _, tc := range []struct {
		in, out string
		role    route.Role
	}{
		{"http://p:8000,role=prefill", "http://p:8000,role=prefill", route.RolePrefill},
		{"http://d:8000,model=m,role=decode", "http://d:8000,model=m,role=decode", route.RoleDecode},
		{"http://b:8000,role=both", "http://b:8000", route.RoleBoth},
		{"http://b:8000", "http://b:8000", route.RoleBoth},
	} {
		b, err := ParseBackend(tc.in)
		if err != nil || b.Role != tc.role || b.String() != tc.out {
			t.Errorf("%s: got %v %q, %v; want %v %q", tc.in, b.Role, b.String(), err, tc.role, tc.out)
		}
	}
	_, err := ParseBackend("http://p:8000,role=prefil")
	if want := `backend "http://p:8000,role=prefil": unknown role "prefil" (known: prefill, decode, both)`; err == nil || err.Error() != want {
		t.Errorf("unknown role: got %v, want %s", err, want)
	}
}

// TestAdminBackendRole: a backend added with a role is listed with it
// and reaches the fleet: a prefill worker gets no request of its own.
func TestAdminBackendRole(t *testing.T) {
	reps := replicas(t, 2, 0.01)
	a, p := reps[0].URL(), reps[1].URL()
	rt, url, admin := serveLimited(t, func(c *Config) { c.KVTransfer = true }, a)
	if resp, body := do(t, "POST", admin+pathBackends, fmt.Sprintf(`{"url": %q, "role": "prefill"}`, p)); resp.StatusCode != http.StatusCreated || !strings.Contains(body, `"role":"prefill"`) {
		t.Fatalf("add a prefill worker: %d %s", resp.StatusCode, body)
	}
	if got := listBackends(t, admin); got[a].Role != "both" || got[p].Role != "prefill" {
		t.Errorf("roles listed: %s %q, %s %q; want both, prefill", a, got[a].Role, p, got[p].Role)
	}
	if got := spread(t, url, 6); got[p] != 0 || got[a] != 6 {
		t.Errorf("requests reached the prefill worker: %v", got)
	}
	if got := rt.st.bes.at(rt.st.fleet.At(p)).cfg.Role; got != route.RolePrefill {
		t.Errorf("the backend's role: %v, want prefill", got)
	}
}

func TestAdminBackendsBadInput(t *testing.T) {
	reps := replicas(t, 1, 0.01)
	a := reps[0].URL()
	_, _, admin := serveLimited(t, nil, a)
	big := `{"url": "http://x:1", "models": ["` + strings.Repeat("m", maxAdminBody) + `"]}`
	tests := []struct {
		name, method, path, body string
		status                   int
		code                     string
	}{
		{"not json", "POST", pathBackends, `{url:`, 400, codeBadBody},
		{"unknown field", "POST", pathBackends, `{"url": "http://h:1", "weight": 3}`, 400, codeBadBody},
		{"two objects", "POST", pathBackends, `{"url": "http://h:1"} {}`, 400, codeBadBody},
		{"no url", "POST", pathBackends, `{"models": ["m"]}`, 400, codeBadBody},
		{"bad scheme", "POST", pathBackends, `{"url": "ftp://h:1"}`, 400, codeBadBody},
		{"bad kv", "POST", pathBackends, `{"url": "http://h:1", "kv": "h:5557"}`, 400, codeBadBody},
		{"empty model", "POST", pathBackends, `{"url": "http://h:1", "models": [""]}`, 400, codeBadBody},
		{"unknown role", "POST", pathBackends, `{"url": "http://h:1", "role": "prefil"}`, 400, codeBadBody},
		{"drain with role", "POST", pathDrain, fmt.Sprintf(`{"url": %q, "role": "decode"}`, a), 400, codeBadBody},
		{"too big", "POST", pathBackends, big, 400, codeBadBody},
		{"duplicate", "POST", pathBackends, fmt.Sprintf(`{"url": %q}`, a), 409, codeBackendExists},
		{"drain unknown", "POST", pathDrain, `{"url": "http://h:1"}`, 404, codeNoBackend},
		{"drain with models", "POST", pathDrain, fmt.Sprintf(`{"url": %q, "models": ["m"]}`, a), 400, codeBadBody},
		{"remove unknown", "DELETE", pathBackends, `{"url": "http://h:1"}`, 404, codeNoBackend},
		{"wrong method", "PUT", pathBackends, `{}`, 405, codeMethodNotAllowed},
		{"get drain", "GET", pathDrain, ``, 405, codeMethodNotAllowed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, body := do(t, tt.method, admin+tt.path, tt.body)
			if resp.StatusCode != tt.status || errorCode(body) != tt.code {
				t.Errorf("got %d %s, want %d %s", resp.StatusCode, body, tt.status, tt.code)
			}
		})
	}
	if got := metricValue(t, admin, "kvrouter_admin_errors_total", "code", codeBadBody); got != 11 {
		t.Errorf("admin errors{code=invalid_body}: got %v, want 11", got)
	}
	if got := listBackends(t, admin); len(got) != 1 {
		t.Errorf("bad requests changed the fleet: %v", got)
	}
}

func TestAdminBackendsNeedKey(t *testing.T) {
	reps := replicas(t, 1, 0.01)
	_, _, admin := serveLimited(t, func(c *Config) { c.AdminAPIKeys = keyFile(t, "adm-0123456789abcdef ops") }, reps[0].URL())
	if resp, _ := do(t, "POST", admin+pathBackends, `{"url": "http://h:1"}`); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("add without a key: %d, want 401", resp.StatusCode)
	}
	if got := listBackends(t, admin, "Authorization", "Bearer adm-0123456789abcdef"); len(got) != 1 {
		t.Errorf("with the key: %v, want one backend", got)
	}
}

// TestAddRemoveLeaksNoGoroutine adds and removes backends many times: the
// scrape and probe loops of each stop with it.
func TestAddRemoveLeaksNoGoroutine(t *testing.T) {
	reps := replicas(t, 3, 0.01)
	rt := newTestRouter(t, "round-robin", nil, reps[0].URL())
	runRouter(t, rt)
	// Idle keep-alive connections (two goroutines each, client side, and
	// one on the emulator) are closed before each count: they are the
	// transport's, not the loops'.
	idle := rt.upstream.(*http.Transport).CloseIdleConnections
	// The baseline is taken once the first loops settled and the idle
	// connections' goroutines ended; no counter says when, so these are
	// quiet periods.
	time.Sleep(200 * time.Millisecond)
	idle()
	time.Sleep(50 * time.Millisecond) // and a quiet period for the closed connections' goroutines
	before := runtime.NumGoroutine()
	for range 20 {
		for _, s := range reps[1:] {
			if err := rt.AddBackend(Backend{URL: s.URL()}, SourceAdmin); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(5 * time.Millisecond) // the loops run before their removal: running loops must stop
		for _, s := range reps[1:] {
			if _, err := rt.RemoveBackend(s.URL(), SourceAdmin); err != nil {
				t.Fatal(err)
			}
		}
	}
	wait.For(t, fmt.Sprintf("the goroutines back to the %d before 20 add/remove rounds", before), func() bool {
		idle()
		return runtime.NumGoroutine() <= before
	})
}

// TestSetBackendsBySource applies lists from the config and from
// discovery: each changes its own backends, and leaves the admin API's.
func TestSetBackendsBySource(t *testing.T) {
	reps := replicas(t, 4, 0.01)
	a, b, c, d := reps[0].URL(), reps[1].URL(), reps[2].URL(), reps[3].URL()
	rt := newTestRouter(t, "round-robin", nil, a)
	runRouter(t, rt)
	if err := rt.AddBackend(Backend{URL: b}, SourceAdmin); err != nil {
		t.Fatal(err)
	}
	state := func() string {
		var s []string
		for _, x := range rt.Backends() {
			s = append(s, fmt.Sprintf("%d:%s", x.Slot, strings.TrimPrefix(x.URL, "http://")))
		}
		return strings.Join(s, " ")
	}
	steps := []struct {
		source string
		want   []Backend
		after  []string
	}{
		{SourceConfig, []Backend{{URL: a}, {URL: c}}, []string{a, b, c}},
		{SourceDiscover, []Backend{{URL: d}}, []string{a, b, c, d}},
		{SourceConfig, []Backend{{URL: c}}, []string{b, c, d}},
		{SourceConfig, []Backend{{URL: c, Models: []string{"m"}}}, []string{b, c, d}}, // options changed: re-added
		{SourceDiscover, nil, []string{b, c}},
	}
	for k, st := range steps {
		if err := rt.SetBackends(st.want, st.source); err != nil {
			t.Fatalf("step %d: %v", k, err)
		}
		got := map[string]bool{}
		for _, x := range rt.Backends() {
			got[x.URL] = true
		}
		if len(got) != len(st.after) {
			t.Errorf("step %d (%s): backends %s, want %d", k, st.source, state(), len(st.after))
		}
		for _, u := range st.after {
			if !got[u] {
				t.Errorf("step %d (%s): %s missing from %s", k, st.source, u, state())
			}
		}
	}
	if ms, _ := rt.st.fleet.Models(c); len(ms) != 1 || ms[0].ID != "m" {
		t.Errorf("c's models after its options changed: %v, want [m]", ms)
	}
}

// TestAddedBackendFollowsKVEvents: in precise mode a backend added with a
// kv= endpoint gets its own KV-event subscriber (connected, its replica
// matched against the precise index), and its removal closes it.
func TestAddedBackendFollowsKVEvents(t *testing.T) {
	var reps []*emulator.Server
	for range 2 {
		s, err := emulator.Start(emulator.Config{Model: "m", Preset: "llama3-8b-h100", TimeScale: 0.01,
			KVEventsEndpoint: "tcp://127.0.0.1:*", ReplayEndpoint: "tcp://127.0.0.1:*"}, "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		reps = append(reps, s)
	}
	first := Backend{URL: reps[0].URL(), KV: reps[0].KVEventsEndpoint(), Replay: reps[0].ReplayEndpoint()}
	rt := newTestRouter(t, "kv-aware", func(c *Config) { c.Backends, c.Tokenizer = []Backend{first}, Remote })
	runRouter(t, rt)
	b := Backend{URL: reps[1].URL(), KV: reps[1].KVEventsEndpoint(), Replay: reps[1].ReplayEndpoint(), Models: []string{"m"}}
	if err := rt.AddBackend(b, SourceAdmin); err != nil {
		t.Fatal(err)
	}
	replicaView := func() *view.Replica {
		for _, r := range rt.View(time.Now()).Replicas {
			if r.ID == b.URL {
				return &r
			}
		}
		return nil
	}
	wait.For(t, "the added backend's KV events followed, connected and matched precisely", func() bool {
		r := replicaView()
		return r != nil && r.Events != nil && r.Events.Followed && r.Events.Connected && r.IndexMode == IndexPrecise
	})
	slot := rt.st.fleet.At(b.URL)
	if _, err := rt.RemoveBackend(b.URL, SourceAdmin); err != nil {
		t.Fatal(err)
	}
	if s := rt.st.feed.added[slot].Load(); s != nil || rt.st.feed.followed[slot].Load() {
		t.Errorf("slot %d still followed after the removal", slot)
	}
	// The watch polls the feed every watchInterval.
	wait.Within(t, time.Second, fmt.Sprintf("slot %d no longer matched against the precise index", slot), func() bool {
		return !rt.st.fleet.Tracker().Live(slot)
	})
}
