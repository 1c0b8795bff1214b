package proxy

import (
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/kvrouter/kvrouter/route"
	"github.com/kvrouter/kvrouter/view"
)

func ms(d time.Duration) float64 { return view.MS(d) }

// appendCandidates converts a decision's cost terms, naming replicas by
// URL.
func appendCandidates(out []view.Candidate, costs []route.Cost, bes *backendSet) []view.Candidate {
	for _, c := range costs {
		name := bes.at(c.Replica).cfg.URL
		v := view.Candidate{
			Replica: name, Matched: c.Matched,
			WaitMS: ms(c.Wait), PrefillMS: ms(c.Prefill), DecodeMS: ms(c.Decode),
			OthersMS: ms(c.Others), MemoryMS: ms(c.Memory), FutureMS: ms(c.Future),
			ImportMS: ms(c.Import.Time), LoadMS: ms(c.Load), MissesMS: ms(c.Misses), Miss: c.Miss,
			TotalMS: ms(c.Total), Score: c.Score,
		}
		out = append(out, v)
	}
	return out
}

// fill writes the call's decision and, once finished, its outcome into
// rec, reusing rec's slices. The candidates are left out: the ring keeps
// their cost terms and converts them when read.
func (c *call) fill(rec *view.Decision) {
	rt := c.rt
	failed := rec.Failed[:0]
	*rec = view.Decision{
		ID: c.id, At: c.start, Session: c.session, SessionSource: c.sessionSrc,
		Policy: rt.policyName, Index: c.index, Path: c.path,
		Tokens: c.seen().Request.Tokens, Blocks: c.seen().Request.Blocks,
		Reason: c.dec.Reason, PredictedCached: c.dec.Matched,
		ActualCached: c.usage.CachedTokens, PromptTokens: c.usage.PromptTokens,
		PredictedTTFTMS: ms(c.ticket.Claim().CalibratedTTFT()), DecideMS: ms(c.decide), TTFTMS: ms(c.ttft),
		Status: c.status, Outcome: c.outcome,
	}
	c.fillSLO(rec)
	if c.replica >= 0 {
		rec.Replica = rt.name(c.replica)
	}
	if x := c.transfer(); x.Blocks > 0 {
		rec.Transfer = "from " + rt.name(x.From)
		rec.TransferTokens, rec.PredictedTransferMS = c.pd.xferTokens, ms(x.Time)
	}
	if pd := c.legRan(); pd != nil {
		rec.PrefillReplica, rec.PrefillMS, rec.PrefillOutcome, rec.PrefillLegs = rt.name(pd.leg.from), ms(pd.leg.took), pd.leg.outcome, pd.legs
	}
	if rec.Index == "" {
		rec.Index = rt.st.indexMode()
	}
	if c.prompt != nil {
		rec.Model, rec.Stream = c.prompt.Model, c.prompt.Stream
	}
	for _, f := range c.failed {
		failed = append(failed, rt.name(f))
	}
	rec.Failed, rec.Served = failed, c.served
	if rec.Outcome == "" {
		rec.Outcome = view.OutcomeInFlight
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
	recs  []view.Decision
	costs [][]route.Cost // each slot's candidates
	seqs  []uint64       // the sequence number of the record in each slot
	n     uint64         // records ever begun
	bes   *backendSet    // replica URLs by index; set by New
	// weight is the policy's route.TTFTWeight; set by New.
	weight float64
	idKey  []byte // session ids are shown hashed with it; nil: verbatim
}

func newRing(size int) *ring {
	return &ring{recs: make([]view.Decision, size), costs: make([][]route.Cost, size), seqs: make([]uint64, size)}
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
	r.costs[i], r.recs[i].PrunedCandidates = append(r.costs[i][:0], c.dec.Costs...), c.dec.Pruned
	return r.n
}

// update rewrites record seq from c, unless newer records overwrote it.
func (r *ring) update(seq uint64, c *call) {
	r.mu.Lock()
	defer r.mu.Unlock()
	i := (seq - 1) % uint64(len(r.recs))
	if r.seqs[i] == seq {
		c.fill(&r.recs[i])
		r.costs[i], r.recs[i].PrunedCandidates = append(r.costs[i][:0], c.dec.Costs...), c.dec.Pruned
	}
}

// last returns copies of up to n records, newest first.
func (r *ring) last(n int) []view.Decision {
	r.mu.Lock()
	defer r.mu.Unlock()
	n = int(min(uint64(max(n, 0)), r.n, uint64(len(r.recs))))
	out := make([]view.Decision, n)
	for k := range n {
		i := (r.n - 1 - uint64(k)) % uint64(len(r.recs))
		out[k] = r.recs[i]
		if out[k].SessionSource != SessionFromContent { // the router's own key shows nothing a client sent
			out[k].Session = shownID(r.idKey, out[k].Session)
		}
		out[k].Candidates = appendCandidates(make([]view.Candidate, 0, len(r.costs[i])), r.costs[i], r.bes)
		if len(out[k].Candidates) > 0 && out[k].Candidates[0].Score == 0 {
			out[k].TTFTWeight = r.weight
		}
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
		Decisions []view.Decision `json:"decisions"`
	}{rt.decisions.last(n)})
}

// Decisions returns up to n recent decisions, newest first.
func (rt *Router) Decisions(n int) []view.Decision { return rt.decisions.last(n) }

// count returns the number of records ever begun.
func (r *ring) count() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n
}
