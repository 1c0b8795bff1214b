package proxy

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvrouter/kvrouter/emulator"
	"github.com/kvrouter/kvrouter/engine"
	"github.com/kvrouter/kvrouter/fleet"
	"github.com/kvrouter/kvrouter/internal/wait"
	"github.com/kvrouter/kvrouter/route"
	"github.com/kvrouter/kvrouter/view"
)

// The tests below run the prefill leg on emulated engines that speak
// vLLM's NixlConnector protocol: the prefill worker answers with
// kv_transfer_params naming its blocks and side channel, and the decode
// worker reads them from it.

// TestDisaggregatedStream: two prefill workers and two decode workers
// behind the router; a streamed chat completion runs its prefill leg on
// a prefill worker, the decode worker reads the transferred blocks (its
// cached_tokens are the tokens transferred), and the client's stream is
// the one a direct request gets, but for ids, times and that usage.
func TestDisaggregatedStream(t *testing.T) {
	var bes []Backend
	ps := []*engineTap{newTap(t, startEmulator(t)), newTap(t, startEmulator(t))}
	ds := []*emulator.Server{startEmulator(t), startEmulator(t)}
	for _, p := range ps {
		bes = append(bes, prefillWorker(p.URL()))
	}
	for _, d := range ds {
		bes = append(bes, decodeWorker(d.URL()))
	}
	rt, url := pdRouter(t, nil, nil, bes...)
	body := pdChat()
	resp, events := replyEvents(t, url, body)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	rec := settledRecord(t, rt)
	if rec.PrefillOutcome != legOK || !strings.HasPrefix(rec.Transfer, "from ") || rec.TransferTokens <= 0 {
		t.Fatalf("record: transfer %q of %d tokens, prefill %q; want a transfer", rec.Transfer, rec.TransferTokens, rec.PrefillOutcome)
	}
	if got := streamCached(t, events); got != rec.TransferTokens {
		t.Errorf("the decode worker reported %d cached tokens, want the %d transferred", got, rec.TransferTokens)
	}
	ec, _ := engine.Preset(engine.DefaultPreset)
	if got := metricValue(t, url, "kvrouter_kv_transfers_total", "to", rec.Replica); got != 1 {
		t.Errorf("transfers counted: %v, want 1 (the decode worker's usage shows the read)", got)
	}
	if got, want := metricValue(t, url, "kvrouter_kv_transfer_bytes_total", "to", rec.Replica), float64(rec.TransferTokens*ec.KVBytesPerToken); got != want {
		t.Errorf("transfer bytes %v, want %v", got, want)
	}
	var direct *emulator.Server
	for _, d := range ds {
		if d.URL() == rec.Replica {
			direct = d
		}
	}
	if direct == nil {
		t.Fatalf("served by %s, not a decode worker", rec.Replica)
	}
	_, want := replyEvents(t, direct.URL(), body)
	if got, w := readReply(t, events), readReply(t, want); got.Text != w.Text || got.Completion != w.Completion || !got.Done || got.Roles != w.Roles || len(events) != len(want) {
		t.Errorf("stream %+v (%d events), want the direct one %+v (%d events)", got, len(events), w, len(want))
	}
	wantIdle(t, rt)
}

