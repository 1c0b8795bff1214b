package proxy

import (
	"bufio"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvrouter/kvrouter/fleet"
	"github.com/kvrouter/kvrouter/internal/wait"
	"github.com/kvrouter/kvrouter/route"
	"github.com/kvrouter/kvrouter/view"
)

// sloPolicy routes to the first healthy replica and predicts the miss
// miss holds (a probability in thousandths), recording the SLO of every
// request it decides.
type sloPolicy struct {
	miss atomic.Int64
	mu   sync.Mutex
	seen []route.SLO
}

func (p *sloPolicy) Pick(r *route.Request, s *route.Snapshot) route.Decision {
	p.mu.Lock()
	p.seen = append(p.seen, r.SLO)
	p.mu.Unlock()
	d := firstHealthy(r, s)
	d.Miss = float64(p.miss.Load()) / 1000
	return d
}

// saw returns the SLOs the policy decided, in order.
func (p *sloPolicy) saw() []route.SLO {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]route.SLO(nil), p.seen...)
}

// sloRouter serves a router with policy p in front of backends, its
// config changed by mod; one server carries the API and /metrics.
func sloRouter(t *testing.T, p route.Policy, mod func(*Config), backends ...string) (*Router, string) {
	t.Helper()
	return sloRouterLog(t, p, testLogger(t), mod, backends...)
}

// sloRouterLog is sloRouter logging to log.
func sloRouterLog(t *testing.T, p route.Policy, log *slog.Logger, mod func(*Config), backends ...string) (*Router, string) {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Listen = "127.0.0.1:0"
	for _, b := range backends {
		cfg.Backends = append(cfg.Backends, Backend{URL: b})
	}
	mod(&cfg)
	rt, err := New(cfg, Deps{Registry: prometheus.NewRegistry(), Logger: log, Policy: p})
	if err != nil {
		t.Fatal(err)
	}
	runRouter(t, rt)
	mux := http.NewServeMux()
	mux.Handle("/", rt.Handler())
	mux.Handle("/metrics", rt.AdminHandler())
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return rt, srv.URL
}

// sloChat is a short streamed chat request, distinct per seed.
func sloChat(seed int) string {
	return `{"model":"m","stream":true,"max_tokens":4,"messages":[{"role":"user","content":"hello ` + strconv.Itoa(seed) + `"}]}`
}

// writeKeys writes an API key file and returns its path.
func writeKeys(t *testing.T, lines string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(path, []byte(lines), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestSLOReachesDecision: the fleet's default SLO, an API key's class
// and the request's headers (llm-d's lower-case names too), each bound
// replaced on its own, reach the policy (route.Request.SLO), the
// decision record and the recording; a streamed answer is judged
// against its SLO, in the record and in kvrouter_slo_requests_total.
func TestSLOReachesDecision(t *testing.T) {
	tap := newTap(t, startEmulator(t))
	keys := writeKeys(t, "sk-int web class=interactive\nsk-plain plain\n")
	rec := filepath.Join(t.TempDir(), "rec.jsonl")
	p := &sloPolicy{}
	rt, url := sloRouter(t, p, func(c *Config) {
		c.APIKeys, c.Record.Path = keys, rec
		c.SLO.TTFT, c.SLO.ITL = 2*time.Second, 100*time.Millisecond
		if err := c.SLO.Classes.Set("interactive=500ms/50ms,batch=30s/0"); err != nil {
			t.Fatal(err)
		}
	}, tap.URL())
	tests := []struct {
		name string
		hdr  []string
		want route.SLO
	}{
		{"fleet default", []string{"Authorization", "Bearer sk-plain"},
			route.SLO{TTFT: 2 * time.Second, ITL: 100 * time.Millisecond}},
		{"key class", []string{"Authorization", "Bearer sk-int"},
			route.SLO{TTFT: 500 * time.Millisecond, ITL: 50 * time.Millisecond, Class: "interactive"}},
		{"header over class", []string{"Authorization", "Bearer sk-int", "x-slo-ttft-ms", "300"},
			route.SLO{TTFT: 300 * time.Millisecond, ITL: 50 * time.Millisecond, Class: "interactive"}},
		{"header over default", []string{"Authorization", "Bearer sk-plain", "X-SLO-TPOT-Ms", "20", "X-SLO-TTFT-Ms", "7000"},
			route.SLO{TTFT: 7 * time.Second, ITL: 20 * time.Millisecond}},
	}
	judged := map[string]float64{}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, body := do(t, "POST", url+"/v1/chat/completions", sloChat(i), tt.hdr...)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
			seen := p.saw()
			if diff := cmp.Diff(tt.want, seen[len(seen)-1]); diff != "" {
				t.Errorf("the policy saw (-want +got):\n%s", diff)
			}
			d := rt.Decisions(1)[0]
			got := route.SLO{TTFT: time.Duration(d.SLOTTFTMS * 1e6), ITL: time.Duration(d.SLOITLMS * 1e6), Class: d.SLOClass}
			if got.Class == DefaultClass { // the record names the fleet's default
				got.Class = ""
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("the decision record (-want +got):\n%s", diff)
			}
			checkJudged(t, d)
			judged[d.SLOClass]++
		})
	}
	for class, n := range judged {
		if got := total(families(t, url), "kvrouter_slo_requests_total", "class", class); got != n {
			t.Errorf("kvrouter_slo_requests_total{class=%s} = %v, want %v", class, got, n)
		}
	}
	rt.StopRecording()
	checkRecordedSLOs(t, rec, tests[1].want, tests[3].want)
}

