package sse

import (
	"bytes"
	"fmt"
	"io"
	"testing"
	"testing/iotest"
)

// FuzzSplice: whatever a replica sends, a Splice never panics; before a
// continuation it passes every byte on unchanged, but for an error event
// before the first token (Failed), and what a continuation passes on
// ends in whole events.
func FuzzSplice(f *testing.F) {
	for _, s := range []string{
		"data: {\"id\":\"a\",\"created\":1,\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"}}]}\n\n" +
			"data: {\"id\":\"a\",\"created\":1,\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n" +
			"data: {\"id\":\"a\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n",
		"data: {\"error\":{\"message\":\"x\"}}\n\n",
		": keep-alive\r\n\r\ndata: {\"choices\":[{\"text\":\"\\u00e9\\ud83d\\ude00\"}],\"usage\":{\"prompt_tokens\":3}}\n\n",
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":1}}\n\n",
	} {
		f.Add([]byte(s), true, 7)
		f.Add([]byte(s), false, 1)
	}
	f.Fuzz(func(t *testing.T, in []byte, chat bool, split int) {
		split = min(max(split, 0), len(in))
		s := Splice{Chat: chat}
		rest := s.Frame(append([]byte(nil), in[:split]...))
		rest = s.Frame(append(rest, in[split:]...))
		if !s.Failed && !bytes.Equal(append(s.Out, rest...), in) {
			t.Fatalf("passed on %q + %q, want the input %q", s.Out, rest, in)
		}
		s.Out = s.Out[:0]
		s.Continue()
		rest = s.Frame(append([]byte(nil), in...))
		if len(s.Out) > 0 && NextEventEnd(s.Out) < 0 {
			t.Fatalf("a continuation passed on %q, no whole event", s.Out)
		}
		if len(rest) > 0 && NextEventEnd(rest) >= 0 {
			t.Fatalf("left %q, a whole event", rest)
		}
	})
}

// FuzzSpliceTap: a Tap shown the events as they join a Splice's output
// (Splice.Tap, Tap.Framed) hands the client the same bytes and finds the
// same usage, end and cut as a Tap that frames and reads the Splice's
// output again.
func FuzzSpliceTap(f *testing.F) {
	for _, s := range []string{
		"data: {\"id\":\"a\",\"created\":1,\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"}}],\"usage\":null}\n\n" +
			"data: {\"id\":\"a\",\"created\":1,\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}],\"usage\":null}\n\n" +
			"data: {\"id\":\"a\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":null}\n\n" +
			"data: {\"id\":\"a\",\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":1}}\n\ndata: [DONE]\n\n",
		chunk1 + chunk2 + usageOnly + done,
		chunk1 + "data: {\"error\":{\"message\":\"x\"}}\n\n",
		": keep-alive\r\n\r\ndata: {\"choices\":[{\"text\":\"\\u00e9\"}],\"usage\":{\"prompt_tokens\":3}}\n\n",
	} {
		f.Add([]byte(s), true, true, 7)
		f.Add([]byte(s), false, false, 100)
	}
	f.Fuzz(func(t *testing.T, in []byte, chat, strip bool, split int) {
		split = min(max(split, 0), len(in))
		// The reference: the Splice's output framed and read again.
		ref := Splice{Chat: chat}
		rest := ref.Frame(append([]byte(nil), in[:split]...))
		ref.Frame(append(rest, in[split:]...))
		want := &Tap{Body: io.NopCloser(iotest.HalfReader(bytes.NewReader(ref.Out))), SSE: true, Strip: strip}
		wantOut, err := io.ReadAll(want)
		if err != nil {
			t.Fatal(err)
		}
		got := &Tap{SSE: true, Strip: strip, Framed: true}
		s := Splice{Chat: chat, Tap: got}
		rest = s.Frame(append([]byte(nil), in[:split]...))
		s.Frame(append(rest, in[split:]...))
		got.Body = io.NopCloser(iotest.HalfReader(bytes.NewReader(s.Out)))
		gotOut, err := io.ReadAll(got)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(gotOut, wantOut) {
			t.Fatalf("framed tap handed out %q, want %q", gotOut, wantOut)
		}
		type found struct {
			Usage                          string
			HasUsage                       bool
			Model, ResponseID              string
			Stripped, Ended, Cut, ErrEvent bool
			CutCode                        string
		}
		of := func(tp *Tap) found {
			return found{fmt.Sprint(tp.Usage.PromptTokens, tp.Usage.Completion(), tp.Usage.Cached()), tp.HasUsage, tp.Model, tp.ResponseID,
				tp.Stripped, tp.Ended, tp.Cut, tp.ErrEvent, tp.CutCode}
		}
		if g, w := of(got), of(want); g != w {
			t.Fatalf("framed tap found %+v, want %+v", g, w)
		}
	})
}
