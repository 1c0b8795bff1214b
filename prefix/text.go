package prefix

import (
	"encoding/binary"
	"math/bits"
	"strings"
	"unsafe"
)

// Text is text mode: it hashes a canonical rendering of the request, cut
// into chunks of ChunkChars bytes, with no tokenizer. Equal hashes mean equal
// prefixes of the rendering; the zero value is ready to use.
//
// The rendering, byte by byte, is
//
//	rendering = ['T' tools 0xFF] (message... | 'P' prompt | 'I' ids)
//	          | system ['T' tools 0xFF] message...
//	message   = 'M' 'r' role 0xFF 'c' content 0xFF
//	            ['n' name 0xFF] ['i' tool_call_id 0xFF] ['t' tool_calls 0xFF]
//
// where system is the first message when its role is "system" (tools then
// come after it, where the chat template renders them: in the system turn,
// after the system prompt, as Qwen3's and Hermes' templates do; two
// requests with one system prompt and different tools share the system
// prompt's chunks), tools and tool_calls are raw JSON, a bracketed field is there only
// when it is not empty, and role, content, name, tool_call_id, tool_calls
// and tools are escaped: each 0xFF byte in them is written 0xFF 0x00, so a
// lone 0xFF ends a field. For completions, prompt is the first prompt's
// bytes and ids its token ids, 4 bytes little endian each; nothing follows
// them, so they are neither escaped nor terminated.
//
// The length of a field is never written, so equal leading bytes of the
// request give equal leading chunks whatever follows: two messages that
// share a long context and differ at their end share every chunk before the
// difference, a conversation's next turn shares every chunk of the previous
// turn's rendering, and a completions prompt that grows keeps sharing its
// earlier chunks. The rendering is still unambiguous: inside a field a 0xFF
// is always followed by 0x00, a terminator by a tag (never 0x00) or by the
// end, so the rendering reads back into exactly one request and no content,
// whatever bytes it holds, can imitate a field or message boundary. Valid
// UTF-8 never holds 0xFF, so escaping costs one scan and no bytes in
// practice. The chain starts at Root(model, ""), so different models (and
// vLLM LoRA adapters, named in "model") never share a hash.
//
// Block i's hash is Chain(hash i-1, chunk i), the same function token mode
// uses. Only full chunks are hashed; the trailing partial chunk is not.
type Text struct {
	// ChunkChars is the block size in bytes of the UTF-8 rendering; zero
	// means 64 (about 16 tokens of English).
	ChunkChars int
}

// chunkChars returns the effective chunk size.
func (t Text) chunkChars() int {
	if t.ChunkChars <= 0 {
		return 64
	}
	return t.ChunkChars
}

// TokensPerBlock is the estimated prompt tokens one block stands for
// (ChunkChars / 4, at least 1), so the router can turn matched blocks into
// matched tokens.
func (t Text) TokensPerBlock() int {
	return max(t.chunkChars()/4, 1)
}

// messageOverhead is the tokens a chat template adds per message (role
// markers and separators: 4 to 5 for Llama 3 and Qwen templates).
const messageOverhead = 4

// Hashes appends to out the chained hashes of the full chunks of p's
// rendering and returns them with an estimate of the prompt's tokens.
//
// The estimate counts ASCII bytes / 4 (English averages 4 characters per
// token in Llama 3 and Qwen vocabularies) plus one token per non-ASCII
// character (CJK runs close to one token a character; accented Latin text is
// overestimated), plus 4 per chat message for its template markers; token id
// prompts count exactly. All prompts of a batch count toward tokens, but only
// the first is hashed. Hashes allocates only when out lacks capacity (and
// once for a ChunkChars over 512).
func (t Text) Hashes(p *Prompt, out []Hash) (hashes []Hash, tokens int) {
	c := chunker{size: t.chunkChars(), h: Root(p.Model, ""), out: out}
	if c.size > len(c.arr) {
		c.big = make([]byte, c.size)
	}
	var est estimate
	tools := len(p.Tools) > 0
	if tools {
		est.add(p.Tools)
	}
	if tools && !p.systemFirst() {
		c.fieldBytes('T', p.Tools)
		tools = false
	}
	switch {
	case p.Chat:
		for i := range p.Messages {
			if i == 1 && tools {
				c.fieldBytes('T', p.Tools)
			}
			m := &p.Messages[i]
			c.tag('M')
			c.field('r', m.Role)
			c.field('c', m.Content)
			if m.Name != "" {
				c.field('n', m.Name)
			}
			if m.ToolCallID != "" {
				c.field('i', m.ToolCallID)
			}
			if len(m.ToolCalls) > 0 {
				c.fieldBytes('t', m.ToolCalls)
				est.add(m.ToolCalls)
			}
			est.addString(m.Content)
			est.extra += messageOverhead
		}
		if len(p.Messages) == 1 && tools {
			c.fieldBytes('T', p.Tools)
		}
	case len(p.Prompts) > 0:
		c.tag('P')
		c.writeString(p.Prompts[0])
		for _, s := range p.Prompts {
			est.addString(s)
		}
	case len(p.PromptIDs) > 0:
		c.tag('I')
		var b [4]byte
		for _, id := range p.PromptIDs[0] {
			binary.LittleEndian.PutUint32(b[:], id)
			c.write(b[:])
		}
		for _, ids := range p.PromptIDs {
			est.extra += len(ids)
		}
	}
	return c.out, est.tokens()
}

