package engine

import (
	"time"

	"github.com/kvrouter/kvrouter/prefix"
)

// Holds keep a finished request's KV blocks for a peer to read, as a
// prefill worker of vLLM's prefill/decode disaggregation does
// (vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py,
// NixlConnectorScheduler.request_finished, vLLM commit 002a105): a request
// that asked for it (Request.HoldFor, vLLM's do_remote_decode) finishes
// without freeing its blocks; Done names its computed full prompt blocks
// (Event.HeldBlocks: `block_ids if all_full else block_ids[:-1]` in vLLM
// before vllm-project/vllm#21074, which since names the partial last
// block too; the model moves whole blocks only); all its blocks stay in
// use, so they take cache room and cannot be evicted, until a peer has
// read them (Read) or the hold expires (vLLM's
// VLLM_NIXL_ABORT_REQUEST_TIMEOUT), whichever comes first. Then they are
// freed as any finished request's blocks: still cached, evictable.

// hold is one finished request whose blocks wait for a reader.
type hold struct {
	s *seq
	// until is when the blocks are freed: the expiry, or once read, when
	// the last block read has left the outbound link.
	until time.Duration
	// read is set by Read: a second read finds nothing.
	read bool
}

// keep holds s's blocks from t until t+s.holdFor instead of freeing them,
// and returns the ids of the full prompt blocks a reader may ask for. A
// request without full prompt blocks is not held (vLLM frees a prompt
// shorter than a block at once) and gets nil.
func (e *Engine) keep(s *seq, t time.Duration) []int32 {
	full := min(len(s.hashes), s.stored)
	if s.holdFor <= 0 || full == 0 {
		e.free(s)
		return nil
	}
	if e.holds == nil {
		e.holds = make(map[string]*hold)
	}
	h := &hold{s: s, until: t + s.holdFor}
	e.holds[s.id] = h
	e.heldBlocks += len(s.blocks)
	e.holdNext = min(e.holdNext, h.until)
	return append([]int32(nil), s.blocks[:full]...)
}

// Read serves a peer that reads the blocks held for request id at now: the
// leading blocks of ids that are the request's held prompt blocks, in
// order. It queues them on the outbound interconnect, frees the hold once
// they are sent, and returns their hashes and when the last one is sent.
// ok is false when no blocks are held for id (never held, expired, or read
// already); a read whose first id is not the request's first held block
// gets no hashes and leaves the hold in place.
func (e *Engine) Read(now time.Duration, id string, ids []int32) (hashes []prefix.Hash, sent time.Duration, ok bool) {
	e.release(now) // a hold due by now is gone, whether or not Step ran since
	h := e.holds[id]
	if h == nil || h.read {
		return nil, 0, false
	}
	s := h.s
	full := min(len(s.hashes), s.stored)
	n := 0
	for n < len(ids) && n < full && ids[n] == s.blocks[n] {
		n++
	}
	if n == 0 {
		return nil, now, true
	}
	h.read = true
	h.until = e.Send(now, n)
	e.holdNext = min(e.holdNext, h.until)
	return s.hashes[:n], h.until, true
}

// release frees the holds due by now, counting those nobody read as
// expired.
func (e *Engine) release(now time.Duration) {
	if e.holdNext > now {
		return
	}
	e.holdNext = Idle
	for id, h := range e.holds {
		if h.until > now {
			e.holdNext = min(e.holdNext, h.until)
			continue
		}
		if !h.read {
			e.stats.ExpiredHolds++
		}
		e.heldBlocks -= len(h.s.blocks)
		e.free(h.s)
		delete(e.holds, id)
	}
}
