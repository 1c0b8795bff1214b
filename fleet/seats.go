package fleet

import "github.com/kvrouter/kvrouter/scrape"

// An engine runs at most max_num_seqs sequences at once (vLLM's
// scheduler; SGLang's max_running_requests), and the kv-aware policy
// prices a seat's wait when they are all taken (route.Rates.MaxSeqs). The
// router knows the limit from the backend's max_num_seqs= option, or
// learns it from the engine's load: five scrapes in a row with requests
// waiting, the same number running and the KV cache not nearly full show
// an engine that could not start them, so those running are as many as it
// runs at once. Fewer are not enough: a request that arrived since the
// engine's last iteration waits for the next one whatever its batch, and
// a long prompt's chunks can hold the others back for a few iterations
// (the scheduler's token budget) with the batch unchanged by chance over
// two or three scrapes (on llm-d's multi-tenant benchmark at load 0.95 in
// the simulator, three were not enough); a full cache holds them back
// too. What it learns is a lower bound of
// max_num_seqs, which rises with every streak that shows more: seen over
// an engine's busy periods, the concurrency the engine gives.

// seatStreakLen is the scrapes in a row, after the first, that show the
// same batch held with requests waiting before it counts as the seats.
const seatStreakLen = 4

// seatKVFull is the KV usage from which waiting requests may be held by
// memory rather than seats.
const seatKVFull = 0.9

// seatsSeen returns the seats learned (seen) after scrape l, which
// followed prev, and the streak of scrapes that showed the same batch
// held with requests waiting (streak, before l).
func seatsSeen(seen, streak int, prev, l scrape.Load) (int, int) {
	held := l.Waiting > 0 && prev.Waiting > 0 && l.Running == prev.Running && !(l.KVUsage >= seatKVFull)
	if !held {
		return seen, 0
	}
	if streak++; streak >= seatStreakLen && l.Running > seen {
		return l.Running, streak
	}
	return seen, streak
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
