// Package tokenizer turns text and chat requests into the token ids an
// engine computes, so the router's block hashes line up with the engine's
// KV-cache blocks (precise mode).
//
// It loads a Hugging Face tokenizer.json with a byte-level BPE model (GPT-2,
// Llama-3, Qwen2/3 families): vocabulary, merges, the pre-tokenizer's split
// pattern, NFC normalisation, and added/special tokens; and the chat template
// of tokenizer_config.json, rendered with a Go Jinja engine. Encoding is
// checked id for id against @lenml/tokenizers (tokenizer_test.go).
package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/ardanlabs/jinja"
	"golang.org/x/text/unicode/norm"
)

// Tokenizer encodes text into token ids. It is safe for concurrent use.
type Tokenizer struct {
	vocab  map[string]uint32 // only while loading: a big pointer map slows every GC
	nvocab int
	merges map[uint64]merge // (left id << 32 | right id) → merge
	bytes  [256]uint32      // id of each single byte's symbol
	split  splitter
	nfc    bool

	added     []addedToken // longest first
	addedIDs  map[string]uint32
	firstByte [256]bool // first bytes of added tokens
	onlyFirst byte      // the first byte of every added token, if they share one; else 0

	template *chatTemplate // nil when tokenizer_config.json has none

	words *memo // pre-token → ids
	segs  *memo // text between added tokens → ids

	// mu guards msgs, a bounded memo of decoded chat messages.
	mu   sync.Mutex
	msgs map[string]jinja.Value
}

type merge struct {
	rank uint32
	id   uint32
}

type addedToken struct {
	content string
	id      uint32
}

// maxMemo bounds each memo table's entries; a full table is dropped and
// refilled.
const maxMemo = 1 << 16

// maxMemoText bounds the bytes of text the segment memo keeps (words are
// at most 256 bytes each, so maxMemo bounds theirs).
const maxMemoText = 64 << 20

// Load reads tokenizer.json (and, if present, tokenizer_config.json for the
// chat template) from dir.
func Load(dir string) (*Tokenizer, error) {
	data, err := os.ReadFile(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	t, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("tokenizer %s: %w", dir, err)
	}
	cfg, err := os.ReadFile(filepath.Join(dir, "tokenizer_config.json"))
	if errors.Is(err, os.ErrNotExist) {
		return t, nil
	}
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	if t.template, err = parseChatTemplate(cfg); err != nil {
		return nil, fmt.Errorf("tokenizer %s: %w", dir, err)
	}
	return t, nil
}

// fileJSON is the part of tokenizer.json this package reads.
type fileJSON struct {
	AddedTokens []struct {
		ID      uint32 `json:"id"`
		Content string `json:"content"`
	} `json:"added_tokens"`
	Normalizer *struct {
		Type string `json:"type"`
	} `json:"normalizer"`
	PreTokenizer *preTokenizerJSON `json:"pre_tokenizer"`
	Model        struct {
		Type   string            `json:"type"`
		Vocab  map[string]uint32 `json:"vocab"`
		Merges json.RawMessage   `json:"merges"`
	} `json:"model"`
}

type preTokenizerJSON struct {
	Type          string             `json:"type"`
	Pretokenizers []preTokenizerJSON `json:"pretokenizers"`
	Pattern       *struct {
		Regex string `json:"Regex"`
	} `json:"pattern"`
}

// Parse builds a Tokenizer from the bytes of a tokenizer.json.
func Parse(data []byte) (*Tokenizer, error) {
	var f fileJSON
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, err
	}
	if f.Model.Type != "BPE" {
		return nil, fmt.Errorf("model type %q: only byte-level BPE is supported", f.Model.Type)
	}
	t := &Tokenizer{
		vocab:    f.Model.Vocab,
		merges:   make(map[uint64]merge),
		addedIDs: make(map[string]uint32),
		words:    newMemo(maxMemo, maxMemo*256),
		segs:     newMemo(maxMemo, maxMemoText),
		msgs:     make(map[string]jinja.Value),
	}
	if f.Normalizer != nil {
		switch f.Normalizer.Type {
		case "NFC":
			t.nfc = true
		default:
			return nil, fmt.Errorf("normalizer %q not supported", f.Normalizer.Type)
		}
	}
	pattern, err := splitPattern(f.PreTokenizer)
	if err != nil {
		return nil, err
	}
	if t.split, err = newSplitter(pattern); err != nil {
		return nil, fmt.Errorf("pre-tokenizer pattern: %w", err)
	}
	for b, r := range byteRunes {
		id, ok := t.vocab[string(r)]
		if !ok {
			return nil, fmt.Errorf("vocabulary lacks byte %#x", b)
		}
		t.bytes[b] = id
	}
	if err := t.loadMerges(f.Model.Merges); err != nil {
		return nil, err
	}
	for _, a := range f.AddedTokens {
		t.added = append(t.added, addedToken{a.Content, a.ID})
		t.addedIDs[a.Content] = a.ID
		if a.Content != "" {
			t.firstByte[a.Content[0]] = true
		}
	}
	for _, a := range t.added {
		if a.content == "" {
			continue
		}
		if t.onlyFirst == 0 {
			t.onlyFirst = a.content[0]
		} else if a.content[0] != t.onlyFirst {
			t.onlyFirst = 0
			break
		}
	}
	t.nvocab, t.vocab = len(t.vocab), nil
	// Longest first, so that a token that prefixes another never wins.
	for i := 1; i < len(t.added); i++ {
		for j := i; j > 0 && len(t.added[j].content) > len(t.added[j-1].content); j-- {
			t.added[j], t.added[j-1] = t.added[j-1], t.added[j]
		}
	}
	return t, nil
}

