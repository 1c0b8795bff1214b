package sse

import (
	"bytes"
	"testing"
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
