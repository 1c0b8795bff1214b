package proxy

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/view"
)

// slowWorker is a prefill worker that answers a leg after delay, unless
// the router hangs up first; it counts the legs it got.
type slowWorker struct {
	delay time.Duration
	legs  atomic.Int64
}

func (s *slowWorker) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		return // probes: 200
	}
	s.legs.Add(1)
	io.Copy(io.Discard, r.Body) // read to its end: net/http then watches for the router hanging up
	select {
	case <-time.After(s.delay): // the worker's slowness, which the router must not wait out
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"choices":[],"kv_transfer_params":{"do_remote_prefill":true,"remote_block_ids":[1],"remote_host":"127.0.0.1","remote_port":1}}`)
	case <-r.Context().Done():
	}
}

// TestSlowPrefillWorker: a prefill worker that answers its legs in 40 s
// costs each request at most the leg timeout (here 400 ms, under the
// 60 s TTFT timeout), after which the decode worker computes the prompt
// and the client gets its answer; its timeouts count against its health
// as any replica's failures do, and once ejected it gets no more legs.
func TestSlowPrefillWorker(t *testing.T) {
	const limit = 400 * time.Millisecond
	sw := &slowWorker{delay: 40 * time.Second}
	p := httptest.NewServer(sw)
	t.Cleanup(p.Close)
	d := startEmulator(t)
	rt, url := pdRouter(t, nil, func(c *Config) {
		c.LegTimeout = limit
		c.Outlier.Consecutive = 2
		c.Outlier.PanicThreshold = -1 // the decode worker is healthy: no panic routing to the worker anyway
	}, prefillWorker(p.URL), decodeWorker(d.URL()))
	body := strings.Replace(pdChat(), `"stream":true`, `"stream":false`, 1)
	for i := range 2 {
		start := time.Now()
		resp, out := do(t, "POST", url+"/v1/chat/completions", body)
		took := time.Since(start)
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: status %d: %s", i, resp.StatusCode, out)
		}
		rec := settledRecord(t, rt)
		if rec.PrefillOutcome != legTimeout || rec.Transfer != "" || rec.Replica != d.URL() {
			t.Fatalf("request %d: prefill %q, transfer %q, replica %s; want a timed-out leg and %s computing the prompt", i, rec.PrefillOutcome, rec.Transfer, rec.Replica, d.URL())
		}
		// The leg ends at its timeout, not the worker's 40 s: the bound is
		// half the worker's delay, which no loaded machine reaches.
		if leg := time.Duration(rec.PrefillMS * float64(time.Millisecond)); leg < limit || took > 20*time.Second {
			t.Errorf("request %d: leg %v, request %v; want the leg cut at %v", i, leg, took, limit)
		}
	}
	if got := metricValue(t, url, "kvrouter_kv_transfer_legs_total", "leg", legPrefill, "outcome", legTimeout); got != 2 {
		t.Errorf("prefill legs timed out: %v, want 2", got)
	}
	if rt.st.healthy(0) {
		t.Fatalf("the slow worker is in service after %d timed-out legs, want it ejected", 2)
	}
	if got := metricValue(t, url, "kvrouter_replica_healthy", "replica", p.URL); got != 0 {
		t.Errorf("kvrouter_replica_healthy{replica=%s} = %v, want 0", p.URL, got)
	}
	if resp, out := do(t, "POST", url+"/v1/chat/completions", body); resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, out)
	}
	if rec := settledRecord(t, rt); rec.PrefillLegs != 0 || sw.legs.Load() != 2 {
		t.Errorf("after the ejection: %d legs in the record, %d at the worker; want none new", rec.PrefillLegs, sw.legs.Load())
	}
	wantIdle(t, rt)
}

// paramsWorker is a prefill worker that answers every leg with params.
func paramsWorker(t *testing.T, params string) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"choices":[{"index":0,"message":{"role":"assistant","content":"x"},"finish_reason":"length"}],"usage":{"prompt_tokens":410,"completion_tokens":1},"kv_transfer_params":%s}`, params)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestHostileLegParams: a prefill worker whose params are too large, too
// deep, outside vLLM's NixlConnector schema, or name a side channel on
// another host (a listener on 127.0.0.2 here) gets a bad_params leg,
// counted against its health: the decode worker gets the request without
// params, computes the prompt, and dials nothing.
func TestHostileLegParams(t *testing.T) {
	side, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Skipf("no second loopback address: %v", err)
	}
	var dialed atomic.Int64
	go func() {
		for {
			c, err := side.Accept()
			if err != nil {
				return
			}
			dialed.Add(1)
			c.Close()
		}
	}()
	t.Cleanup(func() { side.Close() })
	sideHost, sidePort, _ := net.SplitHostPort(side.Addr().String())
	ids := strings.Repeat("7,", 300<<10/2) + "7"
	cases := map[string]string{
		"another host":  fmt.Sprintf(`{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[1,2,3],"remote_engine_id":"e","remote_request_id":"r","remote_host":%q,"remote_port":%s,"tp_size":1}`, sideHost, sidePort),
		"a name":        `{"do_remote_prefill":true,"remote_block_ids":[1],"remote_request_id":"r","remote_host":"evil.example","remote_port":5600}`,
		"too large":     `{"do_remote_prefill":true,"remote_block_ids":[` + ids + `],"remote_host":"127.0.0.1","remote_port":5600}`,
		"too deep":      `{"do_remote_prefill":true,"x":` + strings.Repeat("[", 5000) + strings.Repeat("]", 5000) + `}`,
		"an object":     `{"do_remote_prefill":true,"remote_block_ids":[1],"extra":{"remote_host":"10.0.0.1"}}`,
		"a bad port":    `{"do_remote_prefill":true,"remote_block_ids":[1],"remote_host":"127.0.0.1","remote_port":70000}`,
		"not a prefill": `{"do_remote_prefill":false,"do_remote_decode":true,"remote_block_ids":[1]}`,
	}
	for name, params := range cases {
		t.Run(name, func(t *testing.T) {
			d := newTap(t, startEmulator(t))
			rt, url := pdRouter(t, nil, nil, prefillWorker(paramsWorker(t, params)), decodeWorker(d.URL()))
			body := strings.Replace(pdChat(), `"stream":true`, `"stream":false`, 1)
			if resp, out := do(t, "POST", url+"/v1/chat/completions", body); resp.StatusCode != 200 {
				t.Fatalf("status %d: %s", resp.StatusCode, out)
			}
			rec := settledRecord(t, rt)
			if rec.PrefillOutcome != legBadParams || rec.Transfer != "" || rec.Outcome != view.OutcomeOK {
				t.Errorf("record: prefill %q, transfer %q, outcome %q; want bad_params, none, ok", rec.PrefillOutcome, rec.Transfer, rec.Outcome)
			}
			got := d.received(t)
			if len(got) != 1 || got[0]["kv_transfer_params"] != nil {
				t.Fatalf("the decode worker got %d requests, the first with params %s; want one without", len(got), got[0]["kv_transfer_params"])
			}
			if got := metricValue(t, url, "kvrouter_kv_transfer_legs_total", "leg", legPrefill, "outcome", legBadParams); got != 1 {
				t.Errorf("bad_params legs: %v, want 1", got)
			}
			wantIdle(t, rt)
		})
	}
	if n := dialed.Load(); n != 0 {
		t.Errorf("the side channel on %s was dialed %d times, want 0", side.Addr(), n)
	}
}

