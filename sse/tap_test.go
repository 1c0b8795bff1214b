package sse

import (
	"bytes"
	"io"
	"slices"
	"strings"
	"testing"
	"testing/iotest"
	"time"
)

const (
	chunk1    = "data: {\"id\":\"c\",\"choices\":[{\"delta\":{\"content\":\"Hi\"}}],\"usage\":null}\n\n"
	chunk2    = "data: {\"id\":\"c\",\"choices\":[{\"delta\":{\"content\":\" there\"}}],\"usage\":null}\n\n"
	usageOnly = "data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":100,\"completion_tokens\":2,\"prompt_tokens_details\":{\"cached_tokens\":64}}}\n\n"
	done      = "data: [DONE]\n\n"
	// chunk1 and chunk2 as the engine sends them without include_usage.
	bare1 = "data: {\"id\":\"c\",\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n"
	bare2 = "data: {\"id\":\"c\",\"choices\":[{\"delta\":{\"content\":\" there\"}}]}\n\n"
	// finish ends a choice.
	finish = "data: {\"id\":\"c\",\"choices\":[{\"delta\":{},\"finish_reason\": \"stop\"}]}\n\n"
	// cut is the event that ends a stream the replica cut.
	cut = "data: {\"error\":{\"message\":\"the replica ended the stream before it finished\",\"type\":\"upstream_error\",\"param\":null,\"code\":\"upstream_stream_cut\"}}\n\n"
)

func TestTap(t *testing.T) {
	tests := []struct {
		name       string
		in         string
		sse, strip bool
		want       string
		cached     int
		prompt     int
		completion int
	}{
		{"sse keeps usage when not stripping", chunk1 + chunk2 + usageOnly + done, true, false, chunk1 + chunk2 + usageOnly + done, 64, 100, 2},
		{"sse strips usage-only chunk and null usage", chunk1 + chunk2 + usageOnly + done, true, true, bare1 + bare2 + done, 64, 100, 2},
		{"sse without usage", chunk1 + done, true, true, bare1 + done, -1, -1, -1},
		{"null usage with spaces", "data: {\"a\": 1, \"usage\" : null }\r\n\r\n" + done, true, true, "data: {\"a\": 1 }\r\n\r\n" + done, -1, -1, -1},
		{"null usage only as the last member", "data: {\"usage\":null,\"a\":1}\n\n" + "data: {\"a\":\"x,\\\"usage\\\":null\"}\n\n" + done, true, true,
			"data: {\"usage\":null,\"a\":1}\n\n" + "data: {\"a\":\"x,\\\"usage\\\":null\"}\n\n" + done, -1, -1, -1},
		{"cut after a partial event", chunk1 + "data: {\"x\"", true, true, bare1 + "data: {\"x\"\n\n" + cut, -1, -1, -1},
		{"cut before done", chunk1 + chunk2, true, false, chunk1 + chunk2 + cut, -1, -1, -1},
		{"cut before the usage chunk", chunk1, true, true, bare1 + cut, -1, -1, -1},
		{"finish reason ends it without done", bare1 + finish, true, false, bare1 + finish, -1, -1, -1},
		{"null finish reason does not", "data: {\"choices\":[{\"finish_reason\":null}]}\n\n", true, false,
			"data: {\"choices\":[{\"finish_reason\":null}]}\n\n" + cut, -1, -1, -1},
		{"crlf events", "data: {\"a\":1}\r\n\r\ndata: [DONE]\r\n\r\n", true, false, "data: {\"a\":1}\r\n\r\ndata: [DONE]\r\n\r\n", -1, -1, -1},
		{"json body", `{"choices":[{"message":{"content":"x"}}],"usage":{"prompt_tokens":7,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":3}}}`, false, false,
			`{"choices":[{"message":{"content":"x"}}],"usage":{"prompt_tokens":7,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":3}}}`, 3, 7, 1},
		{"json without details", `{"usage":{"prompt_tokens":7}}`, false, false, `{"usage":{"prompt_tokens":7}}`, -1, 7, -1},
	}
	readers := map[string]func(string) io.Reader{
		"whole":   func(s string) io.Reader { return strings.NewReader(s) },
		"onebyte": func(s string) io.Reader { return iotest.OneByteReader(strings.NewReader(s)) },
		"half":    func(s string) io.Reader { return iotest.HalfReader(strings.NewReader(s)) },
	}
	for _, tc := range tests {
		for rname, mk := range readers {
			t.Run(tc.name+"/"+rname, func(t *testing.T) {
				tp := &Tap{Body: io.NopCloser(mk(tc.in)), SSE: tc.sse, Strip: tc.strip}
				got, err := io.ReadAll(tp)
				if err != nil {
					t.Fatal(err)
				}
				if string(got) != tc.want {
					t.Errorf("got %q, want %q", got, tc.want)
				}
				cached, prompt, completion := -1, -1, -1
				if tp.HasUsage {
					cached, prompt, completion = tp.Usage.Cached(), tp.Usage.PromptTokens, tp.Usage.Completion()
				}
				if cached != tc.cached || prompt != tc.prompt {
					t.Errorf("got cached %d prompt %d, want %d %d", cached, prompt, tc.cached, tc.prompt)
				}
				if completion != tc.completion {
					t.Errorf("got completion tokens %d, want %d", completion, tc.completion)
				}
				if tp.First.IsZero() {
					t.Error("first byte time not recorded")
				}
				if wantCut := tc.sse && strings.HasSuffix(tc.want, cut); tp.Cut != wantCut || tc.sse && tp.Ended == wantCut {
					t.Errorf("cut %v ended %v, want cut %v", tp.Cut, tp.Ended, wantCut)
				}
			})
		}
	}
}

