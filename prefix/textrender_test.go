package prefix

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// renderRef is the rendering Text documents, built whole from its rules:
// the reference the streamed chunker is checked against.
func renderRef(p *Prompt) []byte {
	var r []byte
	field := func(tag byte, s string) {
		r = append(r, tag)
		for i := 0; i < len(s); i++ {
			r = append(r, s[i])
			if s[i] == 0xFF {
				r = append(r, 0x00)
			}
		}
		r = append(r, 0xFF)
	}
	tools := len(p.Tools) > 0
	if tools && !p.systemFirst() {
		field('T', string(p.Tools))
		tools = false
	}
	switch {
	case p.Chat:
		for i, m := range p.Messages {
			if i == 1 && tools {
				field('T', string(p.Tools))
			}
			r = append(r, 'M')
			field('r', m.Role)
			field('c', m.Content)
			if m.Name != "" {
				field('n', m.Name)
			}
			if m.ToolCallID != "" {
				field('i', m.ToolCallID)
			}
			if len(m.ToolCalls) > 0 {
				field('t', string(m.ToolCalls))
			}
		}
		if len(p.Messages) == 1 && tools {
			field('T', string(p.Tools))
		}
	case len(p.Prompts) > 0:
		r = append(r, 'P')
		r = append(r, p.Prompts[0]...)
	case len(p.PromptIDs) > 0:
		r = append(r, 'I')
		for _, id := range p.PromptIDs[0] {
			r = binary.LittleEndian.AppendUint32(r, id)
		}
	}
	return r
}

// chainRef is Chain over the full size-byte chunks of r, from Root(model, "").
func chainRef(model string, r []byte, size int) []Hash {
	var out []Hash
	h := Root(model, "")
	for i := 0; i+size <= len(r); i += size {
		h = Chain(h, r[i:i+size])
		out = append(out, h)
	}
	return out
}

// unrender reads a rendering back into the prompt it renders (the first
// prompt only, no model), or fails. It decides every byte from the bytes
// before it and the one after, so two prompts with one rendering would be
// one prompt: a round trip through it proves the rendering unambiguous.
func unrender(r []byte) (*Prompt, error) {
	u := reader{r}
	p := &Prompt{}
	tools, _, err := u.field('T')
	if err != nil {
		return nil, err
	}
	p.Tools = tools
	switch u.peek() {
	case -1:
	case 'M':
		p.Chat = true
		for u.peek() == 'M' {
			u.r = u.r[1:]
			m, err := u.message()
			if err != nil {
				return nil, err
			}
			p.Messages = append(p.Messages, m)
			if len(p.Messages) == 1 && m.Role == "system" && p.Tools == nil {
				if p.Tools, _, err = u.field('T'); err != nil {
					return nil, err
				}
			}
		}
		if len(u.r) > 0 {
			return nil, fmt.Errorf("byte %#x after the messages", u.r[0])
		}
	case 'P':
		p.Prompts = []string{string(u.r[1:])}
	case 'I':
		if (len(u.r)-1)%4 != 0 {
			return nil, errors.New("token ids not a multiple of 4 bytes")
		}
		ids := []uint32{}
		for b := u.r[1:]; len(b) > 0; b = b[4:] {
			ids = append(ids, binary.LittleEndian.Uint32(b))
		}
		p.PromptIDs = [][]uint32{ids}
	default:
		return nil, fmt.Errorf("unknown tag %#x", u.r[0])
	}
	return p, nil
}

// reader is unrender's cursor.
type reader struct{ r []byte }

// peek returns the next byte, or -1 at the end.
func (u *reader) peek() int {
	if len(u.r) == 0 {
		return -1
	}
	return int(u.r[0])
}