// TestCheckParams: params as vLLM's NixlConnector returns them pass, on
// the worker that ran the leg; the size, depth, schema and host bounds
// each refuse.
func TestCheckParams(t *testing.T) {
	peer := legPeer{host: "prefill-0.llm.svc", addr: "10.0.3.17"}
	vllm := `{"do_remote_prefill": true, "do_remote_decode": false, "remote_block_ids": [412, 413], "remote_engine_id": "3c1f", "remote_request_id": "chatcmpl-1", "remote_host": "10.0.3.17", "remote_port": 5600, "tp_size": 1}`
	for _, tc := range []struct {
		params string
		prompt int
		ok     bool
	}{
		{vllm, 421, true},
		{strings.Replace(vllm, `"10.0.3.17"`, `"prefill-0.llm.svc"`, 1), 421, true},
		{strings.Replace(vllm, `"10.0.3.17"`, `"::ffff:10.0.3.17"`, 1), 421, true},
		{`{"do_remote_prefill": true, "remote_block_ids": [[1, 2], [3, 4]], "remote_dp_rank": 0}`, 421, true},
		{`{"do_remote_prefill": true, "remote_block_ids": null, "remote_host": null}`, 0, false}, // null is no host
		{strings.Replace(vllm, `"10.0.3.17"`, `"10.0.3.18"`, 1), 421, false},
		{`{"remote_block_ids": [1, 2, 3, 4]}`, 2, false},
		{`{"remote_block_ids": [1.5]}`, 0, false},
		{`{"remote_block_ids": [-1]}`, 0, false},
		{`{"remote_block_ids": [[[1]]]}`, 0, false},
		{`{"remote_engine_id": 5}`, 0, false},
		{`{"tp_size": 0}`, 0, false},
		{`{"x": "` + strings.Repeat("a", 300) + `"}`, 0, false},
	} {
		err := checkParams([]byte(tc.params), tc.prompt, paramRules{answer: true, host: peer.check})
		if (err == nil) != tc.ok || err != nil && !errors.Is(err, errBadParams) {
			t.Errorf("%.80s (prompt %d): got %v, want ok %v", tc.params, tc.prompt, err, tc.ok)
		}
	}
}

