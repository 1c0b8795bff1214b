package emulator

import (
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/cespare/xxhash/v2"
)

// The emulator's tokenizer is not a real model's: it is a deterministic,
// prefix-stable stand-in with roughly the granularity of a BPE vocabulary
// (about 4 characters per token on English text).
//
// Splitting rules, applied left to right:
//   - the special tokens "<|im_start|>", "<|im_end|>" and "<|endoftext|>"
//     are one token each;
//   - a word (a run of letters, digits and marks) is cut into pieces of up to
//     PieceRunes runes; a single space just before a word belongs to the
//     word's first piece;
//   - every other rune (newline, other whitespace, punctuation, symbols) is
//     a token of its own.
//
// Prefix stability: if text A is a prefix of text B and A ends with a newline
// or B continues after A with whitespace, A's tokens are a prefix of B's.
// Chat prompts end with "assistant\n", so a conversation's next turn extends
// the previous turn's tokens.

// PieceRunes is the longest word piece, in runes.
const PieceRunes = 4

// VocabSize is the number of ordinary token ids: ids are 0..VocabSize-1,
// special tokens come right after.
const VocabSize = 100_000

// Special token ids.
const (
	// IMStart is the id of "<|im_start|>".
	IMStart uint32 = VocabSize + iota
	// IMEnd is the id of "<|im_end|>".
	IMEnd
	// EndOfText is the id of "<|endoftext|>".
	EndOfText
)

var specials = [...]string{"<|im_start|>", "<|im_end|>", "<|endoftext|>"}

// Tokenize returns the token ids of text. It is deterministic and
// prefix-stable (see the package notes above).
func Tokenize(text string) []uint32 {
	out := make([]uint32, 0, len(text)/3+1)
	split(text, func(piece string, special int) {
		out = append(out, pieceID(piece, special))
	})
	return out
}

// TokenizeStrs returns the token ids of text and the text of each token.
func TokenizeStrs(text string) ([]uint32, []string) {
	ids := make([]uint32, 0, len(text)/3+1)
	strs := make([]string, 0, len(text)/3+1)
	split(text, func(piece string, special int) {
		ids = append(ids, pieceID(piece, special))
		strs = append(strs, piece)
	})
	return ids, strs
}

// CountTokens returns len(Tokenize(text)) without allocating.
func CountTokens(text string) int {
	n := 0
	split(text, func(string, int) { n++ })
	return n
}

func pieceID(piece string, special int) uint32 {
	if special >= 0 {
		return VocabSize + uint32(special)
	}
	return uint32(xxhash.Sum64String(piece) % VocabSize)
}

// split calls emit for every token of text, with the index of the special
// token or -1.
func split(text string, emit func(piece string, special int)) {
	for i := 0; i < len(text); {
		if text[i] == '<' {
			if k := specialAt(text[i:]); k >= 0 {
				emit(specials[k], k)
				i += len(specials[k])
				continue
			}
		}
		r, size := utf8.DecodeRuneInString(text[i:])
		start := i
		if r == ' ' && i+size < len(text) {
			if next, _ := utf8.DecodeRuneInString(text[i+size:]); isWord(next) {
				i += size // the space joins the word's first piece
				r, size = next, 0
			}
		}
		if !isWord(r) {
			i += size
			emit(text[start:i], -1)
			continue
		}
		i = splitWord(text, start, i, emit)
	}
}

// splitWord emits the pieces of the word that starts at text[wordAt]
// (text[start:wordAt] is its leading space, if any) and returns the index
// after the word.
func splitWord(text string, start, wordAt int, emit func(string, int)) int {
	i, runes := wordAt, 0
	for i < len(text) {
		r, size := utf8.DecodeRuneInString(text[i:])
		if !isWord(r) {
			break
		}
		if runes == PieceRunes {
			emit(text[start:i], -1)
			start, runes = i, 0
		}
		i += size
		runes++
	}
	emit(text[start:i], -1)
	return i
}

func specialAt(s string) int {
	for k, sp := range specials {
		if strings.HasPrefix(s, sp) {
			return k
		}
	}
	return -1
}

func isWord(r rune) bool {
	return unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.IsMark(r)
}

// Message is one chat message: a role and its text content, and the tool
// calls of an assistant message as the template renders them (see
// RenderChatTools), empty for none.
type Message struct {
	Role      string
	Content   string
	ToolCalls string
}

// RenderChat renders messages through the emulator's fixed ChatML template:
// "<|im_start|>{role}\n{content}<|im_end|>\n" per message, then, if
// generationPrompt, "<|im_start|>assistant\n". A conversation's rendering is
// a prefix of its continuation's, and ends with a newline, so its tokens are
// a prefix of the continuation's tokens.
func RenderChat(messages []Message, generationPrompt bool) string {
	return RenderChatTools(messages, nil, generationPrompt)
}
