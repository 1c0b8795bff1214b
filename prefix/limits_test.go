package prefix

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// repeated returns head, n copies of elem separated by commas, then tail.
func repeated(head, elem, tail string, n int) []byte {
	var b bytes.Buffer
	b.Grow(len(head) + n*(len(elem)+1) + len(tail))
	b.WriteString(head)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(elem)
	}
	b.WriteString(tail)
	return b.Bytes()
}

// nested returns a chat body whose message carries an extra field nested
// depth arrays deep (the body itself then reaches depth+3).
func nested(depth int) []byte {
	return []byte(`{"model":"m","messages":[{"role":"user","content":"x","extra":` +
		strings.Repeat("[", depth) + strings.Repeat("]", depth) + `}]}`)
}

func TestLimits(t *testing.T) {
	small := Limits{Messages: 3, Parts: 4, Depth: 6, Tools: 2, Prompts: 2}
	const chat = `{"model":"m","messages":[`
	tests := []struct {
		name string
		body []byte
		want error // nil: parses
	}{
		{"messages at limit", repeated(chat, `{}`, `]}`, 3), nil},
		{"messages past limit", repeated(chat, `{}`, `]}`, 4), ErrTooManyMessages},
		{"parts at limit", repeated(chat+`{"content":[`, `{"type":"text","text":"a"}`, `]}]}`, 4), nil},
		{"parts past limit", repeated(chat+`{"content":[`, `{}`, `]}]}`, 5), ErrTooManyParts},
		{"parts past limit over messages", repeated(chat, `{"content":[{},{}]}`, `]}`, 3), ErrTooManyParts},
		{"depth at limit", nested(3), nil},
		{"depth past limit", nested(4), ErrTooDeep},
		{"depth past limit in a part", []byte(chat + `{"content":[{"type":"image","x":[[[{}]]]}]}]}`), ErrTooDeep},
		{"tools at limit", repeated(`{"model":"m","prompt":"p","tools":[`, `{}`, `]}`, 2), nil},
		{"tools past limit", repeated(`{"model":"m","prompt":"p","tools":[`, `{}`, `]}`, 3), ErrTooManyTools},
		{"prompts at limit", repeated(`{"model":"m","prompt":[`, `"a"`, `]}`, 2), nil},
		{"prompts past limit", repeated(`{"model":"m","prompt":[`, `[1]`, `]}`, 3), ErrTooManyPrompts},
		{"token ids are not prompts", repeated(`{"model":"m","prompt":[`, `1`, `]}`, 100), nil},
		{"repeated messages field counts afresh", []byte(`{"model":"m","messages":[{},{},{}],"messages":[{},{},{}]}`), nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := small.Parse(tc.body)
			if tc.want == nil {
				if err != nil {
					t.Fatalf("got %v, want no error", err)
				}
				if want, _ := NoLimits().Parse(tc.body); !cmp.Equal(p, want) {
					t.Fatalf("under limits %+v, without %+v", p, want)
				}
				return
			}
			if !errors.Is(err, tc.want) || !errors.Is(err, ErrLimit) || errors.Is(err, ErrMalformed) || p != nil {
				t.Fatalf("got %v, want %v (an ErrLimit, not ErrMalformed)", err, tc.want)
			}
			if _, err := NoLimits().Parse(tc.body); err != nil {
				t.Fatalf("without limits: %v", err)
			}
		})
	}
}

func TestLimitsDefaults(t *testing.T) {
	body := repeated(`{"model":"m","messages":[`, `{}`, `]}`, DefaultMaxMessages+1)
	if _, err := Parse(body); !errors.Is(err, ErrTooManyMessages) {
		t.Fatalf("Parse of %d messages: got %v, want ErrTooManyMessages", DefaultMaxMessages+1, err)
	}
	if _, err := Parse(nested(DefaultMaxDepth - 3)); err != nil {
		t.Fatalf("Parse at the default depth: %v", err)
	}
	if _, err := Parse(nested(DefaultMaxDepth - 2)); !errors.Is(err, ErrTooDeep) {
		t.Fatalf("Parse past the default depth: got %v, want ErrTooDeep", err)
	}
	if _, err := NoLimits().Parse(nested(HardMaxDepth)); !errors.Is(err, ErrTooDeep) {
		t.Fatalf("NoLimits past HardMaxDepth: got %v, want ErrTooDeep", err)
	}
}

