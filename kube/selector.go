package kube

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Operators of a label selector's requirement.
const (
	OpIn       = "in"
	OpNotIn    = "notin"
	OpEquals   = "="
	OpNotEqual = "!="
	OpExists   = "exists"
	OpNotExist = "!"
	OpGreater  = ">"
	OpLess     = "<"
)

// Requirement is one comma-separated term of a label selector: Key, an
// operator and its values ("==" is read as "=").
type Requirement struct {
	Key    string
	Op     string
	Values []string // one for =, != , > and <; none for exists and !
}

// Selector is a parsed label selector: every requirement must hold. The
// zero Selector selects everything.
type Selector struct {
	Reqs []Requirement
	text string
}

// String is the selector as it was given, for the API's labelSelector.
func (s Selector) String() string { return s.text }

// ParseSelector reads a label selector as the API server does
// (k8s.io/apimachinery/pkg/labels.Parse):
//
//	selector    ::= requirement | requirement "," selector
//	requirement ::= ["!"] KEY [ set | exact ]
//	set         ::= ("in" | "notin") "(" VALUE ["," VALUE]... ")"
//	exact       ::= ("=" | "==" | "!=" | ">" | "<") VALUE
//
// KEY is [DNS_SUBDOMAIN "/"] NAME (app.kubernetes.io/name), NAME and
// VALUE at most 63 characters of [A-Za-z0-9_.-] beginning and ending
// alphanumeric (VALUE may be empty), and blanks separate tokens: "tier in
// (a, b),!canary,app.kubernetes.io/name=vllm". "in" and "notin" are
// operators after a key and plain words elsewhere; ">" and "<" take an
// integer. A set may hold empty values ("x in (a,,b)", "x in ()").
func ParseSelector(text string) (Selector, error) {
	p := &parser{toks: lex(text)}
	reqs, err := p.selector()
	if err != nil {
		return Selector{}, fmt.Errorf("label selector %q: %w", text, err)
	}
	return Selector{Reqs: reqs, text: strings.TrimSpace(text)}, nil
}

// Matches reports whether labels satisfy every requirement.
func (s Selector) Matches(labels map[string]string) bool {
	for _, r := range s.Reqs {
		if !r.matches(labels) {
			return false
		}
	}
	return true
}

func (r Requirement) matches(labels map[string]string) bool {
	v, has := labels[r.Key]
	switch r.Op {
	case OpExists:
		return has
	case OpNotExist:
		return !has
	case OpEquals:
		return has && v == r.Values[0]
	case OpNotEqual:
		return !has || v != r.Values[0]
	case OpIn:
		return has && slices.Contains(r.Values, v)
	case OpNotIn:
		return !has || !slices.Contains(r.Values, v)
	case OpGreater, OpLess:
		n, err := strconv.ParseInt(v, 10, 64)
		if !has || err != nil {
			return false
		}
		want, _ := strconv.ParseInt(r.Values[0], 10, 64)
		return r.Op == OpGreater && n > want || r.Op == OpLess && n < want
	}
	return false
}

// token kinds of the lexer: a word (key, value, or "in"/"notin", told
// apart by the parser from where it stands) or one of the symbols.
const (
	tWord = iota
	tSym  // = == != ! ( ) , > <
	tEnd
)

type token struct {
	kind int
	text string
}

// symbols the lexer knows; a longer one wins ("!=" over "!").
var symbols = []string{"==", "!=", "=", "!", "(", ")", ",", ">", "<"}

func special(c byte) bool { return strings.IndexByte("=!(),<>", c) >= 0 }
func blank(c byte) bool   { return c == ' ' || c == '\t' || c == '\r' || c == '\n' }

// lex cuts text into words and symbols; a run of symbol characters is cut
// greedily into known symbols, as the API server does ("=!" is "=" "!").
func lex(text string) []token {
	var out []token
	for i := 0; i < len(text); {
		switch c := text[i]; {
		case blank(c):
			i++
		case special(c):
			sym := ""
			for _, s := range symbols {
				if strings.HasPrefix(text[i:], s) {
					sym = s
					break
				}
			}
			out = append(out, token{tSym, sym})
			i += len(sym)
		default:
			j := i
			for j < len(text) && !blank(text[j]) && !special(text[j]) {
				j++
			}
			out = append(out, token{tWord, text[i:j]})
			i = j
		}
	}
	return append(out, token{kind: tEnd})
}

type parser struct {
	toks []token
	at   int
}

func (p *parser) peek() token { return p.toks[p.at] }
func (p *parser) next() token {
	t := p.toks[p.at]
	if t.kind != tEnd {
		p.at++
	}
	return t
}

func (t token) is(sym string) bool { return t.kind == tSym && t.text == sym }

