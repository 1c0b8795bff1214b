package fleet

import (
	"fmt"
	"sync/atomic"
	"time"

	"kvrouter/route"
)

// Claim is the load one request puts on a replica.
type Claim struct {
	// PrefillTokens is the prompt tokens the replica must compute (the
	// prompt net of the predicted cached tokens).
	PrefillTokens int
	// Blocks is the request's KV footprint in snapshot blocks (prompt plus
	// expected output).
	Blocks int
	// PredictedCached is the cached prompt tokens the policy predicted, for
	// the predicted-versus-actual totals.
	PredictedCached int
}

// Ticket is one request's hold on a replica's accounting. Call FirstToken
// when the first output token arrives and Done exactly once on every path
// (success, error, cancel); extra calls are harmless. A nil *Ticket's
// methods do nothing.
type Ticket struct {
	r     *replica
	claim Claim
	// state is ticketPrefill, ticketDecoding or ticketDone.
	state atomic.Uint32
}

// Ticket states.
const (
	ticketPrefill uint32 = iota
	ticketDecoding
	ticketDone
)

// Acquire charges a request to replica id and returns its ticket. The
// prefill tokens also count in the replica's RecentPrefill window.
func (f *Fleet) Acquire(id string, c Claim) (*Ticket, error) {
	r := f.lookup(id)
	if r == nil {
		return nil, fmt.Errorf("acquire %q: %w", id, ErrUnknownReplica)
	}
	c.PrefillTokens, c.Blocks = max(c.PrefillTokens, 0), max(c.Blocks, 0)
	r.inFlight.Add(1)
	r.prefillTokens.Add(int64(c.PrefillTokens))
	r.decodeBlocks.Add(int64(c.Blocks))
	if f.cfg.Window > 0 && c.PrefillTokens > 0 {
		r.mu.Lock()
		r.recent.add(time.Now(), f.cfg.Window, int64(c.PrefillTokens))
		r.mu.Unlock()
	}
	return &Ticket{r: r, claim: c}, nil
}

// Commit does the bookkeeping of a decision made on s: it charges the
// chosen replica (prefill = prompt − predicted cached tokens, blocks =
// prompt plus MaxTokens in snapshot blocks) and binds session, if not
// empty, to it. A rejecting decision (Replica −1) or an index outside s is
// an error.
func (f *Fleet) Commit(s *route.Snapshot, r *route.Request, d route.Decision, session string) (*Ticket, error) {
	if d.Replica < 0 || d.Replica >= len(s.Replicas) {
		return nil, fmt.Errorf("commit: no replica chosen (%d of %d, %s)", d.Replica, len(s.Replicas), d.Reason)
	}
	id := s.Replicas[d.Replica].ID
	bs := s.BlockSize
	if bs <= 0 {
		bs = route.DefaultBlockSize
	}
	t, err := f.Acquire(id, Claim{
		PrefillTokens:   r.Tokens - d.Matched,
		Blocks:          (r.Tokens + max(r.MaxTokens, 0) + bs - 1) / bs,
		PredictedCached: d.Matched,
	})
	if err != nil {
		return nil, err
	}
	if session != "" {
		f.Bind(session, id)
	}
	return t, nil
}

// Replica returns the id of the ticket's replica.
func (t *Ticket) Replica() string {
	if t == nil {
		return ""
	}
	return t.r.id
}

// Claim returns what the ticket charged.
func (t *Ticket) Claim() Claim {
	if t == nil {
		return Claim{}
	}
	return t.claim
}

// FirstToken records that prefill finished: the request's prefill tokens
// leave PrefillTokens and it counts as Decoding. Later calls do nothing.
func (t *Ticket) FirstToken() {
	if t == nil || !t.state.CompareAndSwap(ticketPrefill, ticketDecoding) {
		return
	}
	t.r.prefillTokens.Add(-int64(t.claim.PrefillTokens))
	t.r.decoding.Add(1)
}

// Done releases the request's accounting. cachedTokens is the engine's
// reported usage.prompt_tokens_details.cached_tokens, or negative if
// unknown; err is nil for a request that completed. Only the first call
// counts.
func (t *Ticket) Done(cachedTokens int, err error) { t.DoneUsage(cachedTokens, -1, err) }

// DoneUsage is Done with the engine's reported usage.prompt_tokens too
// (negative if unknown), so the fleet view can show the actual hit rate.
func (t *Ticket) DoneUsage(cachedTokens, promptTokens int, err error) {
	if t == nil {
		return
	}
	var prev uint32
	for {
		prev = t.state.Load()
		if prev == ticketDone {
			return
		}
		if t.state.CompareAndSwap(prev, ticketDone) {
			break
		}
	}
	r := t.r
	if prev == ticketPrefill {
		r.prefillTokens.Add(-int64(t.claim.PrefillTokens))
	} else {
		r.decoding.Add(-1)
	}
	r.decodeBlocks.Add(-int64(t.claim.Blocks))
	r.inFlight.Add(-1)
	if err != nil {
		r.failed.Add(1)
		return
	}
	r.completed.Add(1)
	if cachedTokens >= 0 {
		r.predictedCached.Add(int64(t.claim.PredictedCached))
		r.actualCached.Add(int64(cachedTokens))
		if promptTokens > 0 {
			r.promptTokens.Add(int64(promptTokens))
			r.usageCached.Add(int64(cachedTokens))
		}
	}
}
