package prefix

import (
	"encoding/binary"
	"fmt"
	"math/bits"
	"unicode/utf16"
	"unicode/utf8"
	"unsafe"
)

// scanner is a one-pass JSON reader over a request body, just enough for
// Parse: it validates everything it reads (RFC 8259 grammar, as
// encoding/json does) and decodes only the values Parse keeps. Strings are
// scanned 8 bytes at a time; every kept
// decoded string is allocated once, at its exact size (a string without
// escapes is copied, one with escapes decoded, in a second pass).
//
// Unlike encoding/json, keys match exactly (case-sensitively, as vLLM's
// pydantic models do) and invalid UTF-8 inside strings is kept as is.
type scanner struct {
	b     []byte
	i     int
	esc   bool     // the last string str read held an escape
	depth int      // objects and arrays open at s.i
	lim   Limits   // resolved
	parts int      // content parts read, for Limits.Parts
	key   [32]byte // scratch for object keys
}

// syntaxErr reports a syntax error at the current offset.
func (s *scanner) syntaxErr(what string) error {
	if s.i >= len(s.b) {
		return fmt.Errorf("unexpected end of input, want %s", what)
	}
	return fmt.Errorf("offset %d: invalid character %q, want %s", s.i, s.b[s.i], what)
}

// typeErr reports a value of the wrong type for field, or, at the end of
// the input, a syntax error: a truncated body is not JSON at all.
func (s *scanner) typeErr(field, want string) error {
	if s.i >= len(s.b) {
		return s.syntaxErr(want)
	}
	return fmt.Errorf("offset %d: %s: %w, want %s", s.i, field, ErrType, want)
}

// ws skips whitespace and returns the next byte, or 0 at the end.
func (s *scanner) ws() byte {
	for ; s.i < len(s.b); s.i++ {
		switch c := s.b[s.i]; c {
		case ' ', '\t', '\n', '\r':
		default:
			return c
		}
	}
	return 0
}

// enter consumes the opening delimiter c ('{' or '[').
func (s *scanner) enter(c byte) error {
	if s.ws() != c {
		return s.syntaxErr(string(c))
	}
	s.i++
	return nil
}

// more reports whether another element follows in the object or array
// closed by end, n elements having been read; it consumes the ',' before
// the element, or end.
func (s *scanner) more(end byte, n int) (bool, error) {
	c := s.ws()
	if c == end {
		s.i++
		return false, nil
	}
	if n == 0 {
		return true, nil
	}
	if c != ',' {
		return false, s.syntaxErr(`"," or "` + string(end) + `"`)
	}
	s.i++
	return true, nil
}

// objectKey reads an object key and the ':' after it. The key is valid
// until the next call.
func (s *scanner) objectKey() ([]byte, error) {
	if s.ws() != '"' {
		return nil, s.syntaxErr("an object key")
	}
	k, err := s.str(s.key[:0], true)
	if err != nil {
		return nil, err
	}
	if s.ws() != ':' {
		return nil, s.syntaxErr(`":"`)
	}
	s.i++
	return k, nil
}

// null consumes a null literal if one comes next.
func (s *scanner) null() (bool, error) {
	if s.ws() != 'n' {
		return false, nil
	}
	return true, s.literal("null")
}

// literal consumes lit.
func (s *scanner) literal(lit string) error {
	if len(s.b)-s.i < len(lit) || string(s.b[s.i:s.i+len(lit)]) != lit {
		return s.syntaxErr(lit)
	}
	s.i += len(lit)
	return nil
}

// text reads a string or null ("").
func (s *scanner) text(field string) (string, error) {
	switch s.ws() {
	case '"':
		from := s.i
		if _, err := s.str(nil, false); err != nil {
			return "", err
		}
		if !s.esc {
			return intern(s.b[from+1 : s.i-1]), nil
		}
		end := s.i
		s.i = from
		b, _ := s.str(make([]byte, 0, end-from), true) // validated above
		return unsafe.String(unsafe.SliceData(b), len(b)), nil
	case 'n':
		return "", s.literal("null")
	}
	return "", s.typeErr(field, "a string")
}

