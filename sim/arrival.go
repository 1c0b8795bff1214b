package sim

import (
	"time"

	"kvrouter/engine"
	"kvrouter/report"
	"kvrouter/route"
)

// onArrival routes job j and hands it to the chosen engine.
func (r *runner) onArrival(j int) {
	if j == r.next {
		r.next++
		if r.next < len(r.jobs) {
			r.q.push(event{at: r.jobs[r.next].at, kind: evArrival, idx: int32(r.next)})
		}
	}
	jb := &r.jobs[j]
	req := r.request(jb)
	r.fillSnapshot()
	d := r.policy.Pick(req, &r.snap)
	if d.Replica < 0 || d.Replica >= len(r.reps) || !r.reps[d.Replica].alive {
		r.reject(j, -1, d.Reason, rejectPolicy)
		return
	}
	i := d.Replica
	rp := &r.reps[i]
	er := &r.ereq[j]
	*er = engine.Request{ID: jb.id, Prompt: jb.prompt, Hashes: jb.hashes, MaxTokens: jb.output}
	if err := rp.eng.Add(r.now, er); err != nil {
		r.reject(j, i, d.Reason, rejectEngine)
		return
	}
	f := &r.flights[j]
	*f = flight{rep: int32(i), routed: r.now, first: -1, predicted: min(d.Matched, jb.prompt),
		reason: d.Reason, active: true}
	for _, c := range d.Costs {
		if c.Replica == i {
			// Calibrate as the live fleet does (fleet.ObserveTTFT): the
			// unscaled Wait+Prefill+Decode against the observed TTFT.
			scale := rp.rates.Scale
			if scale <= 0 {
				scale = 1
			}
			f.predTTFT = time.Duration(float64(c.Wait+c.Prefill+c.Decode) / scale)
			break
		}
	}
	f.uncached = jb.prompt - f.predicted
	f.blocks = (jb.prompt + jb.output + r.snap.BlockSize - 1) / r.snap.BlockSize
	rp.inFlight++
	rp.prefillTokens += f.uncached
	rp.decodeBlocks += f.blocks
	if r.needs.Window > 0 {
		rp.recent.add(r.now, f.uncached)
	}
	r.byID[jb.id] = int32(j)
	r.live++
	if jb.session != 0 {
		r.sessions[jb.session] = int32(i)
	}
	if r.kind == route.Approximate {
		r.idx.touch(i, r.idxHash, r.now)
	}
	if rp.wake < 0 {
		r.step(i)
	}
}

// request fills the reused route.Request for jb (and r.idxHash, the
// index's view of its blocks).
func (r *runner) request(jb *job) *route.Request {
	r.seq++
	n := len(r.reps)
	req := &r.req
	*req = route.Request{ID: jb.id, Hash: jb.hash, Seq: r.seq, Tokens: jb.prompt, MaxTokens: jb.output,
		Blocks: jb.prompt / r.snap.BlockSize, Session: jb.session, Pinned: -1, PrefixKey: jb.prefixKey}
	if jb.session != 0 {
		if p, ok := r.sessions[jb.session]; ok {
			req.Pinned = int(p)
		}
	}
	if cap(r.costs) < n {
		r.costs = make([]route.Cost, n)
	}
	req.Costs = r.costs[:n]
	if r.idx == nil {
		return req
	}
	r.idxHash = r.idxHash[:0]
	if r.k == 1 {
		r.idxHash = append(r.idxHash, jb.hashes...)
	} else {
		// An index block of k engine blocks is named by the chained hash
		// of its last engine block, which covers the whole prefix.
		for b := r.k - 1; b < len(jb.hashes); b += r.k {
			r.idxHash = append(r.idxHash, jb.hashes[b])
		}
	}
	req.Match, req.Age = r.idx.lookup(r.idxHash, r.now)
	if r.kind == route.Precise {
		// The engines' events say what is resident: no decay by age.
		req.Age = nil
	}
	return req
}

// fillSnapshot refreshes the snapshot: own counts now, engine metrics as of
// the last scrape.
func (r *runner) fillSnapshot() {
	cacheBlocks := r.cfg.Preset.NumBlocks / r.k
	for i := range r.reps {
		rp := &r.reps[i]
		s := &r.snap.Replicas[i]
		s.Healthy = rp.alive
		s.Running, s.Waiting, s.KVUsage, s.Scraped = rp.running, rp.waiting, rp.kvUsage, rp.scraped
		s.LoadAge = 0
		if rp.scraped {
			s.LoadAge = r.now - rp.scrapedAt
		}
		s.InFlight, s.PrefillTokens, s.Decoding, s.DecodeBlocks = rp.inFlight, rp.prefillTokens, rp.decoding, rp.decodeBlocks
		s.RecentPrefill = 0
		if r.needs.Window > 0 {
			s.RecentPrefill = rp.recent.sum(r.now - r.needs.Window)
		}
		s.CacheBlocks = cacheBlocks
		s.IndexBlocks = 0
		if r.idx != nil {
			s.IndexBlocks = r.idx.held(i)
		}
		s.Rates = rp.rates
	}
}

// reject records job j as not served: rejected by the policy, refused by
// replica i's engine or failed with replica i (errors).
func (r *runner) reject(j, i int, reason string, cause int) {
	jb := &r.jobs[j]
	s := report.Sample{At: jb.at, Prompt: jb.prompt, Replica: i, Reason: reason, Rejected: cause == rejectPolicy}
	if cause == rejectKilled {
		s.E2E = r.now - jb.at
	}
	r.res.samples = append(r.res.samples, s)
	r.progress()
}

// window sums values over a sliding time window: a FIFO of (time, value).
type window struct {
	at   []time.Duration
	v    []int
	head int
	sum_ int
}

func (w *window) add(t time.Duration, v int) {
	if w.head > 1024 && w.head*2 > len(w.at) { // compact
		w.at = append(w.at[:0], w.at[w.head:]...)
		w.v = append(w.v[:0], w.v[w.head:]...)
		w.head = 0
	}
	w.at = append(w.at, t)
	w.v = append(w.v, v)
	w.sum_ += v
}

// sum drops entries before since and returns the total of the rest.
func (w *window) sum(since time.Duration) int {
	for w.head < len(w.at) && w.at[w.head] < since {
		w.sum_ -= w.v[w.head]
		w.head++
	}
	return w.sum_
}
