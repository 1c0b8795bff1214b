package fleet

import (
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/kvrouter/kvrouter/route"
	"github.com/kvrouter/kvrouter/scrape"
)

// modelTable is which replica serves which model. Writers (AddReplica,
// SetModels) rebuild it under mu and publish it whole, so that Decide
// reads it without a lock.
type modelTable struct {
	mu  sync.Mutex // serialises writers; guards reps
	cur atomic.Pointer[modelSet]
	// reps is, per replica, its models and whether they were declared or
	// are known at all.
	reps []replicaModels
}

type replicaModels struct {
	models          []scrape.Model
	declared, known bool
}

// modelSet is one immutable picture of the table.
type modelSet struct {
	// serves maps a model to the bitset of the replicas serving it.
	serves map[string][]uint64
	// parent maps a LoRA adapter to its base model.
	parent map[string]string
	// unknown is the bitset of replicas whose models are not known yet:
	// candidates for every model.
	unknown []uint64
}

// set records replica i's models: declared by the operator (then learned
// lists are ignored), or learned; known is false until a replica's models
// are known. init adds a replica.
func (t *modelTable) set(i int, names []string, declared, init bool) {
	ms := make([]scrape.Model, len(names))
	for k, n := range names {
		ms[k] = scrape.Model{ID: n}
	}
	t.update(i, replicaModels{models: ms, declared: declared, known: declared}, init)
}

// update replaces replica i's entry (unless a learned list would replace
// a declared one) and publishes the table anew.
func (t *modelTable) update(i int, rm replicaModels, init bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for len(t.reps) <= i {
		t.reps = append(t.reps, replicaModels{})
	}
	if !init && t.reps[i].declared {
		return
	}
	t.reps[i] = rm
	s := &modelSet{serves: map[string][]uint64{}, parent: map[string]string{}, unknown: make([]uint64, (len(t.reps)+63)/64)}
	for r, e := range t.reps {
		if !e.known {
			s.unknown[r/64] |= 1 << (r % 64)
			continue
		}
		for _, m := range e.models {
			b := s.serves[m.ID]
			if b == nil {
				b = make([]uint64, len(s.unknown))
				s.serves[m.ID] = b
			}
			b[r/64] |= 1 << (r % 64)
			if m.Parent != "" {
				s.parent[m.ID] = m.Parent
			}
		}
	}
	t.cur.Store(s)
}

// SetModels records the models replica id lists (its /v1/models; a LoRA
// adapter with its base as Parent). A replica whose models were declared
// keeps those. Unknown ids are ignored. Its signature fits
// scrape.Scraper.OnModels.
func (f *Fleet) SetModels(id string, models []scrape.Model) {
	r := f.lookup(id)
	if r == nil {
		return
	}
	f.models.update(r.index, replicaModels{models: slices.Clone(models), known: true}, false)
}

// Models returns the models replica id serves and whether they are known
// (declared, or listed by the replica).
func (f *Fleet) Models(id string) (models []scrape.Model, known bool) {
	r := f.lookup(id)
	if r == nil {
		return nil, false
	}
	f.models.mu.Lock()
	defer f.models.mu.Unlock()
	e := f.models.reps[r.index]
	return slices.Clone(e.models), e.known
}

// Serves reports whether some replica serves model, or might: one whose
// models are not known yet. An empty model is served by any replica.
func (f *Fleet) Serves(model string) bool {
	s := f.models.cur.Load()
	if model == "" || s == nil {
		return true
	}
	if _, ok := s.serves[model]; ok {
		return true
	}
	for _, w := range s.unknown {
		if w != 0 {
			return true
		}
	}
	return false
}

// ModelKey returns the base model and the LoRA adapter the blocks of a
// request for model are keyed under, as the engine keys them: an adapter
// some replica lists with a parent is (parent, adapter), anything else
// (model, ""). The router hashes requests from prefix.Root(base, lora), the
// root the engines' KV events are keyed under.
func (f *Fleet) ModelKey(model string) (base, lora string) {
	if s := f.models.cur.Load(); s != nil {
		if p, ok := s.parent[model]; ok {
			return p, model
		}
	}
	return model, ""
}

// excludeModel marks unhealthy, in snap (through c, which restores them
// at the next fill), the replicas known not to serve model. It walks the
// bitsets a word at a time: most words serve it whole.
func (f *Fleet) excludeModel(model string, snap *route.Snapshot, c *snapCache) {
	s := f.models.cur.Load()
	if model == "" || s == nil {
		return
	}
	serves := s.serves[model]
	n := len(snap.Replicas)
	for w := 0; w*64 < n; w++ {
		var keep uint64
		if w < len(s.unknown) {
			keep |= s.unknown[w]
		}
		if w < len(serves) {
			keep |= serves[w]
		}
		drop := ^keep
		if rest := n - w*64; rest < 64 {
			drop &= 1<<rest - 1
		}
		for ; drop != 0; drop &= drop - 1 {
			c.force(snap, w*64+bits.TrailingZeros64(drop))
		}
	}
}