// splitPattern finds the Split regex of a ByteLevel pre-tokenizer sequence.
func splitPattern(p *preTokenizerJSON) (string, error) {
	if p == nil {
		return "", errors.New("no pre_tokenizer")
	}
	if p.Type == "Split" && p.Pattern != nil {
		return p.Pattern.Regex, nil
	}
	for i := range p.Pretokenizers {
		if s, err := splitPattern(&p.Pretokenizers[i]); err == nil {
			return s, nil
		}
	}
	return "", fmt.Errorf("pre_tokenizer %q has no Split pattern", p.Type)
}

// loadMerges reads merges either as ["a b", ...] or as [["a","b"], ...].
func (t *Tokenizer) loadMerges(raw json.RawMessage) error {
	var pairs [][2]string
	var strs []string
	if err := json.Unmarshal(raw, &strs); err == nil {
		for _, s := range strs {
			a, b, ok := strings.Cut(s, " ")
			if !ok {
				return fmt.Errorf("merge %q: want two symbols", s)
			}
			pairs = append(pairs, [2]string{a, b})
		}
	} else if err := json.Unmarshal(raw, &pairs); err != nil {
		return fmt.Errorf("merges: %w", err)
	}
	for rank, p := range pairs {
		a, okA := t.vocab[p[0]]
		b, okB := t.vocab[p[1]]
		m, okM := t.vocab[p[0]+p[1]]
		if !okA || !okB || !okM {
			return fmt.Errorf("merge %d (%q %q) names a symbol outside the vocabulary", rank, p[0], p[1])
		}
		key := uint64(a)<<32 | uint64(b)
		if _, dup := t.merges[key]; !dup {
			t.merges[key] = merge{uint32(rank), m}
		}
	}
	return nil
}

// Encode appends the token ids of text to out, with no special tokens
// added; added tokens written in the text (such as <|im_start|>) are
// recognised, as Hugging Face tokenizers do.
func (t *Tokenizer) Encode(text string, out []uint32) []uint32 {
	for text != "" {
		i, a := t.nextAdded(text)
		if i < 0 {
			return t.encodeSegment(text, out)
		}
		if i > 0 {
			out = t.encodeSegment(text[:i], out)
		}
		out = append(out, a.id)
		text = text[i+len(a.content):]
	}
	return out
}

// nextAdded finds the first added token in s, or -1. It scans s once for
// the tokens' first bytes; at each candidate the longest token wins.
func (t *Tokenizer) nextAdded(s string) (int, addedToken) {
	for i := 0; i < len(s); i++ {
		if t.onlyFirst != 0 {
			// One first byte for all added tokens ('<' in most models):
			// let IndexByte scan.
			j := strings.IndexByte(s[i:], t.onlyFirst)
			if j < 0 {
				break
			}
			i += j
		} else if !t.firstByte[s[i]] {
			continue
		}
		for _, a := range t.added {
			if strings.HasPrefix(s[i:], a.content) {
				return i, a
			}
		}
	}
	return -1, addedToken{}
}

// encodeSegment encodes text that holds no added token, memoised per
// segment: a conversation's next turn re-encodes only its new messages.
func (t *Tokenizer) encodeSegment(seg string, out []uint32) []uint32 {
	if ids, ok := t.segs.get(seg); ok {
		return append(out, ids...)
	}
	start := len(out)
	text := seg
	if t.nfc && !norm.NFC.IsNormalString(text) {
		text = norm.NFC.String(text)
	}
	t.split(text, func(piece string) { out = t.encodeWord(piece, out) })
	if len(seg) >= 64 {
		t.segs.put(seg, out[start:])
	}
	return out
}

// encodeWord runs BPE over one pre-token.
func (t *Tokenizer) encodeWord(w string, out []uint32) []uint32 {
	if ids, ok := t.words.get(w); ok {
		return append(out, ids...)
	}
	// BPE in place at the end of out: merges only shrink the symbols.
	start := len(out)
	for i := 0; i < len(w); i++ {
		out = append(out, t.bytes[w[i]])
	}
	sym := t.bpe(out[start:])
	out = out[:start+len(sym)]
	if len(w) <= 256 {
		t.words.put(w, sym)
	}
	return out
}

// bpe merges the lowest-ranked adjacent pair, all of its occurrences left to
// right, until no pair has a merge (openai/gpt-2 encoder.py's bpe()).
func (t *Tokenizer) bpe(sym []uint32) []uint32 {
	for len(sym) > 1 {
		best := merge{rank: ^uint32(0)}
		for i := 0; i+1 < len(sym); i++ {
			if m, ok := t.merges[uint64(sym[i])<<32|uint64(sym[i+1])]; ok && m.rank < best.rank {
				best = m
			}
		}
		if best.rank == ^uint32(0) {
			break
		}
		j := 0
		for i := 0; i < len(sym); i++ {
			if i+1 < len(sym) {
				if m, ok := t.merges[uint64(sym[i])<<32|uint64(sym[i+1])]; ok && m.rank == best.rank {
					sym[j] = m.id
					j++
					i++
					continue
				}
			}
			sym[j] = sym[i]
			j++
		}
		sym = sym[:j]
	}
	return sym
}

// VocabSize is the number of ids, added tokens included.
func (t *Tokenizer) VocabSize() int { return t.nvocab + len(t.added) }
