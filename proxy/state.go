package proxy

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"sync"
	"sync/atomic"
	"time"

	"kvrouter/prefix"
	"kvrouter/route"
)

// state is the router's live view of the fleet, adapted to what the call
// path needs. It is the one place that talks to the fleet, residency,
// scrape and health packages.
type state struct {
	rt    *Router
	epoch uint64 // random per router, part of request ids
	text  prefix.Text

	inflight []atomic.Int64
	healthy  []atomic.Bool

	mu       sync.Mutex // guards sessions
	sessions map[uint64]int
}

// ticket is a committed request's hold on its replica.
type ticket struct{ replica int }

func newState(rt *Router) (*state, error) {
	var b [8]byte
	rand.Read(b[:])
	st := &state{
		rt: rt, epoch: binary.LittleEndian.Uint64(b[:]) >> 16,
		text:     prefix.Text{ChunkChars: rt.cfg.ChunkChars},
		inflight: make([]atomic.Int64, len(rt.names)),
		healthy:  make([]atomic.Bool, len(rt.names)),
		sessions: map[uint64]int{},
	}
	for i := range st.healthy {
		st.healthy[i].Store(true)
	}
	return st, nil
}

func (st *state) hash(p *prefix.Prompt, out []prefix.Hash) ([]prefix.Hash, int) {
	return st.text.Hashes(p, out)
}

func prefixKey(p *prefix.Prompt) uint64 { return p.PrefixKey() }

func (st *state) match(hashes []prefix.Hash, now time.Time, match []int, age []time.Duration) {}

func (st *state) snapshot(dst *route.Snapshot) {
	n := len(st.rt.names)
	dst.Replicas = grow(dst.Replicas, n)
	dst.BlockSize = st.text.TokensPerBlock()
	for i := range n {
		dst.Replicas[i] = route.Replica{ID: st.rt.names[i], Healthy: st.healthy[i].Load(), InFlight: int(st.inflight[i].Load())}
	}
}

func (st *state) pinned(session uint64, now time.Time) int {
	st.mu.Lock()
	defer st.mu.Unlock()
	if r, ok := st.sessions[session]; ok {
		return r
	}
	return -1
}

func (st *state) commit(c *call, now time.Time) ticket {
	st.inflight[c.replica].Add(1)
	if c.req.Session != 0 {
		st.mu.Lock()
		st.sessions[c.req.Session] = c.replica
		st.mu.Unlock()
	}
	return ticket{replica: c.replica}
}

func (st *state) firstToken(c *call, at time.Time) {}

func (st *state) release(c *call, outcome string, actual int, now time.Time) {
	if c.ticket.replica >= 0 {
		st.inflight[c.ticket.replica].Add(-1)
		c.ticket.replica = -1
	}
}

func (st *state) passiveFailure(replica int, now time.Time) {}

func (st *state) inflightOf(i int) float64 { return float64(st.inflight[i].Load()) }

func (st *state) healthyOf(i int) float64 {
	if st.healthy[i].Load() {
		return 1
	}
	return 0
}

func (st *state) run(ctx context.Context) error {
	<-ctx.Done()
	return ctx.Err()
}

func newPolicy(name string) (route.Policy, error) {
	if name == "" {
		name = route.Default
	}
	return route.New(name)
}