// message reads one message's fields, after its 'M'.
func (u *reader) message() (Message, error) {
	var m Message
	var f [5][]byte
	for i, tag := range []byte("rcnit") {
		b, ok, err := u.field(tag)
		if err != nil {
			return m, err
		}
		if !ok && i < 2 {
			return m, fmt.Errorf("message without field %q", tag)
		}
		f[i] = b
	}
	m.Role, m.Content, m.Name, m.ToolCallID, m.ToolCalls = string(f[0]), string(f[1]), string(f[2]), string(f[3]), f[4]
	return m, nil
}

// field reads the field tagged tag if it comes next: 0xFF 0x00 is a 0xFF
// of the field, a 0xFF followed by anything else (a tag) or nothing ends it.
func (u *reader) field(tag byte) (b []byte, ok bool, err error) {
	if u.peek() != int(tag) {
		return nil, false, nil
	}
	u.r = u.r[1:]
	for len(u.r) > 0 {
		c := u.r[0]
		u.r = u.r[1:]
		if c != 0xFF {
			b = append(b, c)
			continue
		}
		if u.peek() != 0x00 {
			return b, true, nil
		}
		b = append(b, 0xFF)
		u.r = u.r[1:]
	}
	return nil, false, fmt.Errorf("field %q without its terminator", tag)
}

// fuzzPrompt builds a prompt from fuzz bytes: the first byte picks chat,
// text or token-id prompt and whether there are tools, and each field takes
// a length byte (mod 24) and that many bytes, whatever they are.
func fuzzPrompt(data []byte) *Prompt {
	next := func() string {
		if len(data) == 0 {
			return ""
		}
		n := min(int(data[0])%24, len(data)-1)
		s := string(data[1 : 1+n])
		data = data[1+n:]
		return s
	}
	if len(data) == 0 {
		return &Prompt{Model: "m", Prompts: []string{""}}
	}
	mode := data[0]
	data = data[1:]
	p := &Prompt{Model: "m"}
	if mode&4 != 0 {
		p.Tools = []byte(next())
	}
	switch mode % 4 {
	case 0, 1:
		p.Chat = true
		for len(p.Messages) == 0 || len(data) > 0 {
			m := Message{Role: next(), Content: next()}
			if len(data) > 0 && data[0]&1 != 0 {
				m.Name, m.ToolCallID, m.ToolCalls = next(), next(), []byte(next())
			}
			p.Messages = append(p.Messages, m)
		}
	case 2:
		p.Prompts = []string{next(), next()}
	case 3:
		var ids []uint32
		for s := next(); len(s) >= 4; s = s[4:] {
			ids = append(ids, binary.LittleEndian.Uint32([]byte(s)))
		}
		p.PromptIDs = [][]uint32{ids, {7}}
	}
	return p
}

// FuzzTextRendering checks, for any prompt, that the rendering reads back
// into that prompt (so it is unambiguous) and that Hashes is Chain over it.
func FuzzTextRendering(f *testing.F) {
	for _, s := range []string{
		"\x00\x04user\x05hello",
		"\x00\x04user\x0ba\xffMruser\xffcb",
		"\x01\x02\xff\x00\x03\xff\xff\x00\x01",
		"\x04\x03[1]\x00\x00\x00\x00\x01\x02ab\x01cd\x01ef\x02{}",
		"\x06\x02\xff\xff\x05ab\xffcd\x03xyz",
		"\x07\x01\xff\x09\x01\x00\x00\x00\xff\xff\xff\xff\x02",
		"\x00\x00\x00\x00\x00\x00\x00",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		p := fuzzPrompt(data)
		r := renderRef(p)
		back, err := unrender(r)
		if err != nil {
			t.Fatalf("unrender(%q): %v", r, err)
		}
		want := &Prompt{Chat: p.Chat, Messages: p.Messages, Tools: p.Tools}
		if len(p.Prompts) > 0 {
			want.Prompts = p.Prompts[:1]
		}
		if len(p.PromptIDs) > 0 {
			want.PromptIDs = p.PromptIDs[:1]
		}
		if d := cmp.Diff(want, back, cmpopts.EquateEmpty()); d != "" {
			t.Fatalf("rendering %q reads back as another prompt (-want +got):\n%s", r, d)
		}
		for _, size := range []int{1, 5, 64} {
			got, _ := Text{ChunkChars: size}.Hashes(p, nil)
			if d := cmp.Diff(chainRef(p.Model, r, size), got, cmpopts.EquateEmpty()); d != "" {
				t.Fatalf("ChunkChars %d: hashes differ from Chain over %q (-want +got):\n%s", size, r, d)
			}
		}
	})
}

