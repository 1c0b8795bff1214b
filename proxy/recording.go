package proxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvrouter/kvrouter/record"
)

// pathRecord is the admin API's recording route: GET its status, POST
// starts a recording, DELETE stops it.
const pathRecord = "/admin/v1/record"

// recording is the router's side of --record: the running recorder, if
// any, which finish hands every routed request to.
type recording struct {
	m  *record.Metrics
	on atomic.Pointer[record.Recorder] // nil: not recording

	// mu serialises starts and stops and guards last.
	mu   sync.Mutex
	last *record.Recorder // the running or last recording; nil: none yet
}

// startRecording registers the recorder's metrics and starts the
// configured recording, if any.
func (rt *Router) startRecording(reg prometheus.Registerer) error {
	m, err := record.NewMetrics(reg)
	if err != nil {
		return fmt.Errorf("proxy metrics: %w", err)
	}
	rt.rec.m = m
	if rt.cfg.Record.Path == "" {
		return nil
	}
	_, err = rt.StartRecording(rt.cfg.Record)
	return err
}

// errRecording is StartRecording's error while a recording runs.
var errRecording = errors.New("a recording is running: stop it first")

// StartRecording starts a recording with cfg (time zero now). It fails
// when one runs, or when its file cannot be opened.
func (rt *Router) StartRecording(cfg record.Config) (record.Status, error) {
	rt.rec.mu.Lock()
	defer rt.rec.mu.Unlock()
	if rt.rec.on.Load() != nil {
		return rt.rec.last.Status(), errRecording
	}
	r, err := record.Start(cfg, rt.rec.m, rt.log, rt.now())
	if err != nil {
		return record.Status{}, err
	}
	rt.rec.last = r
	rt.rec.on.Store(r)
	st := r.Status()
	rt.log.Info("recording", "path", st.Path, "sample_rate", st.SampleRate, "key_from_file", st.KeyFromFile)
	return st, nil
}

// StopRecording stops the running recording, if any, once what is queued
// is written, and returns its final status.
func (rt *Router) StopRecording() record.Status {
	rt.rec.mu.Lock()
	defer rt.rec.mu.Unlock()
	r := rt.rec.on.Swap(nil)
	if r == nil {
		return rt.recordStatusLocked()
	}
	r.Stop()
	st := r.Status()
	rt.log.Info("recording stopped", "path", st.Path, "written", st.Written, "dropped", st.Dropped, "errors", st.Errors)
	return st
}

// ReopenRecording reopens the recording's file (SIGHUP: after an
// external rotation).
func (rt *Router) ReopenRecording() {
	if r := rt.rec.on.Load(); r != nil {
		r.Reopen()
	}
}

// RecordStatus returns the running or last recording's status.
func (rt *Router) RecordStatus() record.Status {
	rt.rec.mu.Lock()
	defer rt.rec.mu.Unlock()
	return rt.recordStatusLocked()
}

func (rt *Router) recordStatusLocked() record.Status {
	if rt.rec.last == nil {
		return record.Status{}
	}
	return rt.rec.last.Status()
}

// recordTrace hands the finished call to the recorder, when its session
// is in the sample: the engine's token counts where its usage reported
// them, the prompt's first chain of block hashes (copied: the call's
// buffers are reused), or none when the router hashed none.
func (c *call) recordTrace(r *record.Recorder) {
	if !r.Sampled(c.session) {
		return
	}
	e := &record.Entry{At: c.start, InputTokens: c.freq.Tokens, OutputTokens: c.usage.CompletionTokens,
		CachedTokens: c.usage.CachedTokens, Session: c.session, Model: c.freq.Model, Priority: c.priority, Outcome: c.outcome}
	if !c.slo.IsZero() {
		e.SLOTTFT, e.SLOITL, e.SLOClass = c.slo.TTFT, c.slo.ITL, c.slo.Class
	}
	if c.usage.PromptTokens > 0 {
		e.InputTokens = c.usage.PromptTokens
	}
	// No chain (token mode before the engines' block sizes are known):
	// no ids, the whole prompt the request's own.
	e.BlockTokens = c.rt.st.hasher.TextTokens()
	if len(c.freq.Chains) > 0 {
		ch := c.freq.Chains[0]
		e.BlockTokens, e.Estimated = ch.Tokens, !c.rt.st.hasher.Engine()
		e.Hashes = make([]uint64, len(ch.Hashes))
		for i, h := range ch.Hashes {
			e.Hashes[i] = uint64(h)
		}
	}
	r.Add(e)
}

