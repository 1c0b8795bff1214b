package proxy

import (
	"encoding/json"
	"net/http"
	"strconv"
	"sync"
	"time"

	"kvrouter/route"
)

// Record is one routing decision and what came of it, as /debug/decisions
// shows it. Durations are in milliseconds.
type Record struct {
	ID      string    `json:"id"`
	At      time.Time `json:"at"`
	Session string    `json:"session,omitempty"`
	Policy  string    `json:"policy"`
	Model   string    `json:"model"`
	Path    string    `json:"path"`
	Stream  bool      `json:"stream"`
	// Tokens is the router's estimate of the prompt length; Blocks its full
	// prefix blocks.
	Tokens     int         `json:"tokens"`
	Blocks     int         `json:"blocks"`
	Candidates []Candidate `json:"candidates"`
	// Replica is the chosen replica's URL; Failed lists replicas tried first
	// that failed before the first byte.
	Replica string   `json:"replica"`
	Reason  string   `json:"reason"`
	Failed  []string `json:"failed,omitempty"`
	// PredictedCached is the policy's predicted cached prompt tokens;
	// ActualCached the engine's usage.prompt_tokens_details.cached_tokens
	// (-1: not reported); PromptTokens the engine's prompt_tokens (-1: not
	// reported).
	PredictedCached int `json:"predicted_cached_tokens"`
	ActualCached    int `json:"actual_cached_tokens"`
	PromptTokens    int `json:"prompt_tokens"`
	// DecideMS is the time spent hashing, matching and picking.
	DecideMS float64 `json:"decide_ms"`
	TTFTMS   float64 `json:"ttft_ms"`
	E2EMS    float64 `json:"e2e_ms"`
	Status   int     `json:"status"`
	// Outcome is ok, canceled (client went away), upstream-error or error.
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

// candidates converts a decision's cost terms, naming replicas by URL.
func candidates(costs []route.Cost, names []string) []Candidate {
	if len(costs) == 0 {
		return nil
	}
	out := make([]Candidate, 0, len(costs))
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

// ring keeps the last len(recs) records. mu guards recs, next and n.
type ring struct {
	mu   sync.Mutex
	recs []Record
	next int
	n    int
}

func newRing(size int) *ring { return &ring{recs: make([]Record, size)} }

func (r *ring) add(rec Record) {
	r.mu.Lock()
	r.recs[r.next] = rec
	r.next = (r.next + 1) % len(r.recs)
	r.n = min(r.n+1, len(r.recs))
	r.mu.Unlock()
}

// last returns up to n records, newest first.
func (r *ring) last(n int) []Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	n = min(n, r.n)
	out := make([]Record, n)
	for i := range n {
		out[i] = r.recs[(r.next-1-i+2*len(r.recs))%len(r.recs)]
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
