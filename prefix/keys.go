package prefix

import (
	"encoding/binary"

	"github.com/cespare/xxhash/v2"
)

// prefixKeyChars is how many leading characters of the first user message
// (or prompt) PrefixKey hashes, as KubeAI's PrefixHash does.
const prefixKeyChars = 100

// PrefixKey is the key of consistent-hashing policies (route.CHWBL): xxhash64
// of the model and the first 100 characters (runes) of the first user
// message, or of the first prompt for completions. Source: KubeAI
// PrefixHash (docs/peers.md, "chwbl"); vLLM names a LoRA adapter in "model", so
// the model stands for KubeAI's adapter name.
func (p *Prompt) PrefixKey() uint64 {
	var d xxhash.Digest
	d.Reset()
	d.WriteString(p.Model)
	d.WriteString("\x00")
	switch {
	case p.Chat:
		for i := range p.Messages {
			if p.Messages[i].Role == "user" {
				d.WriteString(firstRunes(p.Messages[i].Content, prefixKeyChars))
				break
			}
		}
	case len(p.Prompts) > 0:
		d.WriteString(firstRunes(p.Prompts[0], prefixKeyChars))
	case len(p.PromptIDs) > 0:
		ids := p.PromptIDs[0][:min(len(p.PromptIDs[0]), prefixKeyChars/4)]
		var b [4]byte
		for _, id := range ids {
			binary.LittleEndian.PutUint32(b[:], id)
			d.Write(b[:])
		}
	}
	return d.Sum64()
}

// ConversationKey identifies a conversation for requests that carry no
// session id: xxhash64 of the model and every message up to and including
// the first user message (the system prompt and the opening question), which
// stay the same on every later turn. For completions it hashes the first 100
// characters of the first prompt, like PrefixKey. It is never zero.
func (p *Prompt) ConversationKey() uint64 {
	if !p.Chat {
		return nonZero(p.PrefixKey())
	}
	var d xxhash.Digest
	d.Reset()
	d.WriteString("conv\x00")
	d.WriteString(p.Model)
	var n [binary.MaxVarintLen64]byte
	for i := range p.Messages {
		m := &p.Messages[i]
		d.Write(n[:binary.PutUvarint(n[:], uint64(len(m.Role)))])
		d.WriteString(m.Role)
		d.Write(n[:binary.PutUvarint(n[:], uint64(len(m.Content)))])
		d.WriteString(m.Content)
		if m.Role == "user" {
			break
		}
	}
	return nonZero(d.Sum64())
}

// nonZero maps 0 to 1, so that zero can mean "no key".
func nonZero(h uint64) uint64 {
	if h == 0 {
		return 1
	}
	return h
}

// firstRunes returns the prefix of s holding at most n runes.
func firstRunes(s string, n int) string {
	for i := range s {
		if n == 0 {
			return s[:i]
		}
		n--
	}
	return s
}
