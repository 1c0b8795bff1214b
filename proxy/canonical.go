package proxy

import (
	"net/http"
	"path"
)

// canonical answers, in JSON and counted by count, the requests
// http.ServeMux would answer itself in plain text or HTML: a path that is
// not in its clean form ("//v1/chat/completions", "/v1/../health"), which
// ServeMux redirects, gets 404 unknown_url naming the clean one; CONNECT,
// which ServeMux answers "404 page not found", gets 405. Errors net/http
// answers before any handler runs (a malformed request line or header, a
// header past MaxHeaderBytes, an unknown Transfer-Encoding or HTTP
// version, an Expect other than 100-continue) stay net/http's plain text,
// counted by connWatch.
func canonical(count func(code string), next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch p := r.URL.Path; {
		case r.Method == http.MethodConnect:
			count(codeMethodNotAllowed)
			writeError(w, http.StatusMethodNotAllowed, errInvalidRequest, codeMethodNotAllowed, "Method CONNECT is not allowed")
		case p != "*" && cleanPath(p) != p:
			count(codeUnknownURL)
			writeError(w, http.StatusNotFound, errInvalidRequest, codeUnknownURL,
				"Invalid URL ("+r.Method+" "+p+"): not in its clean form, "+cleanPath(p))
		default:
			next.ServeHTTP(w, r)
		}
	})
}

// cleanPath is p as http.ServeMux cleans it: rooted, without empty, "."
// or ".." elements, its trailing slash kept.
func cleanPath(p string) string {
	if p == "" {
		return "/"
	}
	if p[0] != '/' {
		p = "/" + p
	}
	np := path.Clean(p)
	if p[len(p)-1] == '/' && np != "/" {
		np += "/"
	}
	return np
}