// intern returns b as a string, without allocating for the usual roles.
func intern(b []byte) string {
	switch string(b) {
	case "":
		return ""
	case "system":
		return "system"
	case "user":
		return "user"
	case "assistant":
		return "assistant"
	case "tool":
		return "tool"
	}
	return string(b)
}

// raw skips a value and returns a copy of its JSON, or nil for null.
func (s *scanner) raw() ([]byte, error) {
	if null, err := s.null(); null || err != nil {
		return nil, err
	}
	from := s.i
	if err := s.skip(); err != nil {
		return nil, err
	}
	return append([]byte(nil), s.b[from:s.i]...), nil
}

// boolean reads true, false or null (false).
func (s *scanner) boolean(field string) (bool, error) {
	switch s.ws() {
	case 't':
		return true, s.literal("true")
	case 'f':
		return false, s.literal("false")
	case 'n':
		return false, s.literal("null")
	}
	return false, s.typeErr(field, "a boolean")
}

// integer reads an integer that fits in 64 bits; ok is false for null.
func (s *scanner) integer(field string) (v int64, ok bool, err error) {
	c := s.ws()
	if c == 'n' {
		return 0, false, s.literal("null")
	}
	if c != '-' && (c < '0' || c > '9') {
		return 0, false, s.typeErr(field, "an integer")
	}
	from := s.i
	frac, err := s.number()
	if err != nil {
		return 0, false, err
	}
	d := s.b[from:s.i]
	neg := d[0] == '-'
	if neg {
		d = d[1:]
	}
	if frac {
		return 0, false, s.typeErr(field, "an integer")
	}
	var u uint64
	for _, c := range d {
		if u > (1<<63)/10 {
			return 0, false, s.typeErr(field, "an integer")
		}
		u = u*10 + uint64(c-'0')
	}
	if u > 1<<63 || (!neg && u == 1<<63) {
		return 0, false, s.typeErr(field, "an integer")
	}
	if neg {
		return -int64(u), true, nil
	}
	return int64(u), true, nil
}

// number consumes a JSON number; frac reports a fraction or exponent.
func (s *scanner) number() (frac bool, err error) {
	b := s.b
	if s.i < len(b) && b[s.i] == '-' {
		s.i++
	}
	switch {
	case s.i < len(b) && b[s.i] == '0':
		s.i++
	case s.i < len(b) && b[s.i] >= '1' && b[s.i] <= '9':
		s.digits()
	default:
		return false, s.syntaxErr("a digit")
	}
	if s.i < len(b) && b[s.i] == '.' {
		s.i++
		if n := s.digits(); n == 0 {
			return false, s.syntaxErr("a digit")
		}
		frac = true
	}
	if s.i < len(b) && (b[s.i] == 'e' || b[s.i] == 'E') {
		s.i++
		if s.i < len(b) && (b[s.i] == '+' || b[s.i] == '-') {
			s.i++
		}
		if n := s.digits(); n == 0 {
			return false, s.syntaxErr("a digit")
		}
		frac = true
	}
	return frac, nil
}

// digits consumes a run of digits and returns its length.
func (s *scanner) digits() int {
	from := s.i
	for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
		s.i++
	}
	return s.i - from
}

// skip consumes any value, validating it.
func (s *scanner) skip() error {
	switch c := s.ws(); {
	case c == '"':
		_, err := s.str(nil, false)
		return err
	case c == '{' || c == '[':
		return s.skipContainer(c)
	case c == 't':
		return s.literal("true")
	case c == 'f':
		return s.literal("false")
	case c == 'n':
		return s.literal("null")
	case c == '-' || (c >= '0' && c <= '9'):
		_, err := s.number()
		return err
	}
	return s.syntaxErr("a value")
}

// skipContainer consumes an object or an array.
func (s *scanner) skipContainer(open byte) error {
	if err := s.down(); err != nil {
		return err
	}
	defer s.up()
	s.i++
	end := byte(']')
	if open == '{' {
		end = '}'
	}
	for n := 0; ; n++ {
		more, err := s.more(end, n)
		if err != nil || !more {
			return err
		}
		if open == '{' {
			if _, err := s.objectKey(); err != nil {
				return err
			}
		}
		if err := s.skip(); err != nil {
			return err
		}
	}
}

