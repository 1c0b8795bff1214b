package proxy

import (
	"net/http"
	"net/http/pprof"
)

// routePprof serves Go's runtime profiles under /debug/pprof/ on the
// admin surface when Config.Pprof is set (behind its keys, as every admin
// path): the index and named profiles (heap, goroutine, allocs, block,
// mutex, threadcreate), a CPU profile (profile?seconds=N), an execution
// trace and symbol lookup, as net/http/pprof serves them. The command
// line (pprof's cmdline) is left out: flags may carry secrets, such as a
// --redis URL's password.
func (rt *Router) routePprof(mux *http.ServeMux, count func(string)) {
	if !rt.cfg.Pprof {
		return
	}
	handle(mux, http.MethodGet, "/debug/pprof/", pprof.Index, count) // other methods: 405
	mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("POST /debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("GET /debug/pprof/cmdline", func(w http.ResponseWriter, r *http.Request) {
		count(codeUnknownURL)
		writeNotFound(w, r)
	})
}
