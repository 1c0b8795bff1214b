package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/kvrouter/kvrouter/emulator"
	"github.com/kvrouter/kvrouter/internal/otlptest"
)

// lockedBuffer is a log sink the router's goroutines write while the
// test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// served is a run of serveTo: its log, and what it returned.
type served struct {
	log  *lockedBuffer
	done chan error
	stop context.CancelFunc
}

// startServe runs serveTo with args (plus a loopback listen address and
// no admin surface) in front of one emulated engine, and returns once it
// logged its startup line, with the address it listens on, found by
// match in that line.
func startServe(t *testing.T, match func(line string) (addr string, ok bool), args ...string) (*served, string) {
	t.Helper()
	eng, err := emulator.Start(emulator.Config{Model: "m", Preset: "llama3-8b-h100", TimeScale: 0.01}, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	s := &served{log: &lockedBuffer{}, done: make(chan error, 1), stop: cancel}
	args = append([]string{"--backend", eng.URL(), "--listen", "127.0.0.1:0", "--admin-listen", "", "--drain-timeout", "2s"}, args...)
	go func() { s.done <- serveTo(ctx, args, func(string) string { return "" }, s.log) }()
	t.Cleanup(func() {
		cancel()
		<-s.done
	})
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		for line := range strings.SplitSeq(s.log.String(), "\n") {
			if addr, ok := match(line); ok {
				return s, addr
			}
		}
		select {
		case err := <-s.done:
			t.Fatalf("serve returned %v before its startup line:\n%s", err, s.log.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	t.Fatalf("no startup line within 10s:\n%s", s.log.String())
	return nil, ""
}

// chat sends one chat completion to the router at addr.
func chat(t *testing.T, addr string) {
	t.Helper()
	resp, err := http.Post("http://"+addr+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"m","max_tokens":3,"messages":[{"role":"user","content":"hello there"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("chat: %d %s", resp.StatusCode, b)
	}
}

// stopServe cancels the run (as a signal would) and waits for it.
func (s *served) wait(t *testing.T) {
	t.Helper()
	s.stop()
	select {
	case err := <-s.done:
		s.done <- err // for the cleanup
		if err != nil {
			t.Fatalf("serve: %v\n%s", err, s.log.String())
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("serve did not stop within 15s:\n%s", s.log.String())
	}
}

// TestServeJSONLogAndTraces runs kvrouter serve with --log-format json
// and --otlp-endpoint pointing at a real OTLP/HTTP receiver: every line
// of its log parses as JSON, the startup line, the request's access line,
// the stopping line and the stopped line come in that order (stopped
// last), and the request's spans reached the receiver by the time serve
// returned: the exit flushed them (the batch would otherwise wait 5 s).
func TestServeJSONLogAndTraces(t *testing.T) {
	recv := otlptest.Start(t)
	start := time.Now()
	s, addr := startServe(t, func(line string) (string, bool) {
		var m struct{ Msg, Listen, Traces string }
		if json.Unmarshal([]byte(line), &m) != nil || m.Msg != "kvrouter serving" {
			return "", false
		}
		if m.Traces != recv.URL+"/v1/traces" {
			t.Errorf("startup line: traces %q, want %s/v1/traces", m.Traces, recv.URL)
		}
		var all map[string]any
		json.Unmarshal([]byte(line), &all)
		if all["drain_timeout"] != "2s" {
			t.Errorf("startup line: drain_timeout %v, want \"2s\" (durations as text)", all["drain_timeout"])
		}
		return m.Listen, true
	}, "--log-format", "json", "--otlp-endpoint", recv.URL)
	chat(t, addr)
	s.wait(t)
	spans, _ := recv.Spans()
	if took := time.Since(start); took > 4*time.Second {
		t.Logf("the run took %v: the batch timer may have exported the spans before the flush", took)
	}
	kinds := map[tracepb.Span_SpanKind]int{}
	for _, sp := range spans {
		kinds[sp.GetKind()]++
	}
	if kinds[tracepb.Span_SPAN_KIND_SERVER] != 1 || kinds[tracepb.Span_SPAN_KIND_CLIENT] != 1 {
		t.Errorf("spans at exit: %v, want one server and one client span", kinds)
	}

	var msgs []string
	for i, line := range strings.Split(strings.TrimSuffix(s.log.String(), "\n"), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %d is not JSON: %v: %q", i+1, err, line)
		}
		msg, _ := m["msg"].(string)
		msgs = append(msgs, msg)
		if msg == "request" && (m["path"] != "/v1/chat/completions" || m["status"] != float64(200) || m["model"] != "m" || m["trace_id"] == nil) {
			t.Errorf("access line %q: want path, status 200, model m and a trace id", line)
		}
	}
	wantOrder(t, msgs, "kvrouter serving", "request", "kvrouter stopping", "kvrouter stopped")
}

// TestServeTextLog: the same lines in the default text format.
func TestServeTextLog(t *testing.T) {
	s, addr := startServe(t, func(line string) (string, bool) {
		if !strings.Contains(line, `msg="kvrouter serving"`) {
			return "", false
		}
		_, rest, _ := strings.Cut(line, " listen=")
		addr, _, _ := strings.Cut(rest, " ")
		return addr, addr != ""
	})
	chat(t, addr)
	s.wait(t)
	var msgs []string
	for line := range strings.SplitSeq(strings.TrimSuffix(s.log.String(), "\n"), "\n") {
		if !strings.HasPrefix(line, "time=") {
			t.Errorf("not a text line: %q", line)
		}
		_, rest, _ := strings.Cut(line, " msg=")
		if strings.HasPrefix(rest, `"`) {
			rest, _, _ = strings.Cut(rest[1:], `"`)
		} else {
			rest, _, _ = strings.Cut(rest, " ")
		}
		msgs = append(msgs, rest)
	}
	wantOrder(t, msgs, "kvrouter serving", "request", "kvrouter stopping", "kvrouter stopped")
}

// wantOrder checks that want appear in msgs in that order, the last one
// last.
func wantOrder(t *testing.T, msgs []string, want ...string) {
	t.Helper()
	i := 0
	for _, m := range msgs {
		if i < len(want) && m == want[i] {
			i++
		}
	}
	if i < len(want) || msgs[len(msgs)-1] != want[len(want)-1] {
		t.Errorf("log messages %q: want %q in that order, %q last", msgs, want, want[len(want)-1])
	}
}

// TestLogFormatConfig: --log-format and --otlp-endpoint from flags and
// KVROUTER_* variables, and their errors.
func TestLogFormatConfig(t *testing.T) {
	env := map[string]string{"KVROUTER_LOG_FORMAT": "json", "KVROUTER_OTLP_ENDPOINT": "http://collector:4318"}
	cfg, err := loadServeConfig([]string{"--backend", "http://a:1"}, func(k string) string { return env[k] }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.LogFormat != "json" || cfg.OTLPEndpoint != "http://collector:4318" {
		t.Errorf("from the environment: log-format %q otlp-endpoint %q", cfg.LogFormat, cfg.OTLPEndpoint)
	}
	cfg, err = loadServeConfig([]string{"--backend", "http://a:1", "--log-format", "text"}, func(k string) string { return env[k] }, io.Discard)
	if err != nil || cfg.LogFormat != "text" {
		t.Errorf("flag over environment: log-format %q, %v; want text", cfg.LogFormat, err)
	}
	for _, tc := range []struct{ args []string }{
		{[]string{"--log-format", "xml"}},
		{[]string{"--otlp-endpoint", "collector:4318"}},
	} {
		_, err := loadServeConfig(append(tc.args, "--backend", "http://a:1"), func(string) string { return "" }, io.Discard)
		if err == nil || !strings.Contains(err.Error(), strings.TrimPrefix(tc.args[0], "--")) {
			t.Errorf("%v: got %v, want an error naming %s", tc.args, err, tc.args[0])
		}
	}
}

// TestEngineLogFormat: kvrouter engine --log-format picks the handler,
// and refuses other values.
func TestEngineLogFormat(t *testing.T) {
	for format, want := range map[string]string{"json": "*slog.JSONHandler", "text": "*slog.TextHandler"} {
		cfg, _, err := engineFlags([]string{"--log-format", format})
		if err != nil {
			t.Fatal(err)
		}
		if got := fmt.Sprintf("%T", cfg.Logger.Handler()); got != want {
			t.Errorf("--log-format %s: handler %s, want %s", format, got, want)
		}
	}
	if _, _, err := engineFlags([]string{"--log-format", "xml"}); err == nil || !strings.Contains(err.Error(), "log-format") {
		t.Errorf("--log-format xml: got %v, want an error naming log-format", err)
	}
}
