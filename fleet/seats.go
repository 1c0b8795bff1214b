package fleet

import "github.com/kvrouter/kvrouter/scrape"

// An engine runs at most max_num_seqs sequences at once (vLLM's
// scheduler; SGLang's max_running_requests), and the kv-aware policy
// prices a seat's wait when they are all taken (route.Rates.MaxSeqs). The
// router knows the limit from the backend's max_num_seqs= option, or
// learns it from the engine's load: two scrapes in a row with requests
// waiting and the same number running show an engine that could not
// start them, so those running are as many as it runs at once. (One
// scrape is not enough: a request that arrived since the engine's last
// iteration waits for the next one whatever its batch.) That is a lower
// bound of max_num_seqs when memory, not seats, held the waiting ones
// back (a full KV cache); the bound rises with every pair of scrapes that
// shows more, and seen over an engine's busy periods it is the
// concurrency the engine gives.

// seatsSeen returns the seats learned (seen) after scrape l, which
// followed prev: the most sequences running in two scrapes in a row
// while others waited.
func seatsSeen(seen int, prev, l scrape.Load) int {
	if l.Waiting > 0 && prev.Waiting > 0 && l.Running == prev.Running && l.Running > seen {
		return l.Running
	}
	return seen
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