func TestTextEscapesMatchRendering(t *testing.T) {
	// Content dense with 0xFF is escaped a window at a time; the chunks
	// must still be the rendering's, around every window boundary.
	text := longText(5, 300)
	every := func(k int) string {
		b := []byte(text)
		for i := 0; i < len(b); i += k {
			b[i] = 0xFF
		}
		return string(b)
	}
	at := func(i ...int) string {
		b := []byte(text)
		for _, i := range i {
			b[i] = 0xFF
		}
		return string(b)
	}
	tests := []struct{ name, content string }{
		{"all 0xFF", strings.Repeat("\xff", 300)},
		{"alternate", strings.Repeat("\xffa", 150)},
		{"0xFF 0x00 pairs", strings.Repeat("\xff\x00", 150)},
		{"every 63", every(63)}, {"every 64", every(64)}, {"every 65", every(65)}, {"every 2", every(2)},
		{"lone at 0", at(0)}, {"lone at the end", at(299)},
		{"pair 63 apart", at(10, 73)}, {"pair 64 apart", at(10, 74)}, {"pair 65 apart", at(10, 75)},
		{"run of 64", strings.Repeat("\xff", 64) + text},
		{"run of 65", strings.Repeat("\xff", 65) + text},
		{"run of 129 at the end", text + strings.Repeat("\xff", 129)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := chatOf("[\xff]", Message{Role: "user", Content: tc.content, Name: tc.content[:70]}, Message{Role: "u\xff", Content: "x"})
			r := renderRef(p)
			for _, size := range []int{1, 7, 64, 100} {
				got, _ := Text{ChunkChars: size}.Hashes(p, nil)
				if d := cmp.Diff(chainRef(p.Model, r, size), got, cmpopts.EquateEmpty()); d != "" {
					t.Errorf("ChunkChars %d: hashes differ from Chain over the rendering (-want +got):\n%s", size, d)
				}
			}
		})
	}
}

// sharedBlocks counts the leading hashes a and b have in common.
func sharedBlocks(a, b []Hash) int {
	n := 0
	for n < min(len(a), len(b)) && a[n] == b[n] {
		n++
	}
	return n
}

// chatOf is a chat prompt for model "m".
func chatOf(tools string, msgs ...Message) *Prompt {
	p := &Prompt{Model: "m", Chat: true, Messages: msgs}
	if tools != "" {
		p.Tools = []byte(tools)
	}
	return p
}

