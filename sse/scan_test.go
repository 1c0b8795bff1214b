package sse

import (
	"bytes"
	"testing"
)

// FuzzScan: one pass over an event (scan, and NextEventEnd, Data,
// finished, StringField and HasValue built on the same steps) finds what
// the byte searches it replaced found, one search per field: the
// reference implementations below, kept as they were.
func FuzzScan(f *testing.F) {
	for _, s := range []string{
		"data: {\"id\":\"a\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"},\"logprobs\":null,\"finish_reason\":null}],\"usage\":null}\n\n",
		"data: {\"choices\":[{\"delta\":{\"reasoning_content\":\"x\",\"tool_calls\":[ ]}}]}\r\n\r\n",
		"data: {\"choices\":[{\"text\":\"a\\\"b\",\"finish_reason\":\"stop\"}]}\n\n",
		"data:  {\"choices\":[],\"usage\":{\"prompt_tokens\":5}} \t\n\n",
		"event: x\n\"finish_reason\"finish_reason\": \"s\"\ndata: {\"reasoning\" : [1], \"content\":null, \"content\" : \"y\"}\n\n",
		": keep-alive\n\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, ev []byte) {
		if got, want := NextEventEnd(ev), refNextEventEnd(ev); got != want {
			t.Fatalf("NextEventEnd(%q) = %d, want %d", ev, got, want)
		}
		ds, de := refDataSpan(ev)
		fs := scan(ev)
		if fs.ds != ds || fs.de != de {
			t.Fatalf("data span of %q: %d:%d, want %d:%d", ev, fs.ds, fs.de, ds, de)
		}
		data := ev[ds:de]
		if got, want := fs.finished, refFinished(ev); got != want || finished(ev) != want {
			t.Errorf("finished(%q) = %v (scan), %v; want %v", ev, got, finished(ev), want)
		}
		if got, want := fs.usage, bytes.Contains(ev, promptTokensKey); got != want {
			t.Errorf("usage of %q = %v, want %v", ev, got, want)
		}
		reasoning := refHasValue(data, reasoningKey) || refHasValue(data, reasonKey)
		if fs.reasoning != reasoning || fs.toolCalls != refHasValue(data, toolCallsKey) {
			t.Errorf("%q: reasoning %v, tool calls %v; want %v, %v", ev, fs.reasoning, fs.toolCalls, reasoning, refHasValue(data, toolCallsKey))
		}
		for _, k := range []struct {
			key []byte
			q   int
			has bool
		}{{contentKey, fs.content, fs.hasContent}, {textKey, fs.text, fs.hasText}} {
			want, wantOK := refStringField([]byte("pre:"), data, k.key)
			got, ok := []byte("pre:"), false
			if k.q >= 0 {
				got, ok = appendUnquoted(got, ev[k.q+1:de])
			}
			if ok != wantOK || !bytes.Equal(got, want) || k.has != bytes.Contains(data, k.key) {
				t.Errorf("%s in %q: %q %v (has %v), want %q %v", k.key, ev, got, ok, k.has, want, wantOK)
			}
			if got, ok := StringField([]byte("pre:"), data, k.key); ok != wantOK || !bytes.Equal(got, want) {
				t.Errorf("StringField(%q, %s) = %q %v, want %q %v", data, k.key, got, ok, want, wantOK)
			}
			if got, want := HasValue(data, k.key), refHasValue(data, k.key); got != want {
				t.Errorf("HasValue(%q, %s) = %v, want %v", data, k.key, got, want)
			}
		}
		if got, want := fs.emptyChoices, bytes.Contains(data, emptyChoices); got != want {
			t.Errorf("empty choices in %q: %v, want %v", ev, got, want)
		}
	})
}

// The searches scan replaced, one per field, as they were.

func refNextEventEnd(b []byte) int {
	i, j := bytes.Index(b, EventEnd), bytes.Index(b, []byte("\n\r\n"))
	switch {
	case i < 0 && j < 0:
		return -1
	case j < 0 || i >= 0 && i < j:
		return i + 2
	}
	return j + 3
}
func refDataSpan(ev []byte) (start, end int) {
	for off := 0; off < len(ev); {
		line, next := ev[off:], len(ev)
		if i := bytes.IndexByte(line, '\n'); i >= 0 {
			line, next = line[:i], off+i+1
		}
		if d, ok := bytes.CutPrefix(line, []byte("data:")); ok {
			t := bytes.TrimLeft(d, " \t\r")
			start = off + len(line) - len(t)
			return start, start + len(bytes.TrimRight(t, " \t\r"))
		}
		off = next
	}
	return 0, 0
}
func refFinished(ev []byte) bool {
	for {
		i := bytes.Index(ev, finishReasonKey)
		if i < 0 {
			return false
		}
		ev = ev[i+len(finishReasonKey):]
		j := 0
		for j < len(ev) && (ev[j] == ' ' || ev[j] == ':' || ev[j] == '\t') {
			j++
		}
		if j < len(ev) && ev[j] == '"' {
			return true
		}
	}
}
func refStringField(dst, data, key []byte) (out []byte, ok bool) {
	for off := 0; ; {
		i := bytes.Index(data[off:], key)
		if i < 0 {
			return dst, false
		}
		j := skipSpace(data, off+i+len(key))
		off = j
		if j >= len(data) || data[j] != ':' {
			continue
		}
		j = skipSpace(data, j+1)
		if j >= len(data) || data[j] != '"' {
			continue
		}
		return appendUnquoted(dst, data[j+1:])
	}
}
func refHasValue(data, key []byte) bool {
	for off := 0; ; {
		i := bytes.Index(data[off:], key)
		if i < 0 {
			return false
		}
		j := skipSpace(data, off+i+len(key))
		off = j
		if j >= len(data) || data[j] != ':' {
			continue
		}
		v := data[skipSpace(data, j+1):]
		for _, empty := range [...]string{"null", "false", `""`, "[]"} {
			if bytes.HasPrefix(v, []byte(empty)) {
				v = nil
				break
			}
		}
		if len(v) > 0 && v[0] != '}' && v[0] != ',' {
			if v[0] == '[' && bytes.HasPrefix(bytes.TrimLeft(v[1:], " \t\r\n"), []byte("]")) {
				continue
			}
			return true
		}
	}
}

// BenchmarkScan reads one chunk as vLLM streams it (a token's content,
// "usage": null):
//
//	go test -run='^$' -bench=Scan -benchmem ./sse
func BenchmarkScan(b *testing.B) {
	ev := []byte(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1700000000,"model":"m","choices":[{"index":0,"delta":{"content":" tok5"},"logprobs":null,"finish_reason":null}],"usage":null}` + "\n\n")
	b.SetBytes(int64(len(ev)))
	for b.Loop() {
		if f := scan(ev); f.content < 0 || f.finished {
			b.Fatal("misread")
		}
	}
}
