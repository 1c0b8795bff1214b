package proxy

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"kvrouter/engine"
	"kvrouter/prefix"
	"kvrouter/route"
	"kvrouter/scrape"
)

// state is the router's live view of the fleet, adapted to what the call
// path needs: per-replica in-flight accounting, engine load from package
// scrape, health (active: /health probes, downAfter consecutive failures
// take a replica out; passive: a replica that fails a request is out for
// passiveHold and until its next good probe), sessions, and an approximate residency index fed by the
// routing decisions. It is the one place the call path touches for fleet
// state, so that moving it onto packages fleet, residency and health
// changes this file only.
type state struct {
	rt      *Router
	epoch   uint64 // random per router, part of request ids
	text    prefix.Text
	rates   route.Rates
	blocks  int // fallback capacity in text blocks
	reps    []replicaState
	scraper *scrape.Scraper

	mu       sync.Mutex // guards sessions
	sessions map[uint64]session

	idx index
}

// replicaState is one replica's live counters.
type replicaState struct {
	inflight, prefill, decoding, decodeBlocks atomic.Int64
	healthy                                   atomic.Bool
	downUntil                                 atomic.Int64 // unix ns; passive failure hold
	load                                      atomic.Pointer[scrape.Load]
}

// session is a session's binding to a replica.
type session struct {
	replica int
	at      time.Time
}

// sessionIdle is how long an unused session binding lasts.
const sessionIdle = 30 * time.Minute

// passiveHold is the least time a replica that failed a request stays out.
const passiveHold = time.Second

// downAfter is how many consecutive failed health probes mark a replica
// down.
const downAfter = 3

// ticket is a committed request's hold on its replica.
type ticket struct {
	replica  int
	uncached int64 // prefill tokens counted in replicaState.prefill
	blocks   int64 // blocks counted in replicaState.decodeBlocks
	decoding bool
}

func newState(rt *Router) (*state, error) {
	ecfg, err := engine.Preset(rt.cfg.Preset)
	if err != nil {
		return nil, fmt.Errorf("preset: %w", err)
	}
	var b [8]byte
	rand.Read(b[:])
	st := &state{
		rt: rt, epoch: binary.LittleEndian.Uint64(b[:]) >> 16,
		text:     prefix.Text{ChunkChars: rt.cfg.ChunkChars},
		rates:    ecfg.Rates(),
		reps:     make([]replicaState, len(rt.names)),
		sessions: map[uint64]session{},
		idx:      index{n: len(rt.names), m: map[prefix.Hash][]int64{}},
	}
	capTokens := ecfg.NumBlocks * ecfg.BlockSize
	if rt.cfg.CacheBlocks > 0 {
		capTokens = rt.cfg.CacheBlocks * ecfg.BlockSize
	}
	st.blocks = capTokens / st.text.TokensPerBlock()
	st.idx.max = max(st.blocks*len(rt.names), 1<<16)
	for i := range st.reps {
		st.reps[i].healthy.Store(true)
	}
	st.scraper = &scrape.Scraper{
		Interval: rt.cfg.ScrapeInterval,
		Timeout:  max(rt.cfg.ScrapeInterval, time.Second),
		OnLoad:   st.onLoad,
	}
	for _, name := range rt.names {
		st.scraper.Add(name)
	}
	return st, nil
}

func (st *state) replica(id string) int {
	for i, n := range st.rt.names {
		if n == id {
			return i
		}
	}
	return -1
}

func (st *state) onLoad(id string, l scrape.Load) {
	if i := st.replica(id); i >= 0 {
		st.reps[i].load.Store(&l)
	}
}

// passiveFailure takes a replica out after a failed request: until
// passiveHold has passed and a scrape has succeeded again.
func (st *state) passiveFailure(i int, now time.Time) {
	r := &st.reps[i]
	r.downUntil.Store(now.Add(passiveHold).UnixNano())
	if r.healthy.Swap(false) {
		st.rt.log.Warn("replica down (request failed)", "replica", st.rt.names[i])
	}
}

func (st *state) hash(p *prefix.Prompt, out []prefix.Hash) ([]prefix.Hash, int) {
	return st.text.Hashes(p, out)
}

func prefixKey(p *prefix.Prompt) uint64 { return p.PrefixKey() }

func (st *state) match(hashes []prefix.Hash, now time.Time, match []int, age []time.Duration) {
	st.idx.match(hashes, now, match, age)
}

