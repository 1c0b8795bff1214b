package fleet

import (
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/route"
	"github.com/kvrouter/kvrouter/scrape"
)

// maxSeqs returns replica i's Rates.MaxSeqs as a snapshot shows it.
func maxSeqs(f *Fleet, i int) int {
	var s route.Snapshot
	f.Snapshot(&s, t0, 16)
	return s.Replicas[i].Rates.MaxSeqs
}

// TestSeatsLearned: a replica's max_num_seqs is learned from its scrapes
// (of an engine that reports no query counter), the sequences running
// over five scrapes in a row with requests waiting, and only so: one
// scrape with a request waiting (arrived between two iterations), or a
// batch that grew while requests waited, teaches nothing; a larger
// saturated batch raises it; the configured MaxNumSeqs wins over it.
func TestSeatsLearned(t *testing.T) {
	preset := route.Rates{MaxSeqs: 256}
	f := newFleet(t, Config{Replicas: []Replica{{ID: a}, {ID: b, MaxNumSeqs: 4}}, Rates: preset})
	steps := []struct {
		running, waiting int
		want             int
	}{
		{2, 1, 256}, // the first scrape: nothing to compare with
		{2, 0, 256},
		{3, 1, 256}, // one scrape with a request waiting
		{5, 2, 256}, // the batch grew while they waited: not full
		{8, 3, 256},
		{8, 6, 256}, // 8 twice with requests waiting: not yet
		{8, 5, 256},
		{8, 5, 256},
		{8, 5, 8}, // five times: 8 seats
		{6, 1, 8}, // fewer: the bound stays
		{6, 1, 8},
		{12, 4, 8},
		{12, 9, 8},
		{12, 9, 8},
		{12, 9, 8},
		{12, 9, 12}, // more seats shown: it rises
	}
	for k, st := range steps {
		l := scrape.Load{Running: st.running, Waiting: st.waiting, At: t0.Add(time.Duration(k) * time.Second)}
		f.SetLoad(a, l)
		f.SetLoad(b, l)
		if got := maxSeqs(f, 0); got != st.want {
			t.Errorf("after scrape %d (%d running, %d waiting): MaxSeqs %d, want %d", k, st.running, st.waiting, got, st.want)
		}
		if got := maxSeqs(f, 1); got != 4 {
			t.Errorf("after scrape %d: configured replica's MaxSeqs %d, want its 4", k, got)
		}
	}
}

// TestSeatsNotLearnedFromAFullCache: requests held back by a nearly full
// KV cache say nothing of the seats, however long the batch stays.
func TestSeatsNotLearnedFromAFullCache(t *testing.T) {
	f := newFleet(t, Config{Replicas: []Replica{{ID: a}}, Rates: route.Rates{MaxSeqs: 256}})
	for k := range 10 {
		f.SetLoad(a, scrape.Load{Running: 8, Waiting: 5, KVUsage: 0.95, At: t0.Add(time.Duration(k) * time.Second)})
	}
	if got := maxSeqs(f, 0); got != 256 {
		t.Errorf("MaxSeqs %d after a full cache held 8 running, want the preset's 256", got)
	}
}

// TestSeatsNotLearnedWithoutAdmissions: a batch held with requests waiting
// while the engine admits none (a long prompt's chunks taking the token
// budget) says nothing of the seats; the same batch held while the engine
// admits requests as others leave is full.
func TestSeatsNotLearnedWithoutAdmissions(t *testing.T) {
	f := newFleet(t, Config{Replicas: []Replica{{ID: a}}, Rates: route.Rates{MaxSeqs: 256}})
	for k := range 10 {
		f.SetLoad(a, scrape.Load{Running: 12, Waiting: 3, KVUsage: 0.4, PrefixQueries: 5000, At: t0.Add(time.Duration(k) * time.Second)})
	}
	if got := maxSeqs(f, 0); got != 256 {
		t.Fatalf("MaxSeqs %d after 10 scrapes held with no admission, want the preset's 256", got)
	}
	for k := range 5 {
		f.SetLoad(a, scrape.Load{Running: 12, Waiting: 3, KVUsage: 0.4, PrefixQueries: 5000 + 100*float64(k), At: t0.Add(time.Duration(10+k) * time.Second)})
	}
	if got := maxSeqs(f, 0); got != 12 {
		t.Errorf("MaxSeqs %d after five scrapes held while admitting, want 12", got)
	}
}
