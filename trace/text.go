package trace

import "math/rand/v2"

// words is the vocabulary of synthesised text: common lowercase English
// words of at most emulator.PieceRunes (4) letters, each a single token
// (with its leading space) in the BPE vocabularies of Llama 3, Qwen and
// GPT-4 and in the emulator's tokenizer, so a segment of n tokens becomes
// n words and about n tokens on a real engine and on an emulated one
// alike (TestTextTokens).
var words = [...]string{
	"the", "of", "and", "to", "in", "is", "that", "for", "it", "as",
	"was", "with", "be", "by", "on", "not", "he", "this", "are", "or",
	"his", "from", "at", "but", "have", "an", "had", "they", "you", "were",
	"one", "all", "we", "can", "her", "has", "been", "if", "more", "when",
	"will", "who", "so", "no", "she", "its", "may", "what", "them", "than",
	"some", "him", "time", "into", "only", "do", "two", "new", "also", "any",
	"our", "then", "made", "like", "over", "such", "most", "used", "many", "well",
	"way", "work", "even", "each", "year", "day", "part", "long", "city", "case",
	"line", "data", "road", "game", "book", "form", "plan", "team", "rate", "file",
	"code", "test", "user", "fast", "slow", "blue", "red", "open", "end", "high",
	"low", "late", "real", "full", "free", "man", "see", "use", "how", "out",
	"get", "now", "just", "know", "take", "good", "make", "back", "very", "much",
	"old", "same", "home", "life", "hand", "give", "find", "last",
}

// AppendText appends to dst the prompt's synthesised text: each segment's
// text in order (see AppendSegmentText). Equal leading segments give equal
// leading text, so prefix caches see the same reuse as with Hashes.
func (r *Request) AppendText(dst []byte) []byte {
	for _, s := range r.Segments {
		dst = AppendSegmentText(dst, s)
	}
	return dst
}

// Text returns the prompt's synthesised text (see AppendText), about Prompt
// tokens long.
func (r *Request) Text() string {
	return string(r.AppendText(make([]byte, 0, r.Prompt*6)))
}

// AppendSegmentText appends to dst the text of s: s.Tokens words, each
// followed by a space, drawn deterministically from s.ID. A shorter segment
// with the same ID gives a prefix of a longer one's text, so a Mooncake hash
// id always stands for the same 512 words.
func AppendSegmentText(dst []byte, s Segment) []byte {
	rng := rand.New(rand.NewPCG(s.ID, 0x6b76726f75746572)) // "kvrouter"
	for range s.Tokens {
		dst = append(dst, words[rng.IntN(len(words))]...)
		dst = append(dst, ' ')
	}
	return dst
}
