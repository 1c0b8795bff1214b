package trace

import "math/rand/v2"

// words is the vocabulary of synthesised text: common lowercase English
// words, each a single token (with its leading space) in the BPE
// vocabularies of Llama 3, Qwen and GPT-4, so a segment of n tokens becomes
// n words and about n tokens.
var words = [...]string{
	"the", "of", "and", "to", "in", "is", "that", "for", "it", "as",
	"was", "with", "be", "by", "on", "not", "he", "this", "are", "or",
	"his", "from", "at", "which", "but", "have", "an", "had", "they", "you",
	"were", "their", "one", "all", "we", "can", "her", "has", "there", "been",
	"if", "more", "when", "will", "would", "who", "so", "no", "she", "other",
	"its", "may", "these", "what", "them", "than", "some", "him", "time", "into",
	"only", "do", "two", "first", "new", "could", "also", "any", "our", "then",
	"made", "like", "over", "such", "after", "most", "used", "many", "where", "well",
	"way", "work", "even", "because", "each", "year", "world", "day", "part", "water",
	"number", "long", "people", "state", "house", "system", "city", "group", "place", "case",
	"point", "line", "order", "small", "large", "light", "music", "story", "model", "data",
	"field", "power", "river", "paper", "table", "road", "market", "game", "book", "form",
	"change", "value", "level", "plan", "class", "team", "line", "voice", "color", "rate",
	"cache", "route", "token", "block", "query", "file", "code", "test", "user", "server",
	"simple", "clear", "fast", "slow", "green", "blue", "red", "white", "black", "open",
	"close", "start", "end", "high", "low", "early", "late", "real", "full", "free",
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
