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
	"github.com/kvrouter/kvrouter/internal/wait"
	"github.com/kvrouter/kvrouter/route"
	"github.com/kvrouter/kvrouter/view"
)

// transferBlocks is the import the test policy orders, in router blocks
// of 16 tokens.
const transferBlocks = 10

// orderTransfer is a policy that sends the first request to replica 0 and
// every later one to the first healthy replica after it, ordering the
// import of transferBlocks blocks from replica 0.
func orderTransfer() route.Policy {
	var calls atomic.Int64
	return route.Func(func(r *route.Request, s *route.Snapshot) route.Decision {
		if calls.Add(1) == 1 {
			return route.Decision{Replica: 0, Reason: "warm"}
		}
		for i := 1; i < len(s.Replicas); i++ {
			if s.Replicas[i].Healthy {
				return route.Decision{Replica: i, Reason: route.ReasonTransfer,
					Transfer: route.Transfer{From: 0, Blocks: transferBlocks, Time: 3 * time.Millisecond}}
			}
		}
		return route.Decision{Replica: -1}
	})
}

// transferRouter serves a router with orderTransfer in front of backends.
func transferRouter(t *testing.T, on bool, backends ...string) (*Router, string) {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Listen, cfg.KVTransfer = "127.0.0.1:0", on
	for _, b := range backends {
		cfg.Backends = append(cfg.Backends, Backend{URL: b})
	}
	rt, err := New(cfg, Deps{Registry: prometheus.NewRegistry(), Logger: testLogger(t), Policy: orderTransfer()})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/", rt.Handler())
	mux.Handle("/metrics", rt.AdminHandler())
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return rt, srv.URL
}