// checkJudged checks that a decision's SLO outcome follows from its
// measured TTFT and mean inter-token latency.
func checkJudged(t *testing.T, d view.Decision) {
	t.Helper()
	want := sloMet
	switch {
	case d.TTFTMS > d.SLOTTFTMS:
		want = sloMissedTTFT
	case d.ITLMS > d.SLOITLMS:
		want = sloMissedITL
	}
	if d.ITLMS <= 0 || d.SLOOutcome != want {
		t.Errorf("judged %q with TTFT %v ms (bound %v), ITL %v ms (bound %v); want %q and a measured ITL",
			d.SLOOutcome, d.TTFTMS, d.SLOTTFTMS, d.ITLMS, d.SLOITLMS, want)
	}
}

// checkRecordedSLOs checks the SLO fields of the recording's 2nd and 4th
// lines (the requests of want2 and want4).
func checkRecordedSLOs(t *testing.T, path string, want2, want4 route.SLO) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	type line struct {
		TTFT  float64 `json:"slo_ttft_ms"`
		ITL   float64 `json:"slo_itl_ms"`
		Class string  `json:"slo_class"`
	}
	var got []line
	for sc := bufio.NewScanner(f); sc.Scan(); {
		var l line
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatal(err)
		}
		got = append(got, l)
	}
	want := []line{{500, 50, want2.Class}, {7000, 20, want4.Class}}
	if len(got) != 4 {
		t.Fatalf("%d lines recorded, want 4", len(got))
	}
	if diff := cmp.Diff(want, []line{got[1], got[3]}); diff != "" {
		t.Errorf("recorded SLOs (-want +got):\n%s", diff)
	}
}

