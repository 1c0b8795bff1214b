package proxy

import (
	"net/http"
	"path"
	"strings"
)

// passList is the compiled Config.PassThrough: the paths, besides the
// routed ones, forwarded to a replica. The zero value passes nothing.
type passList struct {
	all      bool     // "/" was listed: every path passes
	prefixes []string // as listed
}

func newPassList(prefixes []string) passList {
	l := passList{prefixes: prefixes}
	for _, p := range prefixes {
		if p == "/" {
			l.all = true
		}
	}
	return l
}

// allows reports whether r's path may pass through. A prefix ending in
// "/" matches the paths below it; any other matches itself and the paths
// below it ("/tokenize" matches "/tokenize/x", not "/tokenizex"). Paths
// that are not clean, or that hide a separator or a dot segment in
// percent-encoding (or are encoded twice), never pass (unless every path
// does): a replica could resolve them to a path the list does not allow.
func (l passList) allows(r *http.Request) bool {
	_, ok := l.match(r)
	return ok
}

// match is allows that also returns the listed prefix r's path matched
// ("/" when every path passes): the pass-through metrics' bounded label.
func (l passList) match(r *http.Request) (string, bool) {
	if l.all {
		return "/", true
	}
	p := r.URL.Path
	if p == "" || path.Clean(p) != p || strings.ContainsAny(p, "\\%") || hidesSeparator(r.URL.EscapedPath()) {
		return "", false
	}
	for _, pre := range l.prefixes {
		if strings.HasSuffix(pre, "/") {
			if strings.HasPrefix(p, pre) {
				return pre, true
			}
			continue
		}
		if p == pre || strings.HasPrefix(p, pre) && p[len(pre)] == '/' {
			return pre, true
		}
	}
	return "", false
}

// hidesSeparator reports whether an escaped path percent-encodes a slash,
// a backslash or a dot.
func hidesSeparator(escaped string) bool {
	s := strings.ToLower(escaped)
	return strings.Contains(s, "%2f") || strings.Contains(s, "%5c") || strings.Contains(s, "%2e")
}