// adversarial are request bodies of about size bytes shaped to make a
// parser allocate: the cheapest elements that each cost a structure.
func adversarial(size int) map[string][]byte {
	const chat = `{"model":"m","messages":[`
	n := func(elem string) int { return size / (len(elem) + 1) }
	return map[string][]byte{
		"empty messages":     repeated(chat, `{}`, `]}`, n(`{}`)),
		"messages at limit":  repeated(chat, `{}`, `]}`, DefaultMaxMessages),
		"short messages":     repeated(chat, `{"role":"user","content":"a"}`, `]}`, DefaultMaxMessages),
		"empty parts":        repeated(chat+`{"content":[`, `{}`, `]}]}`, n(`{}`)),
		"parts at limit":     repeated(chat+`{"content":[`, `{}`, `]}]}`, DefaultMaxParts),
		"text parts":         repeated(chat+`{"content":[`, `{"type":"text","text":"a"}`, `]}]}`, DefaultMaxParts),
		"deep nesting":       nested(size / 2),
		"nesting at limit":   repeated(chat+`{"x":`+strings.Repeat("[", DefaultMaxDepth-4), `0`, strings.Repeat("]", DefaultMaxDepth-4)+`}]}`, n(`0`)),
		"empty tools":        repeated(`{"model":"m","prompt":"p","tools":[`, `{}`, `]}`, n(`{}`)),
		"tools at limit":     repeated(`{"model":"m","prompt":"p","tools":[`, `{}`, `]}`, DefaultMaxTools),
		"repeated messages":  repeated(`{"model":"m"`, `"messages":[{}]`, `}`, n(`"messages":[{}]`)),
		"repeated names":     repeated(chat+`{"role":"user"`, `"name":"ab"`, `}]}`, n(`"name":"ab"`)),
		"prompt batch":       repeated(`{"model":"m","prompt":[`, `[]`, `]}`, n(`[]`)),
		"prompt batch limit": repeated(`{"model":"m","prompt":[`, `[]`, `]}`, DefaultMaxPrompts),
		"token ids":          repeated(`{"model":"m","prompt":[`, `1`, `]}`, n(`1`)),
		"escaped text":       repeated(`{"model":"m","prompt":"`, `\n`, `"}`, n(`\n`)),
	}
}

// allocated returns the bytes Parse allocates reading body.
func allocated(body []byte) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	Parse(body)
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// Bounds of TestParseMemory: Parse allocates at most perByte bytes per
// body byte plus fixed, what the count limits allow at most in structures
// whatever the body's size (DefaultMaxMessages Messages of 88 bytes, in an
// array grown by doubling, being the largest).
const (
	perByte = 4
	fixed   = 1 << 20
)

// TestParseMemory checks that Parse's memory is a small multiple of the
// body for bodies shaped to amplify it, at 64 KiB and 8 MiB, and logs the
// figure (bytes allocated per body byte):
//
//	go test -run TestParseMemory -v ./prefix
func TestParseMemory(t *testing.T) {
	for _, size := range []int{64 << 10, 8 << 20} {
		for name, body := range adversarial(size) {
			got := allocated(body)
			_, err := Parse(body)
			t.Logf("%-8d %-18s %9d B allocated, %6.3f B per body byte (%d body bytes; err %v)",
				size, name, got, float64(got)/float64(len(body)), len(body), errors.Is(err, ErrLimit))
			if limit := perByte*uint64(len(body)) + fixed; got > limit {
				t.Errorf("%s, %d bytes: %d bytes allocated, want at most %d", name, len(body), got, limit)
			}
		}
	}
}

// BenchmarkParseAdversarial reports Parse's bytes allocated per body byte
// (B/body-byte) for the bodies of TestParseMemory at 8 MiB:
//
//	go test -run='^$' -bench=BenchmarkParseAdversarial -benchmem ./prefix
func BenchmarkParseAdversarial(b *testing.B) {
	for name, body := range adversarial(8 << 20) {
		b.Run(strings.ReplaceAll(name, " ", "-"), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			var total uint64
			for b.Loop() {
				total += allocated(body)
			}
			b.ReportMetric(float64(total)/float64(b.N)/float64(len(body)), "B/body-byte")
		})
	}
}

