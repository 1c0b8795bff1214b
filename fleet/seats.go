package fleet

import "github.com/kvrouter/kvrouter/scrape"

// An engine runs at most max_num_seqs sequences at once (vLLM's
// scheduler; SGLang's max_running_requests), and the kv-aware policy
// prices a seat's wait when they are all taken (route.Rates.MaxSeqs). The
// router knows the limit from the backend's max_num_seqs= option, or
// learns it from the engine's load: the signature of a full batch is
// requests leaving and waiting ones taking their seats with the count
// unchanged. Five scrapes in a row with requests waiting, the same number
// running and the KV cache not nearly full, over which the engine admitted
// new requests (its prefix-cache query counter rose), show an engine that
// starts one only when another leaves, so those running are as many as it
// runs at once. Fewer scrapes are not enough: a request that arrived
// since the engine's last iteration waits for the next one whatever its
// batch. And a batch held without admissions is held by something else:
// a long prompt's chunks taking the scheduler's whole token budget for
// many iterations (document-qa's documents hold an engine so for seconds
// with 10 to 18 running), or a prompt that does not fit the free blocks.
// An engine that reports no query counter is judged on the streak alone.
// (A burst of identical requests, which leave together and are replaced
// together between two scrapes, shows no admission within a streak and
// teaches nothing; traffic whose answers differ in length does.)
// What it learns is a lower bound of max_num_seqs, which rises with every
// streak that shows more: seen over an engine's busy periods, the
// concurrency the engine gives.

// seatStreakLen is the scrapes in a row, after the first, that show the
// same batch held with requests waiting before it counts as the seats.
const seatStreakLen = 4

// seatKVFull is the KV usage from which waiting requests may be held by
// memory rather than seats.
const seatKVFull = 0.9

// seatWatch follows a streak of scrapes that showed the same batch held
// with requests waiting.
type seatWatch struct {
	// streak is the scrapes in the streak after its first.
	streak int
	// queries is the engine's prefix-cache query counter at the streak's
	// first scrape.
	queries float64
}

// seatsSeen returns the seats learned (seen) after scrape l, which
// followed prev, and the streak w as it stands after l.
func seatsSeen(seen int, w seatWatch, prev, l scrape.Load) (int, seatWatch) {
	if l.Slots > 0 {
		return l.Slots, seatWatch{} // llama.cpp says: its slots (/slots)
	}
	held := l.Waiting > 0 && prev.Waiting > 0 && l.Running == prev.Running && !(l.KVUsage >= seatKVFull)
	if !held {
		return seen, seatWatch{}
	}
	if w.streak == 0 {
		w.queries = prev.PrefixQueries
	}
	w.streak++
	counted := l.PrefixQueries > 0 || prev.PrefixQueries > 0
	admitted := !counted || l.PrefixQueries > w.queries
	if w.streak >= seatStreakLen && admitted && l.Running > seen {
		return l.Running, w
	}
	return seen, w
}

// maxSeqsSource says where maxSeqsLocked's answer comes from:
// configured, learned or preset (view.Replica.MaxSeqsSource).
func (r *replica) maxSeqsSource() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.maxSeqs > 0:
		return "configured"
	case r.seats > 0:
		return "learned"
	}
	return "preset"
}

// maxSeqsLocked is the replica's max_num_seqs: the one configured, else
// the seats learned, else preset (the fleet's Rates.MaxSeqs). r.mu is
// held.
func (r *replica) maxSeqsLocked(preset int) int {
	switch {
	case r.maxSeqs > 0:
		return r.maxSeqs
	case r.seats > 0:
		return r.seats
	}
	return preset
}