// routeRecord registers the recording's admin routes on mux.
func (rt *Router) routeRecord(mux *http.ServeMux, count func(string)) {
	mux.HandleFunc("GET "+pathRecord, func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, rt.RecordStatus())
	})
	mux.HandleFunc("POST "+pathRecord, rt.serveStartRecording)
	mux.HandleFunc("DELETE "+pathRecord, func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, rt.StopRecording())
	})
	mux.Handle(pathRecord, methodNotAllowed(count, "GET, HEAD, POST, DELETE"))
}

// recordBody is POST /admin/v1/record's body: the recording's settings,
// each overriding the configured one (--record ...) when given.
type recordBody struct {
	Path       string   `json:"path"`
	SampleRate *float64 `json:"sample_rate"`
	MaxBytes   *int64   `json:"max_bytes"`
	Backups    *int     `json:"backups"`
	KeyFile    *string  `json:"key_file"`
}

func (rt *Router) serveStartRecording(w http.ResponseWriter, r *http.Request) {
	fail := func(status int, code, msg string) {
		rt.countAdmin(code)
		writeError(w, status, errInvalidRequest, code, msg)
	}
	raw, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxAdminBody))
	if err != nil {
		fail(http.StatusBadRequest, codeBadBody, "reading the body: "+err.Error())
		return
	}
	cfg := rt.cfg.Record
	if len(bytes.TrimSpace(raw)) > 0 {
		var b recordBody
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&b); err != nil {
			fail(http.StatusBadRequest, codeBadBody, `body must be a JSON object such as {"path": "recording.jsonl", "sample_rate": 0.1}: `+err.Error())
			return
		}
		where := rt.recordDir()
		if where == "." {
			where = "the router's working directory"
		}
		if b.Path != "" && !fileName(b.Path) {
			fail(http.StatusBadRequest, codeBadBody, `"path" must be a file name, without a directory: the recording goes in `+where)
			return
		}
		if b.KeyFile != nil && !rt.keyFileAllowed(*b.KeyFile) {
			fail(http.StatusBadRequest, codeBadBody, `"key_file" must be a file name, without a directory, read in `+where+" (or --record-key-file as given)")
			return
		}
		b.apply(&cfg, rt.recordDir())
	}
	if cfg.Path == "" {
		fail(http.StatusBadRequest, codeBadBody, `no file: give "path" (or start the router with --record)`)
		return
	}
	st, err := rt.StartRecording(cfg)
	switch {
	case errors.Is(err, errRecording):
		fail(http.StatusConflict, "recording", err.Error())
	case err != nil:
		fail(http.StatusBadRequest, "record_failed", err.Error())
	default:
		writeJSON(w, http.StatusCreated, st)
	}
}

// recordDir is where the admin API's recordings go: the directory of
// --record, else the router's working directory ("."). The admin API
// names a file there, not a path: a recording is created, appended to and
// rotated (renamed), which no socket should do to any file the router can
// write.
func (rt *Router) recordDir() string {
	if rt.cfg.Record.Path == "" {
		return "."
	}
	return filepath.Dir(rt.cfg.Record.Path)
}

// keyFileAllowed reports whether the admin API may name name as the
// recording's key file: a file name in the recordings' directory, as
// "path" is, or the configured --record-key-file itself; any other path
// (/proc/self/environ) could read whatever the router may read.
func (rt *Router) keyFileAllowed(name string) bool {
	return fileName(name) || name != "" && name == rt.cfg.Record.KeyFile
}

// fileName reports whether name is a plain file name: no directory, not
// "." or "..".
func fileName(name string) bool {
	return name != "." && name != ".." && !strings.ContainsAny(name, `/\`) && filepath.Base(name) == name
}

// apply overlays b on cfg; b.Path, a file name, is in dir (recordDir).
func (b *recordBody) apply(cfg *record.Config, dir string) {
	if b.Path != "" {
		cfg.Path = filepath.Join(dir, b.Path)
	}
	if b.SampleRate != nil {
		cfg.SampleRate = *b.SampleRate
	}
	if b.MaxBytes != nil {
		cfg.MaxBytes = *b.MaxBytes
	}
	if b.Backups != nil {
		cfg.Backups = *b.Backups
	}
	if b.KeyFile != nil && *b.KeyFile != cfg.KeyFile {
		cfg.KeyFile = filepath.Join(dir, *b.KeyFile) // a file name (keyFileAllowed)
	}
}