// TestSLOReject429: with --slo-admission reject, a request whose decision
// predicts a miss at least as likely as not (fleet.MissThreshold) gets 429
// slo_unattainable in OpenAI's shape with Retry-After, never reaches the
// replica, takes no load (the fleet refused it before committing), and
// is counted; one predicted to meet its SLO goes through. With route, the same request is
// routed anyway and its record says so.
func TestSLOReject429(t *testing.T) {
	tap := newTap(t, startEmulator(t))
	p := &sloPolicy{}
	var log syncBuffer
	rt, url := sloRouterLog(t, p, slog.New(slog.NewJSONHandler(&log, nil)), func(c *Config) { c.SLO.Admission = SLOAdmitReject }, tap.URL())
	p.miss.Store(500) // exactly MissThreshold
	resp, body := do(t, "POST", url+"/v1/chat/completions", sloChat(1), HeaderSLOTTFT, "250")
	if resp.StatusCode != http.StatusTooManyRequests || errorCode(body) != codeSLOUnattainable {
		t.Fatalf("status %d %s; want 429 %s", resp.StatusCode, body, codeSLOUnattainable)
	}
	var e apiError
	if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error.Type != errRateLimit || e.Error.Message == "" {
		t.Errorf("body %s: want OpenAI's error shape, type %s", body, errRateLimit)
	}
	if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err != nil || s < 1 || s > 60 {
		t.Errorf("Retry-After %q, want 1..60 seconds", resp.Header.Get("Retry-After"))
	}
	if n := len(tap.received(t)); n != 0 {
		t.Errorf("the replica received %d requests, want 0", n)
	}
	if v := rt.st.fleet.View(time.Now()).Replicas[0]; v.InFlight != 0 {
		t.Errorf("replica in flight %d after the rejection, want 0", v.InFlight)
	}
	d := rt.Decisions(1)[0]
	if d.Status != http.StatusTooManyRequests || d.SLOAdmission != sloRejected || d.PredictedMiss != 0.5 || d.Replica != "" {
		t.Errorf("record: status %d, slo_admission %q, predicted_miss %v, replica %q; want 429, rejected, 0.5, none",
			d.Status, d.SLOAdmission, d.PredictedMiss, d.Replica)
	}
	for _, m := range []struct{ name, label, value string }{
		{"kvrouter_slo_unattainable_total", "action", sloRejected},
		{"kvrouter_errors_total", "code", codeSLOUnattainable},
		{"kvrouter_completion_requests_total", "outcome", outcomeRejected},
	} {
		if got := metricValue(t, url, m.name, m.label, m.value); got != 1 {
			t.Errorf("%s{%s=%s} = %v, want 1", m.name, m.label, m.value, got)
		}
	}

	p.miss.Store(499) // below the threshold: routed
	if resp, body := do(t, "POST", url+"/v1/chat/completions", sloChat(2), HeaderSLOTTFT, "250"); resp.StatusCode != http.StatusOK {
		t.Errorf("a request predicted to meet its SLO: status %d %s, want 200", resp.StatusCode, body)
	}
	var lines []map[string]any // the access lines
	for _, l := range jsonLines(t, log.String()) {
		if l["msg"] == "request" {
			lines = append(lines, l)
		}
	}
	for i, want := range []map[string]any{
		{"slo_class": DefaultClass, "slo_ttft_ms": 250.0, "slo_itl_ms": 0.0, "slo_admission": sloRejected, "error": codeSLOUnattainable},
		{"slo_class": DefaultClass, "slo_ttft_ms": 250.0, "slo_outcome": lines[len(lines)-1]["slo_outcome"]},
	} {
		got := lines[len(lines)-2+i]
		for k, v := range want {
			if got[k] != v || v == nil {
				t.Errorf("access line %d: %s = %v, want %v", i+1, k, got[k], v)
			}
		}
	}
	p.miss.Store(900) // no SLO: nothing to miss, whatever the prediction
	if resp, body := do(t, "POST", url+"/v1/chat/completions", sloChat(3)); resp.StatusCode != http.StatusOK {
		t.Errorf("a request without an SLO: status %d %s, want 200", resp.StatusCode, body)
	}

	_, url = sloRouter(t, p, func(c *Config) { c.SLO.TTFT = time.Second }, tap.URL())
	if resp, body := do(t, "POST", url+"/v1/chat/completions", sloChat(4)); resp.StatusCode != http.StatusOK {
		t.Errorf("--slo-admission route: status %d %s, want 200", resp.StatusCode, body)
	}
	if got := metricValue(t, url, "kvrouter_slo_unattainable_total", "class", DefaultClass, "action", sloRouted); got != 1 {
		t.Errorf("kvrouter_slo_unattainable_total{action=routed} = %v, want 1", got)
	}
}