// snapshot fills dst with every replica's current state.
func (st *state) snapshot(dst *route.Snapshot) {
	n := len(st.rt.names)
	dst.Replicas = grow(dst.Replicas, n)
	dst.BlockSize = st.text.TokensPerBlock()
	now := time.Now()
	for i := range n {
		r := &st.reps[i]
		rep := route.Replica{
			ID: st.rt.names[i], Healthy: r.healthy.Load(),
			InFlight: int(r.inflight.Load()), PrefillTokens: max(int(r.prefill.Load()), 0),
			Decoding: int(r.decoding.Load()), DecodeBlocks: int(r.decodeBlocks.Load()),
			CacheBlocks: st.blocks, Rates: st.rates,
		}
		if l := r.load.Load(); l != nil {
			rep.Running, rep.Waiting, rep.KVUsage = l.Running, l.Waiting, l.KVUsage
			rep.Scraped, rep.LoadAge = true, now.Sub(l.At)
			if l.NumBlocks > 0 && l.BlockSize > 0 {
				rep.CacheBlocks = l.NumBlocks * l.BlockSize / dst.BlockSize
			}
		}
		dst.Replicas[i] = rep
	}
}

func (st *state) pinned(h uint64, now time.Time) int {
	st.mu.Lock()
	defer st.mu.Unlock()
	s, ok := st.sessions[h]
	if !ok || now.Sub(s.at) > sessionIdle || !st.reps[s.replica].healthy.Load() {
		return -1
	}
	return s.replica
}

// commit books the request on its replica: load, session binding and the
// blocks it will leave cached there.
func (st *state) commit(c *call, now time.Time) ticket {
	i := c.replica
	r := &st.reps[i]
	t := ticket{replica: i}
	r.inflight.Add(1)
	if c.routed {
		bs := max(st.text.TokensPerBlock(), 1)
		t.uncached = int64(max(c.req.Tokens-c.dec.Matched, 0))
		t.blocks = int64((c.req.Tokens + c.req.MaxTokens + bs - 1) / bs)
		r.prefill.Add(t.uncached)
		r.decodeBlocks.Add(t.blocks)
		st.idx.touch(i, c.bufs.hashes, now)
	}
	if c.req.Session != 0 {
		st.mu.Lock()
		st.sessions[c.req.Session] = session{replica: i, at: now}
		if len(st.sessions) > 1<<20 {
			st.expireLocked(now)
		}
		st.mu.Unlock()
	}
	return t
}

func (st *state) expireLocked(now time.Time) {
	for k, s := range st.sessions {
		if now.Sub(s.at) > sessionIdle {
			delete(st.sessions, k)
		}
	}
}

// firstToken moves the request from prefill to decoding.
func (st *state) firstToken(c *call, at time.Time) {
	t := &c.ticket
	if t.replica < 0 || t.decoding {
		return
	}
	r := &st.reps[t.replica]
	r.prefill.Add(-t.uncached)
	r.decoding.Add(1)
	t.decoding = true
}

// release returns the request's load; it runs once per ticket on every
// path (done, error, cancel, retry).
func (st *state) release(c *call, outcome string, actual int, now time.Time) {
	t := &c.ticket
	if t.replica < 0 {
		return
	}
	r := &st.reps[t.replica]
	r.inflight.Add(-1)
	if t.decoding {
		r.decoding.Add(-1)
	} else {
		r.prefill.Add(-t.uncached)
	}
	r.decodeBlocks.Add(-t.blocks)
	*t = ticket{replica: -1}
}

func (st *state) inflightOf(i int) float64 { return float64(st.reps[i].inflight.Load()) }

func (st *state) healthyOf(i int) float64 {
	if st.reps[i].healthy.Load() {
		return 1
	}
	return 0
}

// run runs the scrape loops and one health probe loop per replica until
// ctx is done, and joins them.
func (st *state) run(ctx context.Context) error {
	var wg sync.WaitGroup
	for i := range st.reps {
		wg.Go(func() { st.probeLoop(ctx, i) })
	}
	err := st.scraper.Run(ctx)
	wg.Wait()
	return err
}

// probeLoop probes replica i's /health every HealthInterval: downAfter
// consecutive failures take it out; a success brings it back once any
// passive hold has passed.
func (st *state) probeLoop(ctx context.Context, i int) {
	t := time.NewTicker(st.rt.cfg.HealthInterval)
	defer t.Stop()
	fails := 0
	for {
		err := st.probe(ctx, i)
		r := &st.reps[i]
		switch {
		case ctx.Err() != nil:
			return
		case err == nil:
			fails = 0
			if time.Now().UnixNano() >= r.downUntil.Load() && !r.healthy.Swap(true) {
				st.rt.log.Info("replica up", "replica", st.rt.names[i])
			}
		default:
			fails++
			if fails >= downAfter && r.healthy.Swap(false) {
				st.rt.log.Warn("replica down", "replica", st.rt.names[i], "err", err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// probe GETs /health with a timeout of max(HealthInterval, 1 s).
func (st *state) probe(ctx context.Context, i int) error {
	ctx, cancel := context.WithTimeout(ctx, max(st.rt.cfg.HealthInterval, time.Second))
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "GET", st.rt.names[i]+"/health", nil)
	if err != nil {
		return err
	}
	resp, err := st.rt.upstream.RoundTrip(req)
	if err != nil {
		return err
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("health %s: %s", st.rt.names[i], resp.Status)
	}
	return nil
}

func newPolicy(name string) (route.Policy, error) {
	if name == "" {
		name = route.Default
	}
	return route.New(name)
}