// FuzzParseLimits checks the limits on any body: under small limits, a
// body within them parses exactly as without limits, and one past any of
// them fails with a limit error (never a panic, never another result).
func FuzzParseLimits(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","messages":[{"role":"user","content":"hi"},{},{}]}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image","x":[1,{}]}]}]}`,
		`{"model":"m","prompt":[[1,2],[3],[4]]}`,
		`{"model":"m","prompt":["a","b","c"],"tools":[{},{},{}]}`,
		`{"model":"m","prompt":"x","n":[[[[[[[[1]]]]]]]]}`,
		`{"model":"m","messages":[{}],"messages":[{},{},{}]}`,
	} {
		f.Add([]byte(s), uint8(2), uint8(3), uint8(5), uint8(2), uint8(2))
	}
	f.Fuzz(func(t *testing.T, body []byte, msgs, parts, depth, tools, prompts uint8) {
		lim := Limits{Messages: int(msgs) + 1, Parts: int(parts) + 1, Depth: int(depth) + 1, Tools: int(tools) + 1, Prompts: int(prompts) + 1}
		got, err := lim.Parse(body)
		want, wantErr := NoLimits().Parse(body)
		if wantErr != nil {
			if err == nil {
				t.Fatalf("parsed under limits, but not without: %v", wantErr)
			}
			return
		}
		over := exceeds(t, body, want, lim)
		switch {
		case over == "" && err != nil:
			t.Fatalf("within limits %+v, got %v", lim, err)
		case over == "" && !cmp.Equal(got, want):
			t.Fatalf("within limits: %+v, without limits %+v", got, want)
		case over != "" && !errors.Is(err, ErrLimit):
			t.Fatalf("past the %s limit of %+v, got %v, want a limit error", over, lim, err)
		}
	})
}

// exceeds names a limit of lim that body (parsed without limits as p) is
// past, or returns "": counted independently of the scanner, with
// encoding/json and a bracket count, over every occurrence of a repeated
// key (the scanner checks each as it reads it, though the last one wins).
func exceeds(t *testing.T, body []byte, p *Prompt, lim Limits) string {
	if depthOf(body) > lim.Depth {
		return "depth"
	}
	if !p.Chat && max(len(p.Prompts), len(p.PromptIDs)) > lim.Prompts {
		return "prompts"
	}
	for _, f := range members(t, body) {
		switch f.key {
		case "tools":
			if arrayLen(f.value) > lim.Tools {
				return "tools"
			}
		case "messages":
			var msgs []json.RawMessage
			json.Unmarshal(f.value, &msgs)
			if len(msgs) > lim.Messages {
				return "messages"
			}
			parts := 0
			for _, m := range msgs {
				for _, mf := range members(t, m) {
					if mf.key == "content" {
						parts += arrayLen(mf.value)
					}
				}
			}
			if parts > lim.Parts {
				return "parts"
			}
		}
	}
	return ""
}

// member is one key and value of a JSON object.
type member struct {
	key   string
	value json.RawMessage
}

// members returns the members of the JSON object raw in order, repeated
// keys included; nil if raw is not an object.
func members(t *testing.T, raw []byte) []member {
	dec := json.NewDecoder(bytes.NewReader(raw))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil
	}
	var out []member
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			t.Fatalf("parsed, but not by encoding/json: %v", err)
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			t.Fatalf("parsed, but not by encoding/json: %v", err)
		}
		out = append(out, member{k.(string), v})
	}
	return out
}

// arrayLen is the length of raw if it is a JSON array, else 0.
func arrayLen(raw json.RawMessage) int {
	var a []json.RawMessage
	if json.Unmarshal(raw, &a) != nil {
		return 0
	}
	return len(a)
}

// depthOf is the deepest nesting of objects and arrays in the valid JSON
// body.
func depthOf(body []byte) int {
	d, deepest, str, esc := 0, 0, false, false
	for _, c := range body {
		switch {
		case esc:
			esc = false
		case str && c == '\\':
			esc = true
		case c == '"':
			str = !str
		case str:
		case c == '{' || c == '[':
			d++
			deepest = max(deepest, d)
		case c == '}' || c == ']':
			d--
		}
	}
	return deepest
}

func ExampleLimits_Parse() {
	body := []byte(`{"model":"m","messages":[{"role":"user","content":"a"},{"role":"user","content":"b"}]}`)
	_, err := Limits{Messages: 1}.Parse(body)
	fmt.Println(err, errors.Is(err, ErrTooManyMessages))
	// Output: offset 55: too many messages: more than 1 true
}