// TestSLOQueue: with --slo-admission queue, a request predicted to miss
// waits in the router's queue, decided again against what remains of its
// TTFT bound, and goes once a decision predicts it meets its SLO; one
// that no decision does gets 429 slo_unattainable when its TTFT bound
// has passed.
func TestSLOQueue(t *testing.T) {
	tap := newTap(t, startEmulator(t))
	p := &sloPolicy{}
	rt, url := sloRouter(t, p, func(c *Config) { c.SLO.Admission = SLOAdmitQueue }, tap.URL())
	p.miss.Store(900)
	done := make(chan admitted, 1)
	go func() { done <- send(t, url, sloChat(1), HeaderSLOTTFT, "60000") }()
	waitQueued(t, rt, 1)
	wait.For(t, "a decision again in the queue", func() bool { return len(p.saw()) >= 2 })
	p.miss.Store(100)
	if a := <-done; a.status != http.StatusOK {
		t.Fatalf("queued request: status %d %s, want 200 once predicted to meet its SLO", a.status, a.body)
	}
	seen := p.saw()
	if first, last := seen[0].TTFT, seen[len(seen)-1].TTFT; first != time.Minute || last >= first || last <= 0 {
		t.Errorf("decided with TTFT bounds %v first, %v last; want 1m, then what remained of it", first, last)
	}
	d := rt.Decisions(1)[0]
	if d.SLOAdmission != sloQueued || d.SLOTTFTMS != 60000 || d.PredictedMiss != 0.1 {
		t.Errorf("record: slo_admission %q, slo_ttft_ms %v, predicted_miss %v; want queued, 60000, 0.1", d.SLOAdmission, d.SLOTTFTMS, d.PredictedMiss)
	}
	if n := len(tap.received(t)); n != 1 {
		t.Errorf("the replica received %d requests, want 1", n)
	}

	p.miss.Store(900)
	start := time.Now()
	late := send(t, url, sloChat(2), HeaderSLOTTFT, "200")
	if late.status != http.StatusTooManyRequests || errorCode(late.body) != codeSLOUnattainable || late.retryAfter == "" {
		t.Errorf("never predicted to meet its SLO: status %d %s, Retry-After %q; want 429 %s with Retry-After",
			late.status, late.body, late.retryAfter, codeSLOUnattainable)
	}
	if took := time.Since(start); took < 200*time.Millisecond {
		t.Errorf("answered after %v, before its 200 ms TTFT bound passed", took)
	}
	if v := rt.st.fleet.View(time.Now()).Replicas[0]; v.InFlight != 0 {
		t.Errorf("replica in flight %d, want 0", v.InFlight)
	}
	if got := metricValue(t, url, "kvrouter_slo_unattainable_total", "action", sloQueued); got != 2 {
		t.Errorf("kvrouter_slo_unattainable_total{action=queued} = %v, want 2", got)
	}
}

// TestSLOBadHeaders: an SLO header that is not a whole number of
// milliseconds within 1..maxSLOMs is answered 400 invalid_slo_header in
// OpenAI's shape, counted, and never reaches a replica.
func TestSLOBadHeaders(t *testing.T) {
	up := newFake(t, 0)
	p := &sloPolicy{}
	_, url := sloRouter(t, p, func(*Config) {}, up.URL)
	bad := []struct{ header, value string }{
		{HeaderSLOTTFT, "fast"},
		{HeaderSLOTTFT, "0"},
		{"x-slo-ttft-ms", "-5"},
		{HeaderSLOTPOT, "1.5"},
		{"x-slo-tpot-ms", strconv.Itoa(maxSLOMs + 1)},
		{HeaderSLOTPOT, "1e3"},
		{HeaderSLOTTFT, strings.Repeat("9", 100)},
	}
	for _, b := range bad {
		t.Run(b.header+"="+b.value, func(t *testing.T) {
			resp, body := do(t, "POST", url+"/v1/chat/completions", sloChat(0), b.header, b.value)
			var e apiError
			json.Unmarshal([]byte(body), &e)
			if resp.StatusCode != http.StatusBadRequest || errorCode(body) != codeSLOHeader || e.Error.Type != errInvalidRequest ||
				!strings.Contains(strings.ToLower(e.Error.Message), strings.ToLower(b.header)) {
				t.Errorf("status %d %s; want 400 %s naming the header", resp.StatusCode, body, codeSLOHeader)
			}
		})
	}
	if got := metricValue(t, url, "kvrouter_errors_total", "code", codeSLOHeader); got != float64(len(bad)) {
		t.Errorf("kvrouter_errors_total{code=%s} = %v, want %d", codeSLOHeader, got, len(bad))
	}
	forwarded := 0
	for _, b := range up.received() { // the health probes' too: no body
		if len(b) > 0 {
			forwarded++
		}
	}
	if n := forwarded + len(p.saw()); n != 0 {
		t.Errorf("%d requests decided or forwarded, want 0", n)
	}
	if resp, body := do(t, "POST", url+"/v1/chat/completions", sloChat(0), HeaderSLOTTFT, strconv.Itoa(maxSLOMs)); resp.StatusCode != http.StatusOK {
		t.Errorf("%s: %d (the bound): status %d %s, want 200", HeaderSLOTTFT, maxSLOMs, resp.StatusCode, body)
	}
}

