package sse

import (
	"bytes"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// Keys a Splice reads from every event without decoding it whole.
var (
	contentKey   = []byte(`"content"`)
	textKey      = []byte(`"text"`)
	reasoningKey = []byte(`"reasoning_content"`)
	reasonKey    = []byte(`"reasoning"`)
	toolCallsKey = []byte(`"tool_calls"`)
	emptyChoices = []byte(`"choices":[]`)
)

// StringField appends to dst the decoded value of the first member key
// (quoted, as in contentKey) of the JSON object data whose value is a
// string, and reports whether there was one; ok is false, with dst as it
// was, when there is none or it is malformed. A member whose value is not
// a string (logprobs' "content": [...]) is skipped. The byte pattern
// `"key":"` cannot occur inside a JSON string, where quotes are escaped.
func StringField(dst, data, key []byte) (out []byte, ok bool) {
	for off := 0; ; {
		i := bytes.Index(data[off:], key)
		if i < 0 {
			return dst, false
		}
		off += i + len(key)
		if q := stringAfter(data, off); q >= 0 {
			return appendUnquoted(dst, data[q+1:])
		}
	}
}

// stringAfter returns where, in data, the value of the member whose key
// ends at j opens its quote, or -1 when no colon and string follow.
func stringAfter(data []byte, j int) int {
	j = skipSpace(data, j)
	if j >= len(data) || data[j] != ':' {
		return -1
	}
	j = skipSpace(data, j+1)
	if j >= len(data) || data[j] != '"' {
		return -1
	}
	return j
}

// HasValue reports whether data has a member key whose value is neither
// null, false, an empty string nor an empty array.
func HasValue(data, key []byte) bool {
	for off := 0; ; {
		i := bytes.Index(data[off:], key)
		if i < 0 {
			return false
		}
		off += i + len(key)
		if valueAfter(data, off) {
			return true
		}
	}
}

// valueAfter reports whether the member of data whose key ends at j has a
// value that is neither null, false, an empty string nor an empty array.
func valueAfter(data []byte, j int) bool {
	j = skipSpace(data, j)
	if j >= len(data) || data[j] != ':' {
		return false
	}
	v := data[skipSpace(data, j+1):]
	for _, empty := range [...]string{"null", "false", `""`, "[]"} {
		if bytes.HasPrefix(v, []byte(empty)) {
			return false
		}
	}
	if len(v) == 0 || v[0] == '}' || v[0] == ',' {
		return false
	}
	if v[0] != '[' {
		return true
	}
	k := skipSpace(v, 1)
	return k >= len(v) || v[k] != ']'

}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// appendUnquoted appends to dst the JSON string whose body (after its
// opening quote) starts s, decoded, up to its closing quote.
func appendUnquoted(dst, s []byte) ([]byte, bool) {
	n := len(dst)
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == '"':
			return dst, true
		case c < 0x20:
			return dst[:n], false
		case c != '\\':
			dst = append(dst, c)
			i++
			continue
		}
		if i+1 >= len(s) {
			return dst[:n], false
		}
		switch e := s[i+1]; e {
		case '"', '\\', '/':
			dst = append(dst, e)
		case 'b':
			dst = append(dst, '\b')
		case 'f':
			dst = append(dst, '\f')
		case 'n':
			dst = append(dst, '\n')
		case 'r':
			dst = append(dst, '\r')
		case 't':
			dst = append(dst, '\t')
		case 'u':
			r, w := unicodeEscape(s[i:])
			if w == 0 {
				return dst[:n], false
			}
			dst = utf8.AppendRune(dst, r)
			i += w
			continue
		default:
			return dst[:n], false
		}
		i += 2
	}
	return dst[:n], false
}

// unicodeEscape decodes a \uXXXX escape at the start of s (a surrogate
// pair when one follows), returning the rune and the bytes it took, 0 if
// malformed. A lone surrogate becomes U+FFFD, as encoding/json does.
func unicodeEscape(s []byte) (rune, int) {
	r := hex4(s)
	if r < 0 {
		return 0, 0
	}
	if utf16.IsSurrogate(r) {
		if r2 := hex4(s[min(6, len(s)):]); r2 >= 0 {
			if d := utf16.DecodeRune(r, r2); d != utf8.RuneError {
				return d, 12
			}
		}
		return utf8.RuneError, 6
	}
	return r, 6
}

// hex4 reads `\uXXXX` at the start of s, or returns -1.
func hex4(s []byte) rune {
	if len(s) < 6 || s[0] != '\\' || s[1] != 'u' {
		return -1
	}
	v, err := strconv.ParseUint(string(s[2:6]), 16, 16)
	if err != nil {
		return -1
	}
	return rune(v)
}
