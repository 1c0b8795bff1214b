package trace

import (
	"cmp"

	"github.com/kvrouter/kvrouter/route"
)

// SLO classes of the interactive-batch workload.
const (
	// ClassInteractive: chat turns, short prompts and answers, a user
	// waiting for the first token.
	ClassInteractive = "interactive"
	// ClassBatch: long documents processed offline, long answers, no one
	// waiting for the first token.
	ClassBatch = "batch"
)

// interactiveBatch: one fleet serving two SLO classes. Requests (2,000)
// arrive as one Poisson process at Rate (8/s); three in four are
// interactive, the rest batch, drawn independently.
//
//   - interactive: one of 4 shared 1,024-token system prompts, then a
//     question (log-normal, median 100 tokens), answered in median 120
//     tokens (at most 512), as a chat assistant's turn;
//   - batch: one of Groups (32) documents (log-normal, median 8,192
//     tokens, 1k to 16k), then an instruction (median 200 tokens),
//     answered in median 800 tokens (64 to 2,048), as a summarization or
//     extraction job over a corpus, each document asked about again.
//
// Each request carries its class with zero bounds: the simulator
// derives each class's TTFT and ITL bounds from its own requests and the
// preset, as it derives the run's (sim/slo.go), so that the interactive
// class's prompts give it a tight TTFT and the batch class's long ones a
// loose one.
func interactiveBatch(opt GenOptions) []Request {
	g := newGen(opt.Seed, streamClasses)
	n, rate, docs := cmp.Or(opt.Requests, 2000), cmp.Or(opt.Rate, 8), cmp.Or(opt.Groups, 32)
	sys := make([]Segment, 4)
	for i := range sys {
		sys[i] = g.seg(1024)
	}
	corpus := make([]Segment, docs)
	for i := range corpus {
		corpus[i] = g.seg(g.logNormal(8192, 0.5, 1024, 16384))
	}
	reqs := make([]Request, 0, n)
	for range n {
		at := g.arrive(rate)
		if g.rng.IntN(4) < 3 {
			k := g.rng.IntN(len(sys))
			r := request(at, "", tenantName(k), []Segment{sys[k], g.seg(g.logNormal(100, 0.8, 8, 2048))}, g.logNormal(120, 0.6, 8, 512))
			r.SLO = route.SLO{Class: ClassInteractive}
			reqs = append(reqs, r)
			continue
		}
		k := g.rng.IntN(docs)
		r := request(at, "", groupName(k), []Segment{corpus[k], g.seg(g.logNormal(200, 0.5, 16, 2048))}, g.logNormal(800, 0.5, 64, 2048))
		r.SLO = route.SLO{Class: ClassBatch}
		reqs = append(reqs, r)
	}
	return reqs
}
