// Package engine models one vLLM v1 inference engine: a paged KV cache with
// automatic prefix caching, a continuous-batching scheduler with chunked
// prefill and preemption, and a timing model for each iteration.
//
// The model is a clock-free state machine: time is an argument of every
// call, there are no goroutines, and the same calls always give the same
// events. The emulator drives it from the wall clock and the simulator from
// a virtual one:
//
//	e.Add(now, req)
//	events, next := e.Step(now) // call Step again at next
package engine

import (
	"fmt"
	"slices"
	"time"

	"github.com/kvrouter/kvrouter/prefix"
	"github.com/kvrouter/kvrouter/slots"
)

// seq is one request inside the engine.
type seq struct {
	id     string
	tokens []uint32
	// hashes are the chained hashes of the prompt's full blocks.
	hashes    []prefix.Hash
	prompt    int
	maxTokens int
	lora      string
	parent    prefix.Hash // root of the chain (parent of hashes[0])

	// computed counts tokens whose KV is computed (vLLM
	// num_computed_tokens); output counts sampled output tokens.
	computed, output int
	// blocks is the block table.
	blocks []int32
	// stored counts leading prompt blocks whose cache status is settled
	// (hit at admission, or computed and offered to the cache).
	stored int
	// n is the tokens scheduled in the iteration in flight.
	n int

	cached int
	// cpuCached and remoteCached are the parts of cached loaded from the
	// CPU tier and received from a peer.
	cpuCached, remoteCached int
	// remote and remoteSent are Request.RemoteBlocks and RemoteSent.
	remote     int
	remoteSent time.Duration
	// holdFor is Request.HoldFor.
	holdFor time.Duration
	// loading is the blocks being loaded from the CPU tier, in the block
	// table after the computed ones, until loadedAt; zero when none.
	loading                 int
	loadedAt                time.Duration
	admitted                bool
	arrived, started, first time.Duration
	preemptions             int
	// gone is set when the request finished or was canceled.
	gone bool
	// slot is a llama.cpp engine's slot running it, -1 when none.
	slot int
}

// need is the tokens seq must compute before it can sample its next token.
func (s *seq) need() int { return s.prompt + s.output - s.computed }

// Stats are the engine's counters, as vLLM exports them.
type Stats struct {
	// Running and Waiting are the requests in the batch and in the queue.
	Running, Waiting int
	// UsedBlocks is the blocks held by requests; TotalBlocks the capacity.
	// KV usage (vllm:kv_cache_usage_perc) is UsedBlocks/TotalBlocks.
	UsedBlocks, TotalBlocks int
	// CachedBlocks is the computed blocks reusable by prefix caching, held
	// or free.
	CachedBlocks int
	// PrefixQueries and PrefixHits are prompt tokens looked up and found in
	// the prefix cache at admission (vllm:prefix_cache_queries_total and
	// vllm:prefix_cache_hits_total).
	PrefixQueries, PrefixHits int64
	// CPUQueries and CPUHits are prompt tokens looked up in the CPU tier
	// (those the GPU cache missed) and found there, at admission
	// (vllm:external_prefix_cache_queries_total and ..._hits_total, as a
	// KV connector reports them); CPUBlocks and CPUCachedBlocks are the
	// tier's capacity and content.
	CPUQueries, CPUHits        int64
	CPUBlocks, CPUCachedBlocks int
	// RemoteHits is prompt tokens received from peers (Request.RemoteBlocks)
	// at admission; SentBlocks the blocks sent to peers (Send, Read).
	RemoteHits, SentBlocks int64
	// HeldBlocks is the blocks finished requests hold for peers to read
	// (Request.HoldFor), part of UsedBlocks; ExpiredHolds counts the
	// holds freed unread when their time ran out.
	HeldBlocks   int
	ExpiredHolds int64
	// Preemptions counts requests preempted (recompute).
	Preemptions int64
	// StoredBlocks and RemovedBlocks count blocks reported in BlockStored
	// and BlockRemoved events.
	StoredBlocks, RemovedBlocks int64
	// Finished and Canceled count requests that completed or were canceled.
	Finished, Canceled int64
	// PrefillTokens counts prompt tokens computed (including recomputation
	// after preemption); OutputTokens counts sampled tokens.
	PrefillTokens, OutputTokens int64
	// Steps counts iterations; Busy is their total duration.
	Steps int64
	Busy  time.Duration
}

