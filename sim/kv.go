package sim

import (
	"slices"
	"time"

	"github.com/kvrouter/kvrouter/engine"
	"github.com/kvrouter/kvrouter/fleet"
	"github.com/kvrouter/kvrouter/prefix"
	"github.com/kvrouter/kvrouter/residency"
)

// kvEvent is an engine KV event on its way to the precise index.
type kvEvent struct {
	due    time.Duration
	rep    int32
	kind   engine.Kind
	medium engine.Medium
	hashes []prefix.Hash
}

// queueKV sends a KV event of replica i to the fleet's precise index,
// KVEventDelay late, as the live router's KV-event subscriber would write
// it. The event's hashes are copied (the engine reuses them). Due times
// are monotonic (events come out in time order, the delay is constant),
// so a FIFO drained before each event replaces heap entries. Blocks on
// the CPU tier go to the offload index, as package kvevents writes them.
func (r *runner) queueKV(i int, ev *engine.Event) {
	if r.reps[i].removed {
		return // its subscriber stopped with it
	}
	if r.cfg.KVEventDelay == 0 {
		r.applyKV(i, ev.Kind, ev.Medium, ev.Hashes)
		return
	}
	if r.kvq0 > 0 && r.kvq0 == len(r.kvq) {
		r.kvq, r.kvq0 = r.kvq[:0], 0
	}
	r.kvq = append(r.kvq, kvEvent{due: ev.At + r.cfg.KVEventDelay, rep: int32(i), kind: ev.Kind, medium: ev.Medium,
		hashes: append([]prefix.Hash(nil), ev.Hashes...)})
}

// drainKV applies the delayed KV events due by now.
func (r *runner) drainKV() {
	for r.kvq0 < len(r.kvq) && r.kvq[r.kvq0].due <= r.now {
		e := &r.kvq[r.kvq0]
		if e.rep >= 0 && r.reps[e.rep].alive && !r.reps[e.rep].removed {
			r.applyKV(int(e.rep), e.kind, e.medium, e.hashes)
		}
		e.hashes = nil
		r.kvq0++
	}
}

// applyKV updates the precise index (or, for the CPU tier, the offload
// index) of every router with one event of replica i.
func (r *runner) applyKV(i int, k engine.Kind, m engine.Medium, hashes []prefix.Hash) {
	if r.cfg.Trace != nil {
		r.trace(Step{Kind: StepKV, Replica: i, Event: k, Hashes: slices.Clone(hashes)})
	}
	r.each(func(f *fleet.Fleet) {
		x := f.Tracker().Precise()
		if m != engine.GPU {
			x = f.Tracker().Offloaded()
		}
		applyKV(x, i, k, hashes, r.now)
		if k == engine.AllCleared {
			f.Tracker().Offloaded().Clear(i)
		}
	})
}

// applyKV updates one router's index x (precise, or offload for the CPU
// tier) with one event of replica i at now: every router follows the
// engines' events itself.
func applyKV(x *residency.Index, i int, k engine.Kind, hashes []prefix.Hash, now time.Duration) {
	switch k {
	case engine.BlockStored:
		x.Store(i, hashes, now)
	case engine.BlockRemoved:
		x.Remove(i, hashes)
	case engine.AllCleared:
		x.Clear(i)
	}
}