func TestTextSharedPrefix(t *testing.T) {
	// A RAG request: one user message, a shared context of 10,190 bytes,
	// then a question; the two questions differ from their first byte.
	const n = 10190
	ctx := longText(1, n)
	qa := "What does the second section say about caching?"
	qb := "Summarise the context in three bullet points, one line each."
	rag := func(q string) *Prompt {
		return mustParse(t, fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":%q}]}`, ctx+q))
	}
	// Before the first difference: 'M', 'r' "user" 0xFF, 'c', then the
	// shared content.
	user := len("M") + len("r") + len("user") + 1 + len("c")
	sys := "You are a careful assistant. Answer from the context only."
	tools := `[{"type":"function","function":{"name":"search"}}]`
	cjk := strings.Repeat("検索拡張生成", 400) // 2,400 characters, 7,200 bytes
	ff := ctx[:3000] + "\xff" + ctx[3000:6000] + "\xff\xff" + ctx[6000:]
	prompt := longText(2, 5000)
	tests := []struct {
		name   string
		a, b   *Prompt
		size   int
		before int // rendered bytes before the first difference
	}{
		{"rag, different questions", rag(qa), rag(qb), 0, user + n},
		{"rag, chunk 100", rag(qa), rag(qb), 100, user + n},
		{"rag, chunk 7", rag(qa), rag(qb), 7, user + n},
		{"rag, chunk 1", rag(qa), rag(qb), 1, user + n},
		// a's content ends where b's question starts: a's terminator is
		// its first difference.
		{"one content a prefix of the other", rag(""), rag(qb), 0, user + n},
		{"after a system prompt and tools",
			chatOf(tools, Message{Role: "system", Content: sys}, Message{Role: "user", Content: ctx + qa}),
			chatOf(tools, Message{Role: "system", Content: sys}, Message{Role: "user", Content: ctx + qb}), 0,
			1 + len(tools) + 1 + len("M") + len("r") + len("system") + 1 + len("c") + len(sys) + 1 + user + n},
		// The chunks count bytes: 3 per character here.
		{"cjk context", chatOf("", Message{Role: "user", Content: cjk + qa}), chatOf("", Message{Role: "user", Content: cjk + qb}), 0,
			user + len(cjk)},
		// The shared content is n+3 bytes, three of them 0xFF, each
		// rendered as 2 bytes.
		{"0xFF in the shared content", chatOf("", Message{Role: "user", Content: ff + qa}), chatOf("", Message{Role: "user", Content: ff + qb}), 0,
			user + n + 3 + 3},
		{"growing completions prompt", &Prompt{Model: "m", Prompts: []string{prompt}}, &Prompt{Model: "m", Prompts: []string{prompt + qb}}, 0,
			len("P") + len(prompt)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tx := Text{ChunkChars: tc.size}
			a, _ := tx.Hashes(tc.a, nil)
			b, _ := tx.Hashes(tc.b, nil)
			if got, want := sharedBlocks(a, b), tc.before/tx.chunkChars(); got != want {
				t.Errorf("got %v shared blocks, want %v (of %d and %d)", got, want, len(a), len(b))
			}
		})
	}
}

func TestTextNextTurnSharesPreviousTurn(t *testing.T) {
	calls := `[{"id":"call_1","type":"function","function":{"name":"search","arguments":"{\"q\":\"kv cache\"}"}}]`
	turn1 := chatOf(`[{"type":"function"}]`,
		Message{Role: "system", Content: longText(1, 1500)},
		Message{Role: "user", Content: longText(2, 700)})
	turn2 := chatOf(`[{"type":"function"}]`, append(turn1.Messages[:2:2],
		Message{Role: "assistant", ToolCalls: []byte(calls)},
		Message{Role: "tool", Name: "search", ToolCallID: "call_1", Content: longText(3, 900)})...)
	turn3 := chatOf(`[{"type":"function"}]`, append(turn2.Messages[:4:4],
		Message{Role: "assistant", Content: longText(4, 400)},
		Message{Role: "user", Content: "And the second point?"})...)
	len1, len2 := len(renderRef(turn1)), len(renderRef(turn2))
	tests := []struct {
		name       string
		prev, next *Prompt
		size       int
	}{
		{"tool call", turn1, turn2, 0},
		{"tool result and answer", turn2, turn3, 0},
		{"chunk 1", turn1, turn2, 1},
		{"chunk 7", turn2, turn3, 7},
		{"chunk = previous rendering", turn1, turn2, len1},
		{"chunk = previous rendering - 1", turn2, turn3, len2 - 1},
		{"chunk = previous rendering + 1", turn1, turn2, len1 + 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tx := Text{ChunkChars: tc.size}
			prev, _ := tx.Hashes(tc.prev, nil)
			next, _ := tx.Hashes(tc.next, nil)
			// The previous turn's rendering, through its last terminator,
			// is a prefix of the next turn's, which goes on with 'M'.
			want := len(renderRef(tc.prev)) / tx.chunkChars()
			if got := sharedBlocks(prev, next); got != want {
				t.Errorf("got %v shared blocks, want %v", got, want)
			}
			if got := len(prev); got != want {
				t.Errorf("got %v blocks in the previous turn, want %v", got, want)
			}
		})
	}
}

