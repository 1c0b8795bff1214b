package proxy

import (
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"kvrouter/route"
)

// Record is one routing decision and what came of it, as /debug/decisions
// shows it. It is written when the request is routed (Outcome in-flight)
// and completed when its response ends. Durations are in milliseconds.
type Record struct {
	ID string    `json:"id"`
	At time.Time `json:"at"`
	// Session is the session id the request was bound by, and
	// SessionSource where it came from: header, user or content (see
	// SessionHeader, SessionUser, SessionContent).
	Session       string `json:"session,omitempty"`
	SessionSource string `json:"session_source,omitempty"`
	Policy        string `json:"policy"`
	// Index is the residency feed the chosen replica was matched against:
	// precise (its KV events), approximate (the router's own routing; also
	// a replica whose event stream is down) or none.
	Index  string `json:"index"`
	Model  string `json:"model"`
	Path   string `json:"path"`
	Stream bool   `json:"stream"`
	// Tokens is the router's estimate of the prompt length; Blocks its full
	// prefix blocks.
	Tokens     int         `json:"tokens"`
	Blocks     int         `json:"blocks"`
	Candidates []Candidate `json:"candidates"`
	// PrunedCandidates counts the candidates kv-aware proved could not win
	// without pricing them in full (route.Cost.Pruned), left out of
	// Candidates.
	PrunedCandidates int `json:"pruned_candidates,omitempty"`
	// Replica is the chosen replica's URL (empty when none could take the
	// request); Failed lists replicas tried first that failed before the
	// first byte.
	Replica string   `json:"replica"`
	Reason  string   `json:"reason"`
	Failed  []string `json:"failed,omitempty"`
	// PredictedCached is the policy's predicted cached prompt tokens;
	// ActualCached the engine's usage.prompt_tokens_details.cached_tokens
	// (-1: not reported, or not yet); PromptTokens the engine's
	// prompt_tokens (-1: not reported, or not yet).
	PredictedCached int `json:"predicted_cached_tokens"`
	ActualCached    int `json:"actual_cached_tokens"`
	PromptTokens    int `json:"prompt_tokens"`
	// PredictedTTFTMS is the chosen candidate's predicted time to first
	// token at calibration scale 1 (kv-aware only; 0 otherwise), the figure
	// the observed TTFT of a streamed response calibrates against.
	PredictedTTFTMS float64 `json:"predicted_ttft_ms,omitempty"`
	// DecideMS is the time spent matching and picking (all attempts).
	DecideMS float64 `json:"decide_ms"`
	// TTFTMS is arrival to first response byte; E2EMS arrival to the end of
	// the response (0 while in flight).
	TTFTMS float64 `json:"ttft_ms"`
	E2EMS  float64 `json:"e2e_ms"`
	Status int     `json:"status"`
	// Outcome is in-flight, ok, canceled (client went away),
	// upstream-error or error.
	Outcome string `json:"outcome"`
}