// TestSLOSettings: the classes' forms (flag string, YAML mapping) and
// the settings New refuses: a bad class, an unknown admission mode,
// queueing without the router's queue, a key naming no class.
func TestSLOSettings(t *testing.T) {
	var c SLOClasses
	if err := c.Set("interactive=500ms/50ms, batch=30s/0"); err != nil {
		t.Fatal(err)
	}
	want := SLOClasses{
		"interactive": {TTFT: 500 * time.Millisecond, ITL: 50 * time.Millisecond, Class: "interactive"},
		"batch":       {TTFT: 30 * time.Second, Class: "batch"},
	}
	if diff := cmp.Diff(want, c); diff != "" {
		t.Errorf("Set (-want +got):\n%s", diff)
	}
	if got := c.String(); got != "batch=30s/0s,interactive=500ms/50ms" {
		t.Errorf("String() = %q", got)
	}
	for _, s := range []string{"x", "a=1s", "a=1s/x", "a=0/0", "a=-1s/0", "default=1s/0", "a b=1s/0", "a=1s/0,a=2s/0"} {
		if err := new(SLOClasses).Set(s); err == nil {
			t.Errorf("Set(%q): no error", s)
		}
	}
	file := filepath.Join(t.TempDir(), "kvrouter.yaml")
	os.WriteFile(file, []byte("slo-classes:\n  batch: 30s/0\nslo-admission: reject\n"), 0o600)
	cfg := DefaultConfig()
	if err := ReadConfigFile(file, &cfg); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(SLOs{Classes: SLOClasses{"batch": want["batch"]}, Admission: SLOAdmitReject}, cfg.SLO); diff != "" {
		t.Errorf("YAML mapping (-want +got):\n%s", diff)
	}

	keys := writeKeys(t, "sk-a a class=gold\n")
	for name, mod := range map[string]func(*Config){
		"mode":        func(c *Config) { c.SLO.Admission = "drop" },
		"queue off":   func(c *Config) { c.SLO.Admission, c.Admission.MaxWait = SLOAdmitQueue, 0 },
		"negative":    func(c *Config) { c.SLO.ITL = -time.Millisecond },
		"key's class": func(c *Config) { c.APIKeys = keys },
	} {
		cfg := DefaultConfig()
		cfg.Backends = []Backend{{URL: "http://127.0.0.1:1"}}
		mod(&cfg)
		if _, err := New(cfg, Deps{Registry: prometheus.NewRegistry()}); err == nil {
			t.Errorf("%s: New accepted it", name)
		}
	}
	if _, err := parseKeys(strings.NewReader("sk-a a class=bad/name\n")); err == nil {
		t.Error("class=bad/name: parseKeys accepted it")
	}
}

// TestSLOPicker: the endpoint picker's requests (Router.Pick, behind a
// gateway that forwards llm-d's x-slo-* headers) take the same SLO
// headers: one reaches the policy, a bad one is answered 400, and a
// predicted miss under --slo-admission reject is answered 429.
func TestSLOPicker(t *testing.T) {
	tap := newTap(t, startEmulator(t))
	p := &sloPolicy{}
	rt, _ := sloRouter(t, p, func(c *Config) { c.SLO.Admission = SLOAdmitReject }, tap.URL())
	pick := func(hdr ...string) (*Pick, *httptest.ResponseRecorder) {
		body := sloChat(0)
		r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(body))
		for i := 0; i+1 < len(hdr); i += 2 {
			r.Header.Set(hdr[i], hdr[i+1])
		}
		w := httptest.NewRecorder()
		return rt.Pick(w, r, []byte(body), nil), w
	}
	pk, w := pick("x-slo-ttft-ms", "300", "x-slo-tpot-ms", "40")
	if pk == nil {
		t.Fatalf("no pick: %d %s", w.Code, w.Body)
	}
	pk.Done(true, fleet.NoUsage)
	want := route.SLO{TTFT: 300 * time.Millisecond, ITL: 40 * time.Millisecond}
	if diff := cmp.Diff(want, p.saw()[0]); diff != "" {
		t.Errorf("the policy saw (-want +got):\n%s", diff)
	}
	if pk, w := pick("x-slo-ttft-ms", "soon"); pk != nil || w.Code != http.StatusBadRequest || errorCode(w.Body.String()) != codeSLOHeader {
		t.Errorf("bad header: pick %v, %d %s; want none, 400 %s", pk != nil, w.Code, w.Body, codeSLOHeader)
	}
	p.miss.Store(800)
	if pk, w := pick("x-slo-ttft-ms", "300"); pk != nil || w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") == "" {
		t.Errorf("predicted miss: pick %v, %d %s; want none, 429 with Retry-After", pk != nil, w.Code, w.Body)
	}
}
