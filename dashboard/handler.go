package dashboard

import (
	"context"
	"embed"
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"github.com/kvrouter/kvrouter/view"
)

// assets holds the page: HTML, CSS and script, written for this package
// (no third-party code).
//
//go:embed assets/index.html assets/style.css assets/app.js
var assets embed.FS

// DefaultDecisions is how many decisions /ui/api/decisions returns when n
// is not given; MaxDecisions caps n.
const (
	DefaultDecisions = 50
	MaxDecisions     = 1000
)

// handler serves the page and the API over one Source.
type handler struct {
	src  Source
	now  func() time.Time // time.Now outside tests
	mux  *http.ServeMux
	hist *history
}

// New returns the dashboard's handler over src. It answers GET (and HEAD)
// on /ui and /ui/ (the page), /ui/style.css, /ui/app.js, /ui/api/fleet,
// /ui/api/decisions?n=N and /ui/api/series?range=D, and 404 for anything
// else. The handler keeps the time series of the last SeriesWindow,
// sampled as /ui/api/fleet and /ui/api/series are polled (at most once per
// SeriesStep), in a ring of fixed size; NewHandler's also samples in the
// background. Mount it with
// mux.Handle("/ui/", dashboard.New(src)): http.ServeMux then redirects /ui
// to /ui/.
func New(src Source) http.Handler { return newHandler(src).mux }

// newHandler returns the handler New serves with.
func newHandler(src Source) *handler {
	h := &handler{src: src, now: time.Now, mux: http.NewServeMux(), hist: newHistory(SeriesStep, SeriesWindow)}
	h.mux.HandleFunc("GET /ui", h.servePage)
	h.mux.HandleFunc("GET /ui/{$}", h.servePage)
	h.mux.HandleFunc("GET /ui/style.css", h.serveAsset("assets/style.css", "text/css; charset=utf-8"))
	h.mux.HandleFunc("GET /ui/app.js", h.serveAsset("assets/app.js", "text/javascript; charset=utf-8"))
	h.mux.HandleFunc("GET /ui/api/fleet", h.serveFleet)
	h.mux.HandleFunc("GET /ui/api/decisions", h.serveDecisions)
	h.mux.HandleFunc("GET /ui/api/series", h.serveSeries)
	return h
}

func (h *handler) servePage(w http.ResponseWriter, r *http.Request) {
	h.serveAsset("assets/index.html", "text/html; charset=utf-8")(w, r)
}

// serveAsset returns a handler writing one embedded file.
func (h *handler) serveAsset(name, contentType string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		b, err := assets.ReadFile(name)
		if err != nil {
			http.Error(w, "asset missing", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", contentType)
		w.Header().Set("Cache-Control", "no-cache")
		w.Write(b)
	}
}

// serveFleet answers GET /ui/api/fleet with the fleet as of now, and
// samples it for the time series.
func (h *handler) serveFleet(w http.ResponseWriter, r *http.Request) {
	now := h.now()
	f := h.src.Fleet(now)
	h.hist.record(now, func() view.Fleet { return f }, h.recent)
	writeJSON(w, http.StatusOK, fleetOf(f))
}

// serveSeries answers GET /ui/api/series?range=D with the time series of
// the last D (a Go duration; default DefaultSeriesRange, at most
// SeriesWindow), after a sample of now if one is due.
func (h *handler) serveSeries(w http.ResponseWriter, r *http.Request) {
	span := DefaultSeriesRange
	if s := r.URL.Query().Get("range"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			writeJSON(w, http.StatusBadRequest, apiError{"range must be a positive duration such as 15m"})
			return
		}
		span = min(d, SeriesWindow)
	}
	h.sample()
	writeJSON(w, http.StatusOK, seriesOf(h.hist.points(span), h.hist.step, span))
}

// sample records a sample of the Source now, if one is due.
func (h *handler) sample() {
	now := h.now()
	h.hist.record(now, func() view.Fleet { return h.src.Fleet(now) }, h.recent)
}

// Handler is the dashboard over a Source with its history sampled in the
// background by Run, so that a page opened after an incident shows the
// last SeriesWindow whether or not anyone was watching.
type Handler struct{ h *handler }

// NewHandler returns the dashboard over src; it serves what New's handler
// serves. Call Run to keep its history.
func NewHandler(src Source) *Handler { return &Handler{newHandler(src)} }

// ServeHTTP serves the page and its API (see New).
func (d *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) { d.h.mux.ServeHTTP(w, r) }

// Run samples the Source every SeriesStep until ctx is done.
func (d *Handler) Run(ctx context.Context) {
	t := time.NewTicker(d.h.hist.step)
	defer t.Stop()
	for {
		d.h.sample()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// recent returns the decisions the time series reads TTFTs from.
func (h *handler) recent() []view.Decision { return h.src.Decisions(MaxDecisions) }

// serveDecisions answers GET /ui/api/decisions?n=N with the last N
// decisions (default DefaultDecisions, at most MaxDecisions), newest first.
func (h *handler) serveDecisions(w http.ResponseWriter, r *http.Request) {
	n := DefaultDecisions
	if s := r.URL.Query().Get("n"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 0 {
			writeJSON(w, http.StatusBadRequest, apiError{"n must be a non-negative integer"})
			return
		}
		n = min(v, MaxDecisions)
	}
	ds := h.src.Decisions(n)
	if len(ds) > n {
		ds = ds[:n]
	}
	if ds == nil {
		ds = []view.Decision{}
	}
	for i := range ds {
		if ds[i].Candidates == nil {
			ds[i].Candidates = []view.Candidate{}
		}
	}
	writeJSON(w, http.StatusOK, decisionsJSON{ds})
}

// apiError is the body of a 4xx answer.
type apiError struct {
	Error string `json:"error"`
}

// decisionsJSON is the body of /ui/api/decisions.
type decisionsJSON struct {
	Decisions []view.Decision `json:"decisions"`
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}