func startEmulator(t *testing.T) *emulator.Server {
	t.Helper()
	e, err := emulator.Start(emulator.Config{Model: "m", Preset: engine.DefaultPreset, TimeScale: 0.02}, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// transferText is a prompt of 400 words, a token each.
func transferText() string {
	words := make([]string, 400)
	for i := range words {
		words[i] = "w" + string(rune('a'+i%26)) + string(rune('a'+i/26%26))
	}
	return strings.Join(words, " ")
}

// transferPrompt is a completions body of about 400 tokens.
func transferPrompt() string {
	b, _ := json.Marshal(map[string]any{"model": "m", "prompt": transferText(), "max_tokens": 2})
	return string(b)
}

// cachedOf is a completion's usage.prompt_tokens_details.cached_tokens.
func cachedOf(t *testing.T, body string) int {
	t.Helper()
	var r struct {
		Usage struct {
			PromptTokensDetails struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if err := json.Unmarshal([]byte(body), &r); err != nil {
		t.Fatalf("response %s: %v", body, err)
	}
	return r.Usage.PromptTokensDetails.CachedTokens
}

// TestKVTransferOrdered: with --kv-transfer, a decision that orders a
// transfer reaches its replica as kv_transfer_params naming the source:
// the destination emulator fetches the blocks from the source (whose send
// counter moves), reports them cached, and the router says so in the
// header, the decision record and its metrics.
func TestKVTransferOrdered(t *testing.T) {
	src, dst := startEmulator(t), startEmulator(t)
	rt, url := transferRouter(t, true, src.URL(), dst.URL())
	body := transferPrompt()
	if resp, b := do(t, "POST", url+"/v1/completions", body); resp.StatusCode != 200 {
		t.Fatalf("warm: %d %s", resp.StatusCode, b)
	}
	resp, b := do(t, "POST", url+"/v1/completions", body)
	if resp.StatusCode != 200 {
		t.Fatalf("transfer: %d %s", resp.StatusCode, b)
	}
	if got := resp.Header.Get(HeaderReplica); got != dst.URL() {
		t.Fatalf("served by %s, want the destination %s", got, dst.URL())
	}
	const tokens = transferBlocks * 16
	if got := src.Stats().SentBlocks; got != transferBlocks {
		t.Errorf("the source sent %d blocks, want %d", got, transferBlocks)
	}
	if got := dst.Stats().RemoteHits; got != tokens {
		t.Errorf("the destination received %d tokens, want %d", got, tokens)
	}
	if got := cachedOf(t, b); got != tokens {
		t.Errorf("cached_tokens %d, want the %d imported", got, tokens)
	}
	h := resp.Header.Get(HeaderDecision)
	if want := "reason=transfer;"; !strings.Contains(h, want) {
		t.Errorf("%s %q lacks %q", HeaderDecision, h, want)
	}
	if want := "; transfer=from " + src.URL() + " 3.000ms"; !strings.Contains(h, want) {
		t.Errorf("%s %q lacks %q", HeaderDecision, h, want)
	}
	if got := metricValue(t, url, "kvrouter_kv_transfers_total", "from", src.URL(), "to", dst.URL()); got != 1 {
		t.Errorf("kvrouter_kv_transfers_total %v, want 1", got)
	}
	ec, err := engine.Preset(engine.DefaultPreset)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := metricValue(t, url, "kvrouter_kv_transfer_bytes_total", "from", src.URL(), "to", dst.URL()), float64(tokens*ec.KVBytesPerToken); got != want {
		t.Errorf("kvrouter_kv_transfer_bytes_total %v, want %v (%d tokens × %d bytes)", got, want, tokens, ec.KVBytesPerToken)
	}
	d := rt.Decisions(1)[0]
	if d.Transfer != "from "+src.URL() || d.TransferTokens != tokens || d.PredictedTransferMS != 3 {
		t.Errorf("decision record: transfer %q, %d tokens, %v ms; want from %s, %d, 3", d.Transfer, d.TransferTokens, d.PredictedTransferMS, src.URL(), tokens)
	}
}

// TestKVTransferOff: without --kv-transfer the same decision forwards the
// body unchanged: no import, no transfer in the header or the metrics.
func TestKVTransferOff(t *testing.T) {
	src, dst := startEmulator(t), startEmulator(t)
	rt, url := transferRouter(t, false, src.URL(), dst.URL())
	body := transferPrompt()
	do(t, "POST", url+"/v1/completions", body)
	resp, b := do(t, "POST", url+"/v1/completions", body)
	if resp.StatusCode != 200 || resp.Header.Get(HeaderReplica) != dst.URL() {
		t.Fatalf("status %d from %s: %s", resp.StatusCode, resp.Header.Get(HeaderReplica), b)
	}
	if got := src.Stats().SentBlocks; got != 0 {
		t.Errorf("the source sent %d blocks with transfers off", got)
	}
	if h := resp.Header.Get(HeaderDecision); strings.Contains(h, "transfer=") {
		t.Errorf("%s %q names a transfer", HeaderDecision, h)
	}
	if got := metricValue(t, url, "kvrouter_kv_transfers_total"); got != 0 {
		t.Errorf("kvrouter_kv_transfers_total %v with transfers off", got)
	}
	if d := rt.Decisions(1)[0]; d.Transfer != "" {
		t.Errorf("decision record names a transfer: %q", d.Transfer)
	}
}

// TestKVTransferRetryDropsParams: the replica a transfer was ordered for
// fails (500); the retry on another replica carries no kv_transfer_params
// even though the new decision orders one too, as its source was picked
// for the replica that failed.
func TestKVTransferRetryDropsParams(t *testing.T) {
	src, dst := startEmulator(t), startEmulator(t)
	bad := newFake(t, http.StatusInternalServerError)
	_, url := transferRouter(t, true, src.URL(), bad.URL, dst.URL())
	body := transferPrompt()
	do(t, "POST", url+"/v1/completions", body)
	resp, b := do(t, "POST", url+"/v1/completions", body)
	if resp.StatusCode != 200 || resp.Header.Get(HeaderReplica) != dst.URL() {
		t.Fatalf("status %d from %s, want 200 from the retry on %s: %s", resp.StatusCode, resp.Header.Get(HeaderReplica), dst.URL(), b)
	}
	got := bad.received()
	if len(got) != 1 || !strings.Contains(string(got[0]), `"kv_transfer_params":{"do_remote_prefill":true`) {
		t.Fatalf("the failing replica got %q, want one body with kv_transfer_params", got)
	}
	var sent map[string]json.RawMessage
	if err := json.Unmarshal(got[0], &sent); err != nil {
		t.Fatalf("the forwarded body is not JSON: %v", err)
	}
	if src.Stats().SentBlocks != 0 || dst.Stats().RemoteHits != 0 {
		t.Errorf("the retry imported: source sent %d blocks, destination received %d tokens", src.Stats().SentBlocks, dst.Stats().RemoteHits)
	}
	if h := resp.Header.Get(HeaderDecision); strings.Contains(h, "transfer=") || !strings.Contains(h, "retried=1") {
		t.Errorf("%s %q: want a retry and no transfer", HeaderDecision, h)
	}
	if n := metricValue(t, url, "kvrouter_kv_transfers_total", "to", dst.URL()); n != 0 {
		t.Errorf("%v transfers counted to the retry's replica", n)
	}
	if n := metricValue(t, url, "kvrouter_kv_transfers_total", "to", bad.URL); n != 1 {
		t.Errorf("%v transfers counted to the failed replica, want 1", n)
	}
}

// TestKVTransferContinuationDropsParams: the replica a transfer was
// ordered for imports the blocks, then its stream is cut after a few
// tokens; the continuation on another replica carries no
// kv_transfer_params, so the source sends the blocks once.
func TestKVTransferContinuationDropsParams(t *testing.T) {
	src, mid, dst := startEmulator(t), startEmulator(t), startEmulator(t)
	f := &faulty{h: mid.Handler(), after: 3}
	cut := httptest.NewServer(f)
	t.Cleanup(cut.Close)
	_, url := transferRouter(t, true, src.URL(), cut.URL, dst.URL())
	chat := func(stream bool) string {
		b, _ := json.Marshal(map[string]any{"model": "m", "stream": stream, "max_tokens": 8,
			"messages": []map[string]string{{"role": "user", "content": transferText()}}})
		return string(b)
	}
	do(t, "POST", url+"/v1/chat/completions", chat(false))
	_, events := replyEvents(t, url, chat(true))
	if got := readReply(t, events); !got.Done || got.ErrCode != "" {
		t.Fatalf("reply %+v, want a whole stream", got)
	}
	if f.hits.Load() != 1 {
		t.Fatalf("%d requests reached the cut replica, want 1", f.hits.Load())
	}
	if got := mid.Stats().RemoteHits; got != transferBlocks*16 {
		t.Errorf("the cut replica received %d tokens, want %d", got, transferBlocks*16)
	}
	if got := dst.Stats().RemoteHits; got != 0 {
		t.Errorf("the continuation imported %d tokens: it carried the params", got)
	}
	if got := src.Stats().SentBlocks; got != transferBlocks {
		t.Errorf("the source sent %d blocks, want %d (once)", got, transferBlocks)
	}
	if got := metricValue(t, url, "kvrouter_stream_failures_total", "result", midContinued); got != 1 {
		t.Errorf("kvrouter_stream_failures_total{result=continued} = %v, want 1", got)
	}
}

// TestKVAwareOrdersTransfer: the default policy, with --kv-transfer and a
// 5 GB/s link (where importing a 4,000-word prompt's KV beats computing
// it), sends a repeat of a prompt whose holder has a long queue to the
// idle replica with an import from the holder: the
// forwarded body names the source, the destination fetches the blocks and
// reports them cached, and the first token comes when the router
// predicted it, within 30%.
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
	cfg.Listen, cfg.KVTransfer, cfg.InterconnectGBps, cfg.TimeScale = "127.0.0.1:0", true, gbps, scale
	cfg.Backends = []Backend{{URL: a.URL()}, {URL: b.URL()}}
	rt, err := New(cfg, Deps{Registry: prometheus.NewRegistry(), Logger: testLogger(t)})
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
	// Give the holder a queue the router did not place (another client's
	// long prompts, straight to the engine): its scraped Waiting.
	var streams sync.WaitGroup
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); streams.Wait() })
	for i := range 24 {
		other := make([]string, 2000)
		for k := range other {
			other[k] = fmt.Sprintf("q%d-%d", i, k)
		}
		b, _ := json.Marshal(map[string]any{"model": "m", "prompt": strings.Join(other, " "), "max_tokens": 4})
		req, _ := http.NewRequestWithContext(ctx, "POST", holder+"/v1/completions", strings.NewReader(string(b)))
		streams.Go(func() {
			if resp, err := http.DefaultClient.Do(req); err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
	wait.For(t, "the holder's queue in its metrics", func() bool {
		for _, r := range rt.st.fleet.View(time.Now()).Replicas {
			if r.ID == holder && r.Waiting >= 8 {
				return true
			}
		}
		return false
	})

	resp, out := do(t, "POST", srv.URL+"/v1/completions", string(body))
	if got := resp.Header.Get(HeaderReplica); got != other.URL() {
		t.Fatalf("repeat served by %s (%s), want the idle replica with a transfer", got, resp.Header.Get(HeaderDecision))
	}
	if d := resp.Header.Get(HeaderDecision); !strings.Contains(d, "reason=transfer") || !strings.Contains(d, "transfer=from "+holder) {
		t.Fatalf("decision %q, want a transfer from %s", d, holder)
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
	if rec.Reason != route.ReasonTransfer || rec.PredictedTTFTMS <= 0 {
		t.Fatalf("record %+v, want the transfer with its predicted TTFT", rec)
	}
	if rec.ActualCached < rec.PromptTokens*9/10 {
		t.Errorf("the destination reported %d of %d prompt tokens cached, want the imported prefix", rec.ActualCached, rec.PromptTokens)
	}
	ratio := rec.TTFTMS / rec.PredictedTTFTMS
	t.Logf("TTFT %.1f ms, predicted %.1f ms (import %.1f ms): %.2f×", rec.TTFTMS, rec.PredictedTTFTMS, rec.PredictedTransferMS, ratio)
	if raceEnabled {
		return // the race detector slows the HTTP hops several times over; the time is checked without it
	}
	if ratio < 0.7 || ratio > 1.3 {
		t.Errorf("TTFT %.1f ms against %.1f ms predicted (%.2f×), want within 30%% (import predicted %.1f ms)",
			rec.TTFTMS, rec.PredictedTTFTMS, ratio, rec.PredictedTransferMS)
	}
}