// Candidate is one replica's cost terms in a decision.
type Candidate struct {
	Replica   string  `json:"replica"`
	Matched   int     `json:"matched_tokens"`
	WaitMS    float64 `json:"wait_ms"`
	PrefillMS float64 `json:"prefill_ms"`
	DecodeMS  float64 `json:"decode_ms"`
	MemoryMS  float64 `json:"memory_ms"`
	TotalMS   float64 `json:"total_ms"`
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// appendCandidates converts a decision's cost terms, naming replicas by URL.
func appendCandidates(out []Candidate, costs []route.Cost, names []string) []Candidate {
	for _, c := range costs {
		name := ""
		if c.Replica >= 0 && c.Replica < len(names) {
			name = names[c.Replica]
		}
		out = append(out, Candidate{
			Replica: name, Matched: c.Matched,
			WaitMS: ms(c.Wait), PrefillMS: ms(c.Prefill), DecodeMS: ms(c.Decode),
			MemoryMS: ms(c.Memory), TotalMS: ms(c.Total),
		})
	}
	return out
}

// fill writes the call's decision and, once finished, its outcome into
// rec, reusing rec's slices. The candidates are left out: the ring keeps
// their cost terms and converts them when read.
func (c *call) fill(rec *Record) {
	rt := c.rt
	failed := rec.Failed[:0]
	*rec = Record{
		ID: c.id, At: c.start, Session: c.session, SessionSource: c.sessionSrc,
		Policy: rt.policyName, Index: c.index, Path: c.path,
		Tokens: c.req.Tokens, Blocks: c.req.Blocks,
		Reason: c.dec.Reason, PredictedCached: c.dec.Matched,
		ActualCached: c.actual, PromptTokens: c.usage,
		PredictedTTFTMS: ms(c.predicted), DecideMS: ms(c.decide), TTFTMS: ms(c.ttft),
		Status: c.status, Outcome: c.outcome,
	}
	if c.replica >= 0 {
		rec.Replica = rt.names[c.replica]
	}
	if rec.Index == "" {
		rec.Index = rt.st.idx.mode()
	}
	if c.prompt != nil {
		rec.Model, rec.Stream = c.prompt.Model, c.prompt.Stream
	}
	for _, f := range c.failed {
		failed = append(failed, rt.names[f])
	}
	rec.Failed = failed
	if rec.Outcome == "" {
		rec.Outcome = OutcomeInFlight
	} else {
		rec.E2EMS = ms(c.end.Sub(c.start))
	}
}

// record writes the call's record: a new one at its first decision, the
// same one updated afterwards (a retry's new decision, the outcome).
func (c *call) record() {
	if c.rec == 0 {
		c.rec = c.rt.decisions.begin(c)
		return
	}
	c.rt.decisions.update(c.rec, c)
}

// ring keeps the last len(recs) records in place, reusing each slot's
// slices. A slot keeps the cost terms of its decision's candidates priced
// in full, as the policy wrote them, and they become Candidates, named by
// names, only when read. mu guards recs, costs, seqs and n.
type ring struct {
	mu    sync.Mutex
	recs  []Record
	costs [][]route.Cost // each slot's candidates
	seqs  []uint64       // the sequence number of the record in each slot
	n     uint64         // records ever begun
	names []string       // replica URLs by index
}

func newRing(size int, names []string) *ring {
	return &ring{recs: make([]Record, size), costs: make([][]route.Cost, size), seqs: make([]uint64, size), names: names}
}

// begin writes c's record into the next slot and returns its sequence
// number (from 1).
func (r *ring) begin(c *call) uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.n++
	i := (r.n - 1) % uint64(len(r.recs))
	r.seqs[i] = r.n
	c.fill(&r.recs[i])
	r.costs[i], r.recs[i].PrunedCandidates = priced(r.costs[i][:0], c.dec.Costs)
	return r.n
}

// update rewrites record seq from c, unless newer records overwrote it.
func (r *ring) update(seq uint64, c *call) {
	r.mu.Lock()
	defer r.mu.Unlock()
	i := (seq - 1) % uint64(len(r.recs))
	if r.seqs[i] == seq {
		c.fill(&r.recs[i])
		r.costs[i], r.recs[i].PrunedCandidates = priced(r.costs[i][:0], c.dec.Costs)
	}
}

// priced appends to dst the candidates of costs priced in full, and
// returns it with the number of pruned ones.
func priced(dst, costs []route.Cost) ([]route.Cost, int) {
	pruned := 0
	for _, k := range costs {
		if k.Pruned {
			pruned++
			continue
		}
		dst = append(dst, k)
	}
	return dst, pruned
}

// last returns copies of up to n records, newest first.
func (r *ring) last(n int) []Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	n = int(min(uint64(max(n, 0)), r.n, uint64(len(r.recs))))
	out := make([]Record, n)
	for k := range n {
		i := (r.n - 1 - uint64(k)) % uint64(len(r.recs))
		out[k] = r.recs[i]
		out[k].Candidates = appendCandidates(make([]Candidate, 0, len(r.costs[i])), r.costs[i], r.names)
		if len(out[k].Failed) > 0 {
			out[k].Failed = slices.Clone(out[k].Failed)
		} else {
			out[k].Failed = nil
		}
	}
	return out
}

// serveDecisions answers GET /debug/decisions?n=N (default 50) with the last
// N decisions, newest first.
func (rt *Router) serveDecisions(w http.ResponseWriter, r *http.Request) {
	n := 50
	if s := r.URL.Query().Get("n"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 0 {
			writeError(w, http.StatusBadRequest, errInvalidRequest, "invalid_n", "n must be a non-negative integer")
			return
		}
		n = v
	}
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(struct {
		Decisions []Record `json:"decisions"`
	}{rt.decisions.last(n)})
}

// Decisions returns up to n recent decisions, newest first.
func (rt *Router) Decisions(n int) []Record { return rt.decisions.last(n) }