// TestTapEventPerRead checks that SSE comes out in whole events, in the
// batches the upstream's reads returned them in: one Read per upstream
// read (so ReverseProxy makes one write and one flush of it), never a
// partial event.
func TestTapEventPerRead(t *testing.T) {
	// The upstream's reads return chunk1 and chunk2 together, then half
	// of the [DONE] event, then its rest.
	reads := []string{chunk1 + chunk2, done[:5], done[5:]}
	tp := &Tap{Body: io.NopCloser(&batches{reads: reads}), SSE: true}
	buf := make([]byte, 64<<10)
	var got []string
	for {
		n, err := tp.Read(buf)
		if n > 0 {
			got = append(got, string(buf[:n]))
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if want := []string{chunk1 + chunk2, done}; !slices.Equal(got, want) {
		t.Fatalf("reads %q, want %q", got, want)
	}
}

// batches is a reader whose Reads return reads one by one.
type batches struct{ reads []string }

func (b *batches) Read(p []byte) (int, error) {
	if len(b.reads) == 0 {
		return 0, io.EOF
	}
	n := copy(p, b.reads[0])
	if b.reads[0] = b.reads[0][n:]; b.reads[0] == "" {
		b.reads = b.reads[1:]
	}
	return n, nil
}

// FuzzTap: whatever the upstream sends, the tap never panics, hands out
// every byte unchanged when not stripping, and when stripping only removes
// bytes (a usage-only event, a trailing "usage": null member); a stream
// that did not deliver its end is closed and followed by the cut event.
func FuzzTap(f *testing.F) {
	for _, s := range []string{chunk1 + chunk2 + usageOnly + done, "data: {\"a\": 1, \"usage\" : null }\r\n\r\n", "data:\n\n", ",\"usage\":null}\n\n", "data: }\n\n"} {
		f.Add([]byte(s), true)
		f.Add([]byte(s), false)
	}
	f.Fuzz(func(t *testing.T, in []byte, strip bool) {
		tp := &Tap{Body: io.NopCloser(iotest.HalfReader(bytes.NewReader(in))), SSE: true, Strip: strip}
		out, err := io.ReadAll(tp)
		if err != nil {
			t.Fatal(err)
		}
		if tp.Cut == tp.Ended {
			t.Fatalf("cut %v, ended %v: exactly one must hold at EOF", tp.Cut, tp.Ended)
		}
		if tp.Cut {
			var ok bool
			if out, ok = bytes.CutSuffix(out, []byte(cut)); !ok {
				t.Fatalf("cut stream %q does not end with the cut event", out)
			}
			// The tap may have closed a partial last event.
			in = append(in[:len(in):len(in)], EventEnd...)
			if !strip && bytes.Equal(out, in[:len(in)-2]) {
				out = append(out, EventEnd...)
			}
		}
		if !strip && !bytes.Equal(out, in) {
			t.Fatalf("not stripping: got %q, want the input %q", out, in)
		}
		// out is in with some bytes removed: a subsequence.
		i := 0
		for _, b := range out {
			for i < len(in) && in[i] != b {
				i++
			}
			if i == len(in) {
				t.Fatalf("got %q, not a subsequence of %q", out, in)
			}
			i++
		}
	})
}

// TestTapTokens: the Tap tells OnToken of each event after the first that
// carries output, one token each (the first is the first token, told by
// OnFirst), at its clock's time; the usage-only, finish and [DONE]
// events carry none.
func TestTapTokens(t *testing.T) {
	third := "data: {\"id\":\"c\",\"choices\":[{\"delta\":{\"reasoning_content\":\"hm\"}}],\"usage\":null}\n\n"
	in := chunk1 + chunk2 + third + finish + usageOnly + done
	var at []int
	clock := 0
	tap := &Tap{Body: io.NopCloser(iotest.OneByteReader(strings.NewReader(in))), SSE: true,
		Now:     func() time.Time { clock++; return time.Unix(int64(clock), 0) },
		OnToken: func(now time.Time) { at = append(at, int(now.Unix())) }}
	if _, err := io.ReadAll(tap); err != nil {
		t.Fatal(err)
	}
	// The clock is read at the first byte (1), then at chunk2 (2) and third (3).
	if !slices.Equal(at, []int{2, 3}) || tap.Outputs != 3 {
		t.Errorf("OnToken told at %v of %d output events, want [2 3] of 3", at, tap.Outputs)
	}
}