// TestHostileOwnParams: a client's own kv_transfer_params, which the
// router forwards without legs, pass the same bounds, and a remote_host
// must be a backend's host: otherwise 400 invalid_kv_transfer_params,
// counted, and nothing reaches an engine. Params naming a backend, or
// none, are forwarded as they are.
func TestHostileOwnParams(t *testing.T) {
	d := newTap(t, startEmulator(t))
	d.strip = true
	_, url := pdRouter(t, nil, nil, decodeWorker(d.URL()))
	body := func(params string) string {
		return `{"model":"m","max_tokens":2,"kv_transfer_params":` + params + `,"prompt":"` + transferText() + `"}`
	}
	for _, params := range []string{
		`{"do_remote_prefill":true,"remote_block_ids":[1,2],"remote_host":"10.9.9.9","remote_port":5600}`,
		`{"do_remote_prefill":true,"x":` + strings.Repeat("[", 10) + strings.Repeat("]", 10) + `}`, // deeper ones the body's own limit refuses
		`{"remote_block_ids":"all"}`,
		`[1]`,
	} {
		resp, out := do(t, "POST", url+"/v1/completions", body(params))
		if resp.StatusCode != 400 {
			t.Errorf("%.60s: status %d %s, want 400", params, resp.StatusCode, out)
			continue
		}
		wantError(t, params, out, codeBadOwnParams)
	}
	if got := metricValue(t, url, "kvrouter_errors_total", "code", codeBadOwnParams); got != 4 {
		t.Errorf("%s counted %v, want 4", codeBadOwnParams, got)
	}
	if n := len(d.received(t)); n != 0 {
		t.Fatalf("the engine got %d requests, want none", n)
	}
	for _, params := range []string{
		`{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`,
		`{"do_remote_prefill":true,"remote_block_ids":[1],"remote_host":"127.0.0.1","remote_port":5600}`,
		`null`,
	} {
		if resp, out := do(t, "POST", url+"/v1/completions", body(params)); resp.StatusCode != 200 {
			t.Errorf("%.60s: status %d %s, want 200", params, resp.StatusCode, out)
		}
	}
}