// Engine is one modelled inference engine. It is not safe for concurrent
// use: one goroutine owns it.
type Engine struct {
	cfg  Config
	pool *pool
	// slots are a llama.cpp engine's slots (llamacpp.go); nil for vLLM.
	slots *slots.Cache
	// cpu is the CPU offload tier, nil without one; loads counts the
	// running requests whose blocks are loading from it.
	cpu   *tier
	loads int
	// netIn and netOut are the interconnect's two directions.
	netIn, netOut link
	// cpuEvicted collects the hashes the CPU tier dropped since the last
	// Step (BlockRemoved on CPU); cpuSpare is the array the last Step's
	// events hold. They swap on every Step.
	cpuEvicted, cpuSpare []prefix.Hash

	waiting deque
	running []*seq
	byID    map[string]*seq

	// busy is true while an iteration is in flight; it runs from start to
	// end and computes batch.
	busy       bool
	start, end time.Duration
	batch      []*seq
	// evicted collects the hashes evicted while scheduling the iteration
	// in flight, reported when it ends; spare is the array the last
	// BlockRemoved event holds. They swap, like pend and out.
	evicted, spare []prefix.Hash

	// pend collects events for the next Step; out is the slice the last
	// Step returned. They swap on every Step.
	pend, out []Event
	stats     Stats

	// holds are the finished requests whose blocks wait for a reader, by
	// ID (hold.go); heldBlocks counts their blocks, holdNext is the
	// earliest time one is due (Idle: none).
	holds      map[string]*hold
	heldBlocks int
	holdNext   time.Duration
}

// New returns an idle engine with an empty cache.
func New(cfg Config) (*Engine, error) {
	cfg = cfg.defaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	e := &Engine{
		cfg:      cfg,
		pool:     newPool(cfg.NumBlocks),
		byID:     make(map[string]*seq),
		holdNext: Idle,
		slots:    newSlots(&cfg),
	}
	if cfg.CPUBlocks > 0 {
		e.cpu = newTier(cfg.CPUBlocks, cfg.blockLoad())
	}
	e.netIn.perBlock = cfg.BlockTransfer()
	e.netOut.perBlock = e.netIn.perBlock
	return e, nil
}

// Config returns the engine's configuration, zero fields filled in.
func (e *Engine) Config() Config { return e.cfg }

// Add queues a request arriving at now. It is scheduled at the next
// iteration: if the engine is idle, call Step(now) after Add. Add rejects a
// request Config.CheckLength refuses (an empty prompt, MaxTokens < 1, a
// prompt plus output longer than MaxModelLen or than the whole cache), or
// with the ID of a request still in the engine. The engine keeps r's Tokens and Hashes: do not modify them.
func (e *Engine) Add(now time.Duration, r *Request) error {
	p := r.Prompt
	if p == 0 {
		p = len(r.Tokens)
	}
	bs := e.cfg.BlockSize
	if err := e.cfg.checkLength(p, r.MaxTokens); err != nil {
		return fmt.Errorf("request %s: %w", r.ID, err)
	}
	if len(r.Tokens) > 0 && len(r.Tokens) != p {
		return fmt.Errorf("request %s: prompt %d tokens but %d token ids", r.ID, p, len(r.Tokens))
	}
	if _, dup := e.byID[r.ID]; dup {
		return fmt.Errorf("request %s: already in the engine", r.ID)
	}
	if r.RemoteBlocks < 0 {
		return fmt.Errorf("request %s: %d remote blocks", r.ID, r.RemoteBlocks)
	}
	s := &seq{id: r.ID, tokens: r.Tokens, prompt: p, maxTokens: r.MaxTokens, lora: r.LoRA, arrived: now,
		remote: r.RemoteBlocks, remoteSent: r.RemoteSent, holdFor: r.HoldFor, slot: -1}
	s.parent = e.cfg.Root
	if r.LoRA != "" {
		s.parent = prefix.Chain(e.cfg.Root, []byte(r.LoRA))
	}
	switch {
	case r.Hashes != nil:
		s.hashes = r.Hashes[:min(len(r.Hashes), p/bs)]
	case len(r.Tokens) > 0:
		s.hashes = prefix.Blocks(s.parent, r.Tokens, bs, make([]prefix.Hash, 0, p/bs))
	}
	e.byID[r.ID] = s
	e.waiting.pushBack(s)
	return nil
}

// Cancel ends the request id at now, as an abort does in vLLM: it leaves
// the queue or the batch, its blocks are freed (its computed blocks stay
// cached), and a Done event with Canceled set is reported by the next Step.
// Work the iteration in flight did for it is discarded. Cancel reports
// false for an unknown or finished request.
func (e *Engine) Cancel(now time.Duration, id string) bool {
	s, ok := e.byID[id]
	if !ok {
		return false
	}
	if e.busy && e.end <= now {
		e.finish()
	}
	if s.admitted {
		i := slices.Index(e.running, s)
		e.running = slices.Delete(e.running, i, i+1)
		e.free(s)
	} else {
		e.waiting.remove(s)
	}
	e.stats.Canceled++
	e.done(s, now, true, nil)
	return true
}