func (t token) String() string {
	if t.kind == tEnd {
		return "end of string"
	}
	return strconv.Quote(t.text)
}

func (p *parser) selector() ([]Requirement, error) {
	var reqs []Requirement
	if p.peek().kind == tEnd {
		return nil, nil
	}
	for {
		r, err := p.requirement()
		if err != nil {
			return nil, err
		}
		reqs = append(reqs, r)
		switch t := p.next(); {
		case t.kind == tEnd:
			return reqs, nil
		case t.is(","):
			if n := p.peek(); n.kind != tWord && !n.is("!") {
				return nil, fmt.Errorf("found %s, want a key after ','", n)
			}
		default:
			return nil, fmt.Errorf("found %s, want ',' or the end", t)
		}
	}
}

func (p *parser) requirement() (Requirement, error) {
	r := Requirement{Op: OpExists}
	t := p.next()
	if t.is("!") {
		r.Op = OpNotExist
		t = p.next()
	}
	if t.kind != tWord {
		return r, fmt.Errorf("found %s, want a key", t)
	}
	if err := checkKey(t.text); err != nil {
		return r, err
	}
	r.Key = t.text
	if n := p.peek(); n.kind == tEnd || n.is(",") || r.Op == OpNotExist {
		return r, nil
	}
	op := p.next()
	switch {
	case op.kind == tWord && (op.text == OpIn || op.text == OpNotIn):
		r.Op = op.text
		vals, err := p.set()
		if err != nil {
			return r, err
		}
		r.Values = vals
	case op.is("=") || op.is("==") || op.is("!=") || op.is(">") || op.is("<"):
		r.Op = op.text
		if op.text == "==" {
			r.Op = OpEquals
		}
		v, err := p.exact()
		if err != nil {
			return r, err
		}
		if r.Op == OpGreater || r.Op == OpLess {
			if _, err := strconv.ParseInt(v, 10, 64); err != nil {
				return r, fmt.Errorf("%s %s %q: want an integer", r.Key, r.Op, v)
			}
		}
		r.Values = []string{v}
	default:
		return r, fmt.Errorf("found %s after %s, want one of in, notin, =, ==, !=, >, <", op, r.Key)
	}
	for _, v := range r.Values {
		if err := checkValue(v); err != nil {
			return r, fmt.Errorf("%s: %w", r.Key, err)
		}
	}
	return r, nil
}

// exact reads the value after =, ==, !=, > or <: a word, or nothing
// before ',' or the end (the empty value).
func (p *parser) exact() (string, error) {
	if n := p.peek(); n.kind == tEnd || n.is(",") {
		return "", nil
	}
	t := p.next()
	if t.kind != tWord {
		return "", fmt.Errorf("found %s, want a value", t)
	}
	return t.text, nil
}

// set reads "(" values ")"; a value left out between commas, or the
// whole list left out, is the empty value.
func (p *parser) set() ([]string, error) {
	if t := p.next(); !t.is("(") {
		return nil, fmt.Errorf("found %s, want '('", t)
	}
	var vals []string
	add := func(v string) {
		if !slices.Contains(vals, v) {
			vals = append(vals, v)
		}
	}
	want := true // a value may stand here
	for {
		switch t := p.next(); {
		case t.kind == tWord && want:
			add(t.text)
			want = false
		case t.is(","):
			if want {
				add("")
			}
			want = true
		case t.is(")"):
			if want {
				add("")
			}
			return vals, nil
		default:
			return nil, fmt.Errorf("found %s in a value set, want a value, ',' or ')'", t)
		}
	}
}

var (
	nameRE   = regexp.MustCompile(`^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$`)
	subdomRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
)

// checkKey checks a label key: [prefix "/"] name, the prefix a DNS
// subdomain of at most 253 characters, the name at most 63.
func checkKey(k string) error {
	prefix, name, ok := strings.Cut(k, "/")
	if !ok {
		prefix, name = "", k
	} else if prefix == "" || len(prefix) > 253 || !subdomRE.MatchString(prefix) {
		return fmt.Errorf("key %q: the prefix must be a DNS subdomain (lower-case, at most 253 characters)", k)
	}
	if len(name) > 63 || !nameRE.MatchString(name) {
		return fmt.Errorf("key %q: the name must be 1 to 63 characters of [A-Za-z0-9_.-], alphanumeric at each end", k)
	}
	return nil
}

// checkValue checks a label value: empty, or at most 63 characters of
// [A-Za-z0-9_.-], alphanumeric at each end.
func checkValue(v string) error {
	if v != "" && (len(v) > 63 || !nameRE.MatchString(v)) {
		return fmt.Errorf("value %q: want at most 63 characters of [A-Za-z0-9_.-], alphanumeric at each end", v)
	}
	return nil
}
