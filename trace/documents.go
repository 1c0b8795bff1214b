package trace

import (
	"cmp"
	"fmt"
	"math"
)

// Document-QA defaults: the working set is docFill times the fleet's KV,
// so it cycles through every GPU cache but fits GPU and CPU tiers four
// times as large as the GPU's.
const (
	docMedian   = 12 << 10 // document tokens, median
	docQuestion = 120      // question tokens, median
	docAnswer   = 150      // answer tokens, median
	docRounds   = 4        // visits of every session
	docFill     = 3.0      // working set ÷ fleet KV
	docSessions = 600      // sessions without FleetKVTokens
	docRate     = 20.0     // requests/s
)

// docSessionsFor is how many document sessions make docFill times a
// fleet of kvTokens of KV (docSessions at zero).
func docSessionsFor(kvTokens int) int {
	if kvTokens <= 0 {
		return docSessions
	}
	per := docMedian + docRounds*(docQuestion+docAnswer)
	return max(1, int(math.Round(docFill*float64(kvTokens)/float64(per))))
}

// documentQA: sessions over long documents, revisited in rounds. Groups
// (docSessionsFor FleetKVTokens: 600 at zero) sessions each hold one
// document (log-normal, median 12k tokens, 2k to 32k) and ask a question
// (median 120 tokens) per visit, answered in about 150 tokens; each
// visit's prompt is the document and the conversation so far. Every round
// visits every session once, in a shuffled order, so between two turns of
// a session every other session is served: their documents together
// (3 × the fleet's KV) cycle through each replica's GPU cache, the worst
// case of an LRU, which keeps nothing a session asks for again; a CPU
// tier four times the GPU's holds them. Requests (Groups × 4 rounds)
// cuts the rounds short, Poisson arrivals at Rate (20/s); Session is the
// session.
func documentQA(opt GenOptions) []Request {
	g := newGen(opt.Seed, streamDocs)
	sessions := cmp.Or(opt.Groups, docSessionsFor(opt.FleetKVTokens))
	n, rate := cmp.Or(opt.Requests, docRounds*sessions), cmp.Or(opt.Rate, docRate)
	segs := make([][]Segment, sessions)
	for s := range segs {
		segs[s] = []Segment{g.seg(g.logNormal(docMedian, 0.5, 2<<10, 32<<10))}
	}
	reqs := make([]Request, 0, n)
	for len(reqs) < n {
		for _, s := range g.rng.Perm(sessions) {
			if len(reqs) == n {
				break
			}
			segs[s] = append(segs[s], g.seg(g.logNormal(docQuestion, 0.6, 8, 1024)))
			out := g.logNormal(docAnswer, 0.6, 8, 1024)
			reqs = append(reqs, request(g.arrive(rate), fmt.Sprintf("doc-%d", s), "", segs[s], out))
			segs[s] = append(segs[s], g.seg(out))
		}
	}
	return reqs
}