// TestDecodeFailsBeforeFirstToken: the decode replica a transfer was
// ordered for fails before its first token (503): the request is decided
// again, and as the new decision orders a transfer too, a fresh prefill
// leg runs for it and the retry carries that leg's params.
func TestDecodeFailsBeforeFirstToken(t *testing.T) {
	p := newTap(t, startEmulator(t))
	bad, good := newTap(t, startEmulator(t)), newTap(t, startEmulator(t))
	bad.status = http.StatusServiceUnavailable
	rt, url := pdRouter(t, nil, nil, prefillWorker(p.URL()), decodeWorker(bad.URL()), decodeWorker(good.URL()))
	resp, events := replyEvents(t, url, pdChat())
	if resp.StatusCode != 200 || resp.Header.Get(HeaderReplica) != good.URL() {
		t.Fatalf("status %d from %s, want 200 from %s", resp.StatusCode, resp.Header.Get(HeaderReplica), good.URL())
	}
	if r := readReply(t, events); !r.Done {
		t.Errorf("stream %+v did not end", r)
	}
	if n := len(p.received(t)); n != 2 {
		t.Errorf("%d prefill legs, want 2 (one per decision)", n)
	}
	failed, retried := bad.received(t), good.received(t)
	if len(failed) != 1 || len(retried) != 1 || len(failed[0]["kv_transfer_params"]) == 0 || len(retried[0]["kv_transfer_params"]) == 0 {
		t.Fatalf("decode legs: failed %d, retried %d, want one each with params", len(failed), len(retried))
	}
	if string(failed[0]["kv_transfer_params"]) == string(retried[0]["kv_transfer_params"]) {
		t.Errorf("the retry reuses the first leg's params %s", failed[0]["kv_transfer_params"])
	}
	if h := resp.Header.Get(HeaderDecision); !strings.Contains(h, "retried=1") || !strings.Contains(h, "transfer=from "+p.URL()) {
		t.Errorf("%s %q: want a retry with a transfer", HeaderDecision, h)
	}
	for _, m := range []struct{ name, label, value string }{
		{"kvrouter_kv_transfer_fallbacks_total", "reason", fallbackDecodeFailed},
		{"kvrouter_kv_transfer_legs_total", "outcome", "retried"},
	} {
		if got := metricValue(t, url, m.name, m.label, m.value); got != 1 {
			t.Errorf("%s{%s=%s} = %v, want 1", m.name, m.label, m.value, got)
		}
	}
	if got := metricValue(t, url, "kvrouter_kv_transfers_total", "to", good.URL()); got != 1 {
		t.Errorf("transfers to the retry's replica: %v, want 1", got)
	}
	wantIdle(t, rt)
}

// TestClientGoneBetweenLegs: the client goes away while the prefill leg
// runs; the leg answers after that, and the router sends the decode leg
// all the same, detached: one token, not streamed, with the leg's
// params, so that the decode worker reads the blocks and the prefill
// worker frees them. The release is counted and nothing stays charged.
func TestClientGoneBetweenLegs(t *testing.T) {
	p, d := newTap(t, startEmulator(t)), newTap(t, startEmulator(t))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p.hold = func(*http.Request) {
		cancel()
		time.Sleep(200 * time.Millisecond) // the router hears of it before the leg answers
	}
	rt, url := pdRouter(t, nil, nil, prefillWorker(p.URL()), decodeWorker(d.URL()))
	req, _ := http.NewRequestWithContext(ctx, "POST", url+"/v1/chat/completions", strings.NewReader(pdChat()))
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("the client got an answer (%d) after it left", resp.StatusCode)
	}
	waitTotal(t, url, 1, "kvrouter_kv_transfer_releases_total", "how", releaseSent)
	got := d.received(t)
	if len(got) != 1 {
		t.Fatalf("the decode worker got %d requests, want the release", len(got))
	}
	for k, v := range map[string]string{"stream": "false", "max_tokens": "1", "max_completion_tokens": "1"} {
		if string(got[0][k]) != v {
			t.Errorf("release %s = %s, want %s", k, got[0][k], v)
		}
	}
	if _, ok := got[0]["stream_options"]; ok || len(got[0]["kv_transfer_params"]) == 0 {
		t.Errorf("release %s: want params and no stream_options", d.raw(0))
	}
	if rec := settledRecord(t, rt); rec.Outcome != view.OutcomeCanceled || rec.PrefillOutcome != legOK {
		t.Errorf("record: outcome %s, prefill %s; want canceled, ok", rec.Outcome, rec.PrefillOutcome)
	}
	wantIdle(t, rt)
}