func TestTextUnambiguous(t *testing.T) {
	// Each pair is two different requests that a naive rendering (fields
	// concatenated, or ended by an unescaped 0xFF, or optional fields
	// without tags) renders the same. With one-byte chunks every byte of
	// the rendering is hashed, so the chains differ iff the renderings do.
	u := func(content string) Message { return Message{Role: "user", Content: content} }
	tests := []struct {
		name string
		a, b *Prompt
	}{
		{"0xFF in content imitates a message boundary",
			chatOf("", u("x\xffMruser\xffcy")), chatOf("", u("x"), u("y"))},
		{"0xFF in content imitates a field boundary",
			chatOf("", Message{Role: "user", Content: "x\xffnbob"}), chatOf("", Message{Role: "user", Content: "x", Name: "bob"})},
		{"escaped 0xFF versus 0xFF 0x00", chatOf("", u("\xff")), chatOf("", u("\xff\x00"))},
		{"0xFF at the end versus none", chatOf("", u("a\xff")), chatOf("", u("a"))},
		{"0x00 versus empty", chatOf("", u("\x00")), chatOf("", u(""))},
		{"0xFF in role", chatOf("", Message{Role: "us\xffcer", Content: "x"}), chatOf("", Message{Role: "us", Content: "er\xffcx"})},
		{"role and content boundary moved", chatOf("", Message{Role: "us", Content: "erhi"}), chatOf("", u("hi"))},
		{"empty role versus empty content", chatOf("", Message{Content: "user"}), chatOf("", Message{Role: "user"})},
		{"one empty message more", chatOf("", u("a")), chatOf("", u("a"), Message{})},
		{"one empty message versus two", chatOf("", Message{}), chatOf("", Message{}, Message{})},
		{"a message split in two", chatOf("", u("abcd")), chatOf("", u("ab"), u("cd"))},
		{"content looks like a chat template", chatOf("", u("hi\n<|assistant|>\nhello")),
			chatOf("", u("hi"), Message{Role: "assistant", Content: "hello"})},
		{"content versus name", chatOf("", Message{Role: "user", Content: "x"}), chatOf("", Message{Role: "user", Name: "x"})},
		{"name versus tool call id", chatOf("", Message{Role: "tool", Name: "x"}), chatOf("", Message{Role: "tool", ToolCallID: "x"})},
		{"tool calls versus content", chatOf("", Message{Role: "assistant", ToolCalls: []byte(`[]`)}), chatOf("", Message{Role: "assistant", Content: `[]`})},
		{"tools versus none", chatOf(`[1]`, u("x")), chatOf("", u("x"))},
		{"tools ending in 0xFF", chatOf("[1]\xff", u("x")), chatOf("[1]", u("\xffx"))},
		{"chat versus a prompt that spells it", chatOf("", u("hi")), &Prompt{Model: "m", Prompts: []string{"Mruser\xffchi\xff"}}},
		{"text prompt versus token ids", &Prompt{Model: "m", Prompts: []string{"\x01\x00\x00\x00"}}, &Prompt{Model: "m", PromptIDs: [][]uint32{{1}}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a, _ := Text{ChunkChars: 1}.Hashes(tc.a, nil)
			b, _ := Text{ChunkChars: 1}.Hashes(tc.b, nil)
			if cmp.Equal(a, b) {
				t.Errorf("got equal chains of %v hashes, want different chains", len(a))
			}
		})
	}
}
