package tokenizer

import "strings"

// splitConcats rewrites each output tag of a Jinja template that
// concatenates onto a string literal, {{- 'a' + x + y }}, into one output
// tag per operand, {{- 'a' }}{{ x }}{{ y }}. The rendered text is the same
// (in ardanlabs/jinja, string + anything appends the operand's printed form,
// and an output tag writes the printed form), but each message's content is
// written once instead of being copied by every + after it: chat templates
// concatenate every message this way, so this halves the work of rendering
// a long conversation. Tags it does not fully understand are left as they
// are.
func splitConcats(src string) string {
	var b strings.Builder
	last := 0
	for i := 0; i+1 < len(src); i++ {
		if src[i] != '{' {
			continue
		}
		var closer string
		switch src[i+1] {
		case '{':
			closer = "}}"
		case '%':
			closer = "%}"
		case '#':
			closer = "#}"
		default:
			continue
		}
		end := tagEnd(src, i+2, closer)
		if end < 0 {
			return src // unterminated: let jinja.Compile report it
		}
		if closer == "}}" {
			if parts, ok := concatParts(src[i:end]); ok {
				b.WriteString(src[last:i])
				b.WriteString(parts)
				last = end
			}
		}
		i = end - 1
	}
	if last == 0 {
		return src
	}
	b.WriteString(src[last:])
	return b.String()
}

// tagEnd returns the index just past closer, skipping quoted strings (except
// in comments, as jinja's scanner does), or -1.
func tagEnd(src string, i int, closer string) int {
	for ; i < len(src); i++ {
		if c := src[i]; closer != "#}" && (c == '\'' || c == '"') {
			j := skipString(src, i)
			if j < 0 {
				return -1
			}
			i = j - 1
			continue
		}
		if strings.HasPrefix(src[i:], closer) {
			return i + len(closer)
		}
	}
	return -1
}

// skipString returns the index just past the string literal at src[i], or -1.
func skipString(src string, i int) int {
	q := src[i]
	for i++; i < len(src); i++ {
		switch src[i] {
		case '\\':
			i++
		case q:
			return i + 1
		}
	}
	return -1
}

// concatParts splits the output tag tag ("{{- 'a' + x }}") at its top-level
// + signs into one tag per operand. ok is false unless the first operand is
// a string literal and every operand is a plain postfix expression (names,
// attributes, subscripts, calls, filters).
func concatParts(tag string) (string, bool) {
	inner := tag[2 : len(tag)-2]
	open, close := "{{", "}}"
	if strings.HasPrefix(inner, "-") {
		open, inner = "{{-", inner[1:]
	}
	if strings.HasSuffix(inner, "-") {
		close, inner = "-}}", inner[:len(inner)-1]
	}
	var ops []string
	depth, start := 0, 0
	for i := 0; i < len(inner); i++ {
		switch c := inner[i]; c {
		case '\'', '"':
			j := skipString(inner, i)
			if j < 0 {
				return "", false
			}
			i = j - 1
		case '(', '[':
			depth++
		case ')', ']':
			depth--
		case '+':
			if depth == 0 {
				ops = append(ops, strings.TrimSpace(inner[start:i]))
				start = i + 1
			}
		}
	}
	ops = append(ops, strings.TrimSpace(inner[start:]))
	if len(ops) < 2 || depth != 0 || !isStringLiteral(ops[0]) {
		return "", false
	}
	for _, op := range ops {
		if !isPostfix(op) {
			return "", false
		}
	}
	var b strings.Builder
	for i, op := range ops {
		o, c := "{{ ", " }}"
		if i == 0 {
			o = open + " "
		}
		if i == len(ops)-1 {
			c = " " + close
		}
		b.WriteString(o + op + c)
	}
	return b.String(), true
}

func isStringLiteral(s string) bool {
	return s != "" && (s[0] == '\'' || s[0] == '"') && skipString(s, 0) == len(s)
}

// isPostfix reports whether s is a literal, or a name followed by
// attributes, subscripts, calls and filters, with nothing at its top level
// but name characters, dots, and pipes (spaces only around pipes): no
// operator, keyword or test that could bind looser than +.
func isPostfix(s string) bool {
	if s == "" {
		return false
	}
	depth := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '\'' || c == '"':
			j := skipString(s, i)
			if j < 0 {
				return false
			}
			i = j - 1
		case c == '(' || c == '[':
			depth++
		case c == ')' || c == ']':
			depth--
		case depth > 0:
		case c == ' ':
			// Only "x | f": a space must sit next to a pipe.
			if !(i > 0 && s[i-1] == '|') && !(i+1 < len(s) && s[i+1] == '|') {
				return false
			}
		case c == '|', c == '.', c == '_',
			'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		default:
			return false
		}
	}
	return depth == 0
}