// Reset drops every cached block, on every tier, as vLLM's reset_prefix_cache, and
// reports AllCleared at the next Step. Like vLLM it refuses, returning
// false, while requests hold blocks (an iteration in flight or requests
// running); waiting requests are kept.
func (e *Engine) Reset(now time.Duration) bool {
	if e.busy && e.end <= now {
		e.finish()
	}
	if e.busy || e.pool.used() > 0 {
		return false
	}
	e.pool.clear()
	if e.cpu != nil {
		e.cpu.clear()
	}
	e.pend = append(e.pend, Event{Kind: AllCleared, At: now, BlockSize: e.cfg.BlockSize})
	return true
}

// Stats returns the engine's counters.
func (e *Engine) Stats() Stats {
	st := e.stats
	st.Running = len(e.running)
	st.Waiting = e.waiting.len()
	st.UsedBlocks = e.pool.used()
	st.TotalBlocks = e.cfg.NumBlocks
	st.CachedBlocks = e.pool.table.n
	st.HeldBlocks = e.heldBlocks
	if e.cpu != nil {
		st.CPUBlocks, st.CPUCachedBlocks = e.cfg.CPUBlocks, e.cpu.len()
	}
	return st
}

// Busy reports whether an iteration is in flight: an engine that is not
// busy admits what Add queued at the next Step, even while loads run.
func (e *Engine) Busy() bool { return e.busy }

// Holds is how many of the leading blocks of hashes the GPU cache holds,
// as a KV connector's source checks before it sends them.
func (e *Engine) Holds(hashes []prefix.Hash) int {
	n := 0
	for n < len(hashes) {
		if _, ok := e.pool.lookup(hashes[n]); !ok {
			break
		}
		n++
	}
	return n
}

// Send queues blocks KV blocks on the replica's outbound interconnect at
// now, for a peer that imports them (Request.RemoteBlocks), and returns
// when they are sent: the peer's RemoteSent.
func (e *Engine) Send(now time.Duration, blocks int) time.Duration {
	e.stats.SentBlocks += int64(max(blocks, 0))
	return e.netOut.reserve(now, max(blocks, 0))
}

// Cached returns the hashes of all computed cached blocks, held or free,
// sorted.
func (e *Engine) Cached() []prefix.Hash {
	hs := e.pool.table.all(make([]prefix.Hash, 0, e.pool.table.n))
	slices.Sort(hs)
	return hs
}

// free releases seq's blocks, last block first as vLLM does, so that a
// request's tail is evicted before its head.
func (e *Engine) free(s *seq) {
	for i := len(s.blocks) - 1; i >= 0; i-- {
		e.pool.release(s.blocks[i])
	}
	s.blocks = s.blocks[:0]
	e.releaseSlot(s)
	if s.loading > 0 {
		s.loading = 0
		e.loads--
	}
}

// done reports s finished at t, holding held (Event.HeldBlocks), and
// forgets it.
func (e *Engine) done(s *seq, t time.Duration, canceled bool, held []int32) {
	s.gone = true
	delete(e.byID, s.id)
	e.pend = append(e.pend, Event{
		Kind: Done, At: t, Req: s.id,
		PromptTokens: s.prompt, CachedTokens: s.cached, OutputTokens: s.output,
		CPUCachedTokens: s.cpuCached, RemoteCachedTokens: s.remoteCached,
		Arrived: s.arrived, Started: s.started, First: s.first,
		Preemptions: s.preemptions, Canceled: canceled, HeldBlocks: held,
	})
}

// deque is the FCFS waiting queue: a ring buffer that also takes
// preempted requests back at its front.
type deque struct {
	buf        []*seq
	head, size int
}

func (q *deque) len() int { return q.size }

func (q *deque) front() *seq { return q.buf[q.head] }

func (q *deque) grow() {
	if q.size < len(q.buf) {
		return
	}
	nb := make([]*seq, max(8, 2*len(q.buf)))
	for i := range q.size {
		nb[i] = q.buf[(q.head+i)%len(q.buf)]
	}
	q.buf, q.head = nb, 0
}

func (q *deque) pushBack(s *seq) {
	q.grow()
	q.buf[(q.head+q.size)%len(q.buf)] = s
	q.size++
}

func (q *deque) pushFront(s *seq) {
	q.grow()
	q.head = (q.head - 1 + len(q.buf)) % len(q.buf)
	q.buf[q.head] = s
	q.size++
}

func (q *deque) popFront() *seq {
	s := q.buf[q.head]
	q.buf[q.head] = nil
	q.head = (q.head + 1) % len(q.buf)
	q.size--
	return s
}

// remove deletes s from the queue, keeping the order of the others.
func (q *deque) remove(s *seq) {
	for i := range q.size {
		if q.buf[(q.head+i)%len(q.buf)] != s {
			continue
		}
		for j := i; j < q.size-1; j++ {
			q.buf[(q.head+j)%len(q.buf)] = q.buf[(q.head+j+1)%len(q.buf)]
		}
		q.buf[(q.head+q.size-1)%len(q.buf)] = nil
		q.size--
		return
	}
}
