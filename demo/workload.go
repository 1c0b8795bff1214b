package demo

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/kvrouter/kvrouter/trace"
)

// ChatWorkload is the name of the demo's own workload (Workload).
const ChatWorkload = "demo-chat"

// Shape of ChatWorkload, in tokens and model time. Chosen so the policies
// differ visibly and the run stays short: a long system prompt every
// conversation shares, conversations of several turns whose history grows
// past the system prompt, more live conversations than replicas (so
// round-robin scatters them), and a moderate load (a replica is busy a
// fraction of the time, so queueing does not dominate).
const (
	chatSystem      = 1500                     // shared system prompt
	chatQuestion    = 120                      // median user message
	chatAnswer      = 250                      // median answer kept in the history
	chatOutput      = 32                       // tokens generated per turn
	chatMinTurns    = 4                        // turns per conversation: 4..9
	chatMaxTurns    = 9                        //
	chatThink       = 4 * time.Second          // mean think time between turns
	chatSessionRate = 0.5                      // conversations starting per model second
	chatFirstID     = uint64(0x64656d6f) << 32 // "demo": segment ids of this workload
)

// Workload returns about n requests of the named workload, deterministic
// given seed: ChatWorkload, or any trace.Generate workload (its arrivals
// compressed so it spans at most span of model time).
func Workload(name string, n int, seed uint64, span time.Duration) ([]trace.Request, error) {
	if n <= 0 {
		return nil, fmt.Errorf("workload %s: request count %d < 1", name, n)
	}
	if name == ChatWorkload || name == "" {
		return chat(n, seed), nil
	}
	w, err := trace.Generate(name, trace.GenOptions{Seed: seed, Requests: n})
	if err != nil {
		return nil, err
	}
	reqs := w.Requests
	if len(reqs) > n {
		reqs = reqs[:n]
	}
	if st := trace.Summary(reqs); span > 0 && st.Duration > span {
		trace.Scale(reqs, float64(span)/float64(st.Duration))
	}
	return reqs, nil
}

// chat generates ChatWorkload: conversations start as a Poisson process;
// each turn's prompt is the shared system prompt, every earlier question
// and answer, and a new question (log-normal lengths); the next turn comes
// a think time (exponential) after the previous one's arrival plus its
// expected service. Requests are sorted by arrival.
func chat(n int, seed uint64) []trace.Request {
	rng := rand.New(rand.NewPCG(seed, 0x64656d6f))
	id := chatFirstID
	seg := func(tokens int) trace.Segment {
		id++
		return trace.Segment{ID: id, Tokens: max(tokens, 1)}
	}
	logNormal := func(median, sigma float64) int {
		return int(math.Round(median * math.Exp(sigma*rng.NormFloat64())))
	}
	sys := seg(chatSystem)
	var reqs []trace.Request
	var start time.Duration
	for s := 0; len(reqs) < n; s++ {
		start += time.Duration(rng.ExpFloat64() / chatSessionRate * float64(time.Second))
		at := start
		segs := []trace.Segment{sys}
		for turn := range chatMinTurns + rng.IntN(chatMaxTurns-chatMinTurns+1) {
			segs = append(segs, seg(min(max(logNormal(chatQuestion, 0.5), 16), 1024)))
			cp := append([]trace.Segment(nil), segs...)
			prompt := 0
			for _, g := range cp {
				prompt += g.Tokens
			}
			reqs = append(reqs, trace.Request{
				ID: fmt.Sprintf("chat-%d-%d", s, turn), At: at, Session: fmt.Sprintf("chat-%d", s),
				Segments: cp, Prompt: prompt, Output: chatOutput,
			})
			segs = append(segs, seg(min(max(logNormal(chatAnswer, 0.5), 16), 2048)))
			at += time.Second + time.Duration(rng.ExpFloat64()*float64(chatThink))
			if len(reqs) >= n {
				break
			}
		}
	}
	sortByArrival(reqs)
	return reqs
}

// sortByArrival sorts reqs by At, keeping generation order for ties.
func sortByArrival(reqs []trace.Request) {
	slices.SortStableFunc(reqs, func(a, b trace.Request) int { return cmp.Compare(a.At, b.At) })
}