// chunker streams the rendering, chaining a hash each time a chunk fills,
// so the whole rendering is never built: a chunk that lies inside one
// string is hashed in place, and only chunks straddling fields are copied
// into a buffer.
type chunker struct {
	arr  [512]byte // the chunk buffer, buf()
	big  []byte    // the buffer when a chunk does not fit arr
	n    int       // bytes of the current chunk filled
	size int
	h    Hash
	out  []Hash
}

// buf returns the chunk buffer.
func (c *chunker) buf() []byte {
	if c.big != nil {
		return c.big
	}
	return c.arr[:c.size]
}

// writeString appends s to the rendering.
func (c *chunker) writeString(s string) {
	c.write(unsafe.Slice(unsafe.StringData(s), len(s)))
}

// write appends b to the rendering.
func (c *chunker) write(b []byte) {
	if c.n > 0 {
		k := copy(c.buf()[c.n:], b)
		c.n += k
		b = b[k:]
		if c.n < c.size {
			return
		}
		c.flush()
	}
	size := c.size
	h := c.h
	for len(b) >= size {
		h = chainBytes(h, b[:size])
		c.out = append(c.out, h)
		b = b[size:]
	}
	c.h = h
	c.n = copy(c.buf(), b)
}

// flush chains the full chunk buffer onto the hash.
func (c *chunker) flush() {
	c.h = chainBytes(c.h, c.buf())
	c.out = append(c.out, c.h)
	c.n = 0
}

// tag appends one byte.
func (c *chunker) tag(b byte) {
	c.buf()[c.n] = b
	c.n++
	if c.n == c.size {
		c.flush()
	}
}

// terminator ends each field of the rendering; escape follows a 0xFF that
// belongs to the field. Tags are ASCII letters, never escape.
const (
	terminator = 0xFF
	escape     = 0x00
)

// field appends a tag, s with each 0xFF followed by 0x00, and the
// terminator. Valid UTF-8 holds no 0xFF, so s is usually written whole after
// one scan.
func (c *chunker) field(tag byte, s string) {
	c.tag(tag)
	for {
		i := strings.IndexByte(s, terminator)
		if i < 0 {
			break
		}
		c.writeString(s[:i])
		s = c.escapeRun(s[i:])
	}
	c.writeString(s)
	c.tag(terminator)
}

// escapeSpan is the most bytes escapeRun escapes at once, so that content
// dense with 0xFF (invalid UTF-8, which Parse keeps) costs a byte loop and a
// write per 64 bytes rather than a write per 0xFF.
const escapeSpan = 64

// escapeRun appends the leading bytes of s, which starts with a 0xFF, with
// each 0xFF followed by 0x00, and returns the rest of s: the first
// escapeSpan bytes if another 0xFF is among them, else the 0xFF alone.
func (c *chunker) escapeRun(s string) string {
	k := min(len(s), escapeSpan)
	if strings.IndexByte(s[1:k], terminator) < 0 {
		k = 1
	}
	var b [2 * escapeSpan]byte
	n := 0
	for _, x := range []byte(s[:k]) {
		b[n] = x
		b[n+1] = escape
		n += 1 + int((uint(x)+1)>>8) // 2 if x is 0xFF, without a branch
	}
	c.write(b[:n])
	return s[k:]
}

// fieldBytes is field for a byte slice; it reads b in place.
func (c *chunker) fieldBytes(tag byte, b []byte) {
	c.field(tag, unsafe.String(unsafe.SliceData(b), len(b)))
}

// estimate accumulates the token estimate of Hashes.
type estimate struct {
	ascii, other, extra int
}

// add counts the bytes of s: ASCII bytes, and the lead bytes of non-ASCII
// characters. It reads 32 bytes at a time when they are all ASCII, else 8.
func (e *estimate) add(s []byte) {
	i := 0
	for ; i+32 <= len(s); i += 32 {
		w0, w1 := binary.LittleEndian.Uint64(s[i:]), binary.LittleEndian.Uint64(s[i+8:])
		w2, w3 := binary.LittleEndian.Uint64(s[i+16:]), binary.LittleEndian.Uint64(s[i+24:])
		if (w0|w1|w2|w3)&0x8080808080808080 == 0 {
			e.ascii += 32
			continue
		}
		e.addWord(w0)
		e.addWord(w1)
		e.addWord(w2)
		e.addWord(w3)
	}
	for ; i+8 <= len(s); i += 8 {
		e.addWord(binary.LittleEndian.Uint64(s[i:]))
	}
	for ; i < len(s); i++ {
		switch b := s[i]; {
		case b < 0x80:
			e.ascii++
		case b >= 0xC0:
			e.other++
		}
	}
}

// addWord counts the 8 bytes of w.
func (e *estimate) addWord(w uint64) {
	hi := w & 0x8080808080808080
	if hi == 0 {
		e.ascii += 8
		return
	}
	// Continuation bytes are 10xxxxxx: high bit set, next bit clear.
	cont := hi &^ (w << 1)
	nonASCII := bits.OnesCount64(hi)
	e.ascii += 8 - nonASCII
	e.other += nonASCII - bits.OnesCount64(cont)
}

// addString is add for a string; it reads s in place, without copying.
func (e *estimate) addString(s string) {
	e.add(unsafe.Slice(unsafe.StringData(s), len(s)))
}

func (e *estimate) tokens() int {
	return (e.ascii+3)/4 + e.other + e.extra
}

// systemFirst reports whether p is a chat whose first message is a system
// message: its tools then render after that message, as chat templates
// render them (Qwen3's and Hermes' put them in the system turn, after the
// system prompt).
func (p *Prompt) systemFirst() bool {
	return p.Chat && len(p.Messages) > 0 && p.Messages[0].Role == "system"
}