// TestClientGoneBeforeFirstToken: the client goes away after the decode
// leg was sent, before its first token: the decode worker, which has the
// request, frees the blocks when it aborts it; the router sends nothing
// more and counts the release as the engine's.
func TestClientGoneBeforeFirstToken(t *testing.T) {
	p, d := newTap(t, startEmulator(t)), newTap(t, startEmulator(t))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	d.hold = func(r *http.Request) {
		cancel()
		<-r.Context().Done()
	}
	rt, url := pdRouter(t, nil, nil, prefillWorker(p.URL()), decodeWorker(d.URL()))
	req, _ := http.NewRequestWithContext(ctx, "POST", url+"/v1/chat/completions", strings.NewReader(pdChat()))
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
	}
	waitTotal(t, url, 1, "kvrouter_kv_transfer_releases_total", "how", releaseEngine)
	if n := len(d.received(t)); n != 1 {
		t.Errorf("the decode worker got %d requests, want the decode leg alone", n)
	}
	settledRecord(t, rt)
	wantIdle(t, rt)
}

// TestKVTransferContinuationDropsParams: the decode replica a transfer
// was ordered for reads the blocks, then its stream is cut after a few
// tokens; the continuation on another replica carries no
// kv_transfer_params (the blocks were read) and runs no prefill leg.
func TestKVTransferContinuationDropsParams(t *testing.T) {
	p := newTap(t, startEmulator(t))
	mid, dst := startEmulator(t), newTap(t, startEmulator(t))
	f := &faulty{h: mid.Handler(), after: 3}
	cut := httptest.NewServer(f)
	t.Cleanup(cut.Close)
	var n atomic.Int64
	policy := route.Func(func(r *route.Request, s *route.Snapshot) route.Decision {
		if n.Add(1) == 1 {
			return route.Decision{Replica: 1, Reason: route.ReasonTransfer, Transfer: route.Transfer{From: 0, Blocks: max(r.Blocks, 1)}}
		}
		return route.Decision{Replica: 2, Reason: "continue"}
	})
	rt, url := pdRouter(t, policy, nil, prefillWorker(p.URL()), decodeWorker(cut.URL), decodeWorker(dst.URL()))
	_, events := replyEvents(t, url, pdChat())
	if got := readReply(t, events); !got.Done || got.ErrCode != "" {
		t.Fatalf("reply %+v, want a whole stream", got)
	}
	if f.hits.Load() != 1 {
		t.Fatalf("%d requests reached the cut replica, want 1", f.hits.Load())
	}
	if n := len(p.received(t)); n != 1 {
		t.Errorf("%d prefill legs, want 1", n)
	}
	if got := dst.received(t); len(got) != 1 || got[0]["kv_transfer_params"] != nil {
		t.Errorf("the continuation %s carries params", dst.raw(0))
	}
	if got := metricValue(t, url, "kvrouter_stream_failures_total", "result", midContinued); got != 1 {
		t.Errorf("kvrouter_stream_failures_total{result=continued} = %v, want 1", got)
	}
	if got := metricValue(t, url, "kvrouter_kv_transfer_legs_total", "leg", legDecode, "outcome", "cut"); got != 1 {
		t.Errorf("decode legs cut: %v, want 1", got)
	}
	wantIdle(t, rt)
}

// TestDecodeRefused: a decode worker that refuses the decode leg (a 400,
// from its API: its engine never saw the request) passes the refusal to
// the client; the blocks the prefill worker holds wait for its abort
// timeout, which is counted.
func TestDecodeRefused(t *testing.T) {
	p, d := newTap(t, startEmulator(t)), newTap(t, startEmulator(t))
	d.status = http.StatusBadRequest
	rt, url := pdRouter(t, nil, nil, prefillWorker(p.URL()), decodeWorker(d.URL()))
	if resp, b := do(t, "POST", url+"/v1/chat/completions", pdChat()); resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("status %d: %s, want the decode worker's 400", resp.StatusCode, b)
	}
	settledRecord(t, rt)
	if got := metricValue(t, url, "kvrouter_kv_transfer_releases_total", "how", releaseTimeout); got != 1 {
		t.Errorf("releases{how=timeout}: %v, want 1", got)
	}
	wantIdle(t, rt)
}

