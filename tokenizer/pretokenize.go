package tokenizer

import (
	"unicode"
	"unicode/utf8"

	"github.com/dlclark/regexp2/v2"
)

// qwenPattern is the split pattern of Qwen2/Qwen3's tokenizer.json
// pre-tokenizer (also cl100k-like GPT-4 tokenizers minus the 1-3 digit
// groups). splitQwen implements it by hand; any other pattern goes through
// regexp2, which is 5-10x slower.
const qwenPattern = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`

// splitter cuts normalised text into pre-tokens and calls f with each.
type splitter func(s string, f func(piece string))

func newSplitter(pattern string) (splitter, error) {
	if pattern == qwenPattern {
		return splitQwen, nil
	}
	re, err := regexp2.Compile(pattern, regexp2.Unicode)
	if err != nil {
		return nil, err
	}
	return func(s string, f func(string)) { splitRegexp(re, s, f) }, nil
}

// splitRegexp emits the matches of re and the gaps between them (the
// "Isolated" split behaviour of Hugging Face tokenizers).
func splitRegexp(re *regexp2.Regexp, s string, f func(string)) {
	last := 0
	idx, _ := re.FindAllStringIndex(s, -1)
	for _, m := range idx {
		if m[0] > last {
			f(s[last:m[0]])
		}
		if m[1] > m[0] {
			f(s[m[0]:m[1]])
		}
		last = m[1]
	}
	if last < len(s) {
		f(s[last:])
	}
}

// splitQwen is qwenPattern by hand: at each position it takes the first
// alternative that matches, as a backtracking regex engine does.
func splitQwen(s string, f func(string)) {
	for i := 0; i < len(s); {
		n := matchQwen(s, i)
		f(s[i : i+n])
		i += n
	}
}

// matchQwen returns the length of qwenPattern's match at s[i:] (always ≥ 1
// byte: the alternatives together cover every rune).
func matchQwen(s string, i int) int {
	r, w := utf8.DecodeRuneInString(s[i:])
	if r == '\'' {
		if n := contraction(s[i+1:]); n > 0 {
			return 1 + n
		}
	}
	// [^\r\n\p{L}\p{N}]?\p{L}+
	if isLetter(r) {
		return w + letters(s[i+w:])
	}
	if r != '\r' && r != '\n' && !isNumber(r) && i+w < len(s) {
		if r2, _ := utf8.DecodeRuneInString(s[i+w:]); isLetter(r2) {
			return w + letters(s[i+w:])
		}
	}
	// \p{N}
	if isNumber(r) {
		return w
	}
	// ' ?[^\s\p{L}\p{N}]+[\r\n]*'
	if n := punct(s, i); n > 0 {
		return n
	}
	// whitespace alternatives: \s*[\r\n]+ | \s+(?!\S) | \s+
	j, lastNL := i, -1
	for j < len(s) {
		r, w := utf8.DecodeRuneInString(s[j:])
		if !unicode.IsSpace(r) {
			break
		}
		if r == '\r' || r == '\n' {
			lastNL = j
		}
		j += w
	}
	if lastNL >= 0 {
		return lastNL + 1 - i
	}
	if j == len(s) {
		return j - i
	}
	// Followed by a non-space: leave the last whitespace rune to it, unless
	// the run is one rune long.
	_, lw := utf8.DecodeLastRuneInString(s[i:j])
	if j-lw > i {
		return j - lw - i
	}
	return j - i
}

// contraction matches (?i:s|t|re|ve|m|ll|d) after an apostrophe.
func contraction(s string) int {
	lower := func(k int) byte {
		if k >= len(s) {
			return 0
		}
		c := s[k]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		return c
	}
	switch c := lower(0); c {
	case 's', 't', 'm', 'd':
		return 1
	case 'r', 'v':
		if lower(1) == 'e' {
			return 2
		}
	case 'l':
		if lower(1) == 'l' {
			return 2
		}
	}
	return 0
}

func letters(s string) int {
	n := 0
	for n < len(s) {
		r, w := utf8.DecodeRuneInString(s[n:])
		if !isLetter(r) {
			break
		}
		n += w
	}
	return n
}

// punct matches ' ?[^\s\p{L}\p{N}]+[\r\n]*' at s[i:], or returns 0.
func punct(s string, i int) int {
	j := i
	if s[j] == ' ' {
		j++
	}
	k := j
	for k < len(s) {
		r, w := utf8.DecodeRuneInString(s[k:])
		if unicode.IsSpace(r) || isLetter(r) || isNumber(r) {
			break
		}
		k += w
	}
	if k == j {
		return 0
	}
	for k < len(s) && (s[k] == '\r' || s[k] == '\n') {
		k++
	}
	return k - i
}

func isLetter(r rune) bool {
	if r < utf8.RuneSelf {
		return 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z'
	}
	return unicode.IsLetter(r)
}

func isNumber(r rune) bool {
	if r < utf8.RuneSelf {
		return '0' <= r && r <= '9'
	}
	return unicode.IsNumber(r)
}