// Bytes of eight 8-bit lanes, for scanning strings a word at a time.
const (
	lanes1  = 0x0101010101010101
	lanes80 = 0x8080808080808080
)

// special marks, in the high bit of its lane, every byte of w that ends a
// run of plain string bytes: '"', '\\' or a control character. Only the
// lowest mark is exact (a borrow may mark lanes above it), which is all the
// scan uses.
func special(w uint64) uint64 {
	q := w ^ (lanes1 * '"')
	bs := w ^ (lanes1 * '\\')
	return ((q-lanes1)&^q | (bs-lanes1)&^bs | (w-lanes1*0x20)&^w) & lanes80
}

// str consumes the string at s.i (its opening quote). With keep, it appends
// the decoded string to dst and returns dst; without, it only validates.
func (s *scanner) str(dst []byte, keep bool) ([]byte, error) {
	b := s.b
	s.i++
	s.esc = false
	run := s.i
	for {
		for s.i+8 <= len(b) {
			if m := special(binary.LittleEndian.Uint64(b[s.i:])); m != 0 {
				s.i += bits.TrailingZeros64(m) >> 3
				break
			}
			s.i += 8
		}
		for s.i < len(b) && b[s.i] != '"' && b[s.i] != '\\' && b[s.i] >= 0x20 {
			s.i++
		}
		if s.i >= len(b) {
			return nil, s.syntaxErr(`a closing '"'`)
		}
		if keep {
			dst = append(dst, b[run:s.i]...)
		}
		switch b[s.i] {
		case '"':
			s.i++
			return dst, nil
		case '\\':
			s.esc = true
			var err error
			if dst, err = s.escape(dst, keep); err != nil {
				return nil, err
			}
			run = s.i
		default:
			return nil, s.syntaxErr("no control character in a string")
		}
	}
}

// escape consumes the escape sequence at s.i (its backslash), appending its
// character to dst when keep. Lone or reversed surrogates decode to U+FFFD,
// as in encoding/json.
func (s *scanner) escape(dst []byte, keep bool) ([]byte, error) {
	s.i++
	if s.i >= len(s.b) {
		return nil, s.syntaxErr("an escape")
	}
	c := s.b[s.i]
	s.i++
	var r rune
	switch c {
	case '"', '\\', '/':
		r = rune(c)
	case 'b':
		r = '\b'
	case 'f':
		r = '\f'
	case 'n':
		r = '\n'
	case 'r':
		r = '\r'
	case 't':
		r = '\t'
	case 'u':
		var ok bool
		if r, ok = s.hex4(); !ok {
			return nil, s.syntaxErr("4 hex digits")
		}
		if utf16.IsSurrogate(r) {
			r = s.surrogate(r)
		}
	default:
		s.i--
		return nil, s.syntaxErr("an escape")
	}
	if keep {
		dst = utf8.AppendRune(dst, r)
	}
	return dst, nil
}

// surrogate completes the high surrogate r with a following \uXXXX low
// surrogate if there is one, else returns U+FFFD.
func (s *scanner) surrogate(r rune) rune {
	if len(s.b)-s.i < 6 || s.b[s.i] != '\\' || s.b[s.i+1] != 'u' {
		return utf8.RuneError
	}
	save := s.i
	s.i += 2
	lo, ok := s.hex4()
	if d := utf16.DecodeRune(r, lo); ok && d != utf8.RuneError {
		return d
	}
	s.i = save // not a pair: the next escape decodes on its own
	return utf8.RuneError
}

// hex4 consumes 4 hex digits.
func (s *scanner) hex4() (rune, bool) {
	if len(s.b)-s.i < 4 {
		return 0, false
	}
	var r rune
	for _, c := range s.b[s.i : s.i+4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		case c >= 'A' && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	s.i += 4
	return r, true
}