// TestKVAwareOrdersTransfer: the default policy, with --kv-transfer and a
// 5 GB/s link (where importing a 4,000-word prompt's KV beats computing
// it), sends a repeat of a prompt, asking for a long answer, whose holder
// decodes a large batch of long answers to the idle replica with an import
// from the holder (a short answer saves less decode time away from the
// batch than the import takes, at the preset's rates; only an emulator
// starved of CPU, its decodes slower than the preset's, made it pay): the
// holder runs the prefill leg (its cache has the prompt, so it is short),
// the idle replica reads the blocks, reports them cached, and decodes
// away from the holder's batch. The first token's time against the
// prediction is logged, not checked: wall-clock times on a shared
// machine.
func TestKVAwareOrdersTransfer(t *testing.T) {
	const scale, gbps = 0.2, 5
	start := func() *emulator.Server {
		e, err := emulator.Start(emulator.Config{Model: "m", Preset: engine.DefaultPreset, TimeScale: scale, InterconnectGBps: gbps}, "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })
		return e
	}
	a, b := start(), start()
	cfg := DefaultConfig()
	cfg.ClientHeaders = true // the test reads the routing headers
	cfg.Listen, cfg.KVTransfer, cfg.InterconnectGBps, cfg.TimeScale = "127.0.0.1:0", true, gbps, scale
	cfg.Backends = []Backend{{URL: a.URL()}, {URL: b.URL()}}
	// The calibration is pinned (Min = Max = 1), as the demo's: the claim
	// is about the preset's rates, which the emulators run at by
	// construction. Unpinned, the warm-up's four tokens are the decode
	// calibration's first observation, which sets its scale: on a starved
	// CPU they arrive bunched (an inter-token latency of 0.02 ms, a
	// fiftieth of the preset's), so the decode time saved away from the
	// batch falls below the import and the holder keeps the request, or
	// stretched (20 ms), so recomputing the prompt elsewhere wins.
	rt, err := New(cfg, Deps{Registry: prometheus.NewRegistry(), Logger: testLogger(t), Calibration: fleet.Calibrator{Min: 1, Max: 1}})
	if err != nil {
		t.Fatal(err)
	}
	runRouter(t, rt) // scrapes: the policy sees the holder's batch
	mux := http.NewServeMux()
	mux.Handle("/", rt.Handler())
	mux.Handle("/debug/", rt.AdminHandler())
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	words := make([]string, 4000) // of 4 characters: a token each
	for i := range words {
		words[i] = fmt.Sprintf("w%c%c%c", 'a'+i%26, 'a'+i/26%26, 'a'+i/676)
	}
	body, _ := json.Marshal(map[string]any{"model": "m", "prompt": strings.Join(words, " "), "max_tokens": 4, "stream": true})
	resp, _ := do(t, "POST", srv.URL+"/v1/completions", string(body))
	holder := resp.Header.Get(HeaderReplica)
	other := map[string]*emulator.Server{a.URL(): b, b.URL(): a}[holder]
	if other == nil {
		t.Fatalf("warm request served by %q", holder)
	}
	// Give the holder a batch the router did not place (another client's
	// long answers, straight to the engine): its scraped Running.
	var streams sync.WaitGroup
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); streams.Wait() })
	for i := range 48 {
		other := make([]string, 1500)
		for k := range other {
			other[k] = fmt.Sprintf("q%d-%d", i, k)
		}
		b, _ := json.Marshal(map[string]any{"model": "m", "prompt": strings.Join(other, " "), "max_tokens": 1500, "ignore_eos": true})
		req, _ := http.NewRequestWithContext(ctx, "POST", holder+"/v1/completions", strings.NewReader(string(b)))
		streams.Go(func() {
			if resp, err := http.DefaultClient.Do(req); err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
	wait.For(t, "the holder's batch in its metrics", func() bool {
		for _, r := range rt.st.fleet.View(time.Now()).Replicas {
			if r.ID == holder && r.Running >= 40 && r.Waiting == 0 {
				return true
			}
		}
		return false
	})

	body, _ = json.Marshal(map[string]any{"model": "m", "prompt": strings.Join(words, " "), "max_tokens": 512, "stream": true})
	resp, out := do(t, "POST", srv.URL+"/v1/completions", string(body))
	if got := resp.Header.Get(HeaderReplica); got != other.URL() {
		_, dec := do(t, "GET", srv.URL+"/debug/decisions?n=1", "")
		t.Fatalf("repeat served by %s (%s), want the idle replica with a transfer; %s", got, resp.Header.Get(HeaderDecision), dec)
	}
	if d := resp.Header.Get(HeaderDecision); !strings.Contains(d, "reason=transfer") || !strings.Contains(d, "transfer=from "+holder) {
		_, dec := do(t, "GET", srv.URL+"/debug/decisions?n=1", "")
		t.Fatalf("decision %q, want a transfer from %s; %s", d, holder, dec)
	}
	if !strings.HasSuffix(strings.TrimSpace(out), "data: [DONE]") {
		t.Errorf("stream did not end: %s", out)
	}
	_, dec := do(t, "GET", srv.URL+"/debug/decisions?n=1", "")
	var recs struct {
		Decisions []view.Decision `json:"decisions"`
	}
	if err := json.Unmarshal([]byte(dec), &recs); err != nil || len(recs.Decisions) == 0 {
		t.Fatalf("decisions %s: %v", dec, err)
	}
	rec := recs.Decisions[0]
	if rec.Reason != route.ReasonTransfer || rec.PredictedTTFTMS <= 0 || rec.PrefillOutcome != legOK {
		t.Fatalf("record %+v, want the transfer with its predicted TTFT and a prefill leg", rec)
	}
	if rec.ActualCached < rec.PromptTokens*9/10 {
		t.Errorf("the destination reported %d of %d prompt tokens cached, want the imported prefix", rec.ActualCached, rec.PromptTokens)
	}
	t.Logf("TTFT %.1f ms, predicted %.1f ms (import %.1f ms, prefill leg %.1f ms): %.2f×",
		rec.TTFTMS, rec.PredictedTTFTMS, rec.PredictedTransferMS, rec.PrefillMS, rec.TTFTMS/rec.PredictedTTFTMS)
}

// TestDecodeUnreachable: the decode replica a transfer was ordered for
// refuses the connection: it never had the request, so the blocks the
// first leg left wait for the prefill worker's abort timeout (counted);
// the retry gets a fresh leg of its own.
func TestDecodeUnreachable(t *testing.T) {
	p, good := newTap(t, startEmulator(t)), newTap(t, startEmulator(t))
	down := httptest.NewServer(http.NotFoundHandler())
	down.Close()
	rt, url := pdRouter(t, nil, nil, prefillWorker(p.URL()), decodeWorker(down.URL), decodeWorker(good.URL()))
	resp, events := replyEvents(t, url, pdChat())
	if resp.StatusCode != 200 || resp.Header.Get(HeaderReplica) != good.URL() || !readReply(t, events).Done {
		t.Fatalf("status %d from %s, want a whole stream from %s", resp.StatusCode, resp.Header.Get(HeaderReplica), good.URL())
	}
	if n := len(p.received(t)); n != 2 {
		t.Errorf("%d prefill legs, want 2", n)
	}
	if got := metricValue(t, url, "kvrouter_kv_transfer_releases_total", "how", releaseTimeout); got != 1 {
		t.Errorf("releases{how=timeout}: %v, want 1", got)
	}
	wantIdle(t, rt)
}

// TestKVTransferImport: with --kv-transfer, an import from a holder (a
// replica of role both that served the prompt before) runs as the same
// two legs: the holder gets the prefill leg, the destination the request
// with the holder's params, reads the blocks and reports them cached.
func TestKVTransferImport(t *testing.T) {
	src, dst := newTap(t, startEmulator(t)), newTap(t, startEmulator(t))
	rt, url := pdRouter(t, orderImport(), func(c *Config) { c.KVTransfer = true }, Backend{URL: src.URL()}, Backend{URL: dst.URL()})
	body := `{"model":"m","max_tokens":2,"prompt":"` + transferText() + `"}`
	do(t, "POST", url+"/v1/completions", body)
	resp, b := do(t, "POST", url+"/v1/completions", body)
	if resp.StatusCode != 200 || resp.Header.Get(HeaderReplica) != dst.URL() {
		t.Fatalf("status %d from %s: %s", resp.StatusCode, resp.Header.Get(HeaderReplica), b)
	}
	legs := src.received(t)
	if len(legs) != 2 || string(legs[1]["max_tokens"]) != "1" || !strings.Contains(string(legs[1]["kv_transfer_params"]), `"do_remote_decode":true`) {
		t.Fatalf("the holder got %d requests, want the warm one and a prefill leg", len(legs))
	}
	rec := settledRecord(t, rt)
	if rec.Transfer != "from "+src.URL() || rec.PrefillOutcome != legOK {
		t.Fatalf("record: transfer %q, prefill %q; want from %s, ok", rec.Transfer, rec.PrefillOutcome, src.URL())
	}
	// The emulator reads every block but the one holding the prompt's
	// last token, which it computes (vLLM computes the token alone): of
	// 400 tokens, 25 blocks listed, 24 read.
	if got, want := cachedOf(t, b), min(rec.TransferTokens, (400-1)/16*16); got != want {
		t.Errorf("cached_tokens %d, want %d of the %d transferred", got, want, rec.TransferTokens)
	}
	if h := resp.Header.Get(HeaderDecision); !strings.Contains(h, "; transfer=from "+src.URL()+" 3.000ms") {
		t.Errorf("%s %q lacks the transfer", HeaderDecision, h)
	}
	if got := metricValue(t, url, "kvrouter_kv_transfers_total", "from", src.URL(), "to", dst.URL()); got != 1 {
		t.Errorf("kvrouter_kv_transfers_total %v, want 1", got)
	}
	wantIdle(t, rt)
}

// TestKVAwareDisaggregates: kv-aware itself, on emulated engines, one
// prefill worker and one decode worker. With the decode worker idle a
// prompt is prefilled there (reason local-prefill: a leg would spare no
// decode a stall and would cost the transfer). While a long answer
// decodes there, a prompt of 2,000 tokens goes to the prefill worker
// (reason disagg; route's TestDisaggregationBreakEven has where the two
// prices cross), whose blocks the decode worker reads.
func TestKVAwareDisaggregates(t *testing.T) {
	p, d := newTap(t, startEmulator(t)), startEmulator(t)
	// The router prices at the emulators' time scale: the links' times are
	// not learned, so at its default a transfer would look 50 times
	// longer than the emulated link takes.
	rt, url := pdRouter(t, route.KVAware{}, func(c *Config) { c.TimeScale = 0.02 }, prefillWorker(p.URL()), decodeWorker(d.URL()))
	chat := func(word string, words, maxTokens int) string {
		w := make([]string, words)
		for i := range w {
			w[i] = fmt.Sprintf("%s%d", word, i)
		}
		return fmt.Sprintf(`{"model":"m","stream":true,"stream_options":{"include_usage":true},"max_tokens":%d,"messages":[{"role":"user","content":%q}]}`, maxTokens, strings.Join(w, " "))
	}
	replyEvents(t, url, chat("a", 2000, 4))
	if rec := settledRecord(t, rt); rec.Reason != route.ReasonLocalPrefill || len(p.received(t)) != 0 {
		t.Fatalf("idle decode worker: reason %q, %d legs; want %q and none", rec.Reason, len(p.received(t)), route.ReasonLocalPrefill)
	}
	long := make(chan []string, 1)
	go func() {
		_, events := replyEvents(t, url, chat("b", 200, 8000))
		long <- events
	}()
	wait.For(t, "the long answer decoding", func() bool {
		return rt.Decisions(1)[0].Outcome == view.OutcomeInFlight && len(rt.Decisions(1)) == 1
	})
	_, events := replyEvents(t, url, chat("c", 2000, 4))
	rec := settledRecord(t, rt)
	if rec.Reason != route.ReasonDisagg || rec.PrefillOutcome != legOK || len(p.received(t)) != 1 {
		t.Fatalf("decode worker busy: reason %q, prefill %q, %d legs; want %q and one leg: %+v", rec.Reason, rec.PrefillOutcome, len(p.received(t)), route.ReasonDisagg, rec)
	}
	if got := streamCached(t, events); got <= 0 || got > rec.TransferTokens {
		t.Errorf("the decode worker read %d tokens of the %d sent", got, rec.TransferTokens)
	}
	if got := readReply(t, <-long); !got.Done {
		t.Errorf("the long answer: %+v", got)
	}
	wantIdle(t, rt)
}
