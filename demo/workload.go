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

// The demo's workload mixes three kinds of traffic (trace.Request.Tenant
// names the kind), each a case the routing seed names:
//
//   - chat: conversations of several turns, each extending its own
//     history after a shared system prompt. Session affinity is enough
//     here; round-robin scatters a conversation and prefills it again.
//   - docs: short question sessions over a few long documents, many
//     sessions per document. The reuse crosses sessions: a policy that
//     places by session prefills a document once on every replica its
//     sessions hash to; one that knows where the document is cached
//     prefills it once.
//   - agent: one hot agent session that, for a while, sends more work
//     (long tool results after shared tool schemas) than one replica
//     can prefill. Pinned to one replica, it queues there, and the
//     conversations hashed to that replica queue behind it; spread over
//     the fleet once its prefix is worth copying, it does not.
//
// Sizes are in tokens and model time, chosen so the three kinds differ
// visibly and a run stays short.
const (
	chatSystem      = 1500            // shared system prompt
	chatQuestion    = 120             // median user message
	chatAnswer      = 250             // median answer kept in the history
	chatOutput      = 32              // tokens generated per turn
	chatMinTurns    = 4               // turns per conversation: 4..9
	chatMaxTurns    = 9               //
	chatThink       = 4 * time.Second // mean think time between turns
	chatSessionRate = 0.4             // conversations starting per model second

	docCount       = 12              // documents
	docTokens      = 5000            // tokens per document, after a shared instruction
	docInstruction = 300             // shared instruction before every document
	docQuestion    = 80              // median question
	docMaxTurns    = 2               // questions per session: 1..2
	docThink       = 3 * time.Second // mean think time between questions
	docSessionRate = 0.8             // document sessions starting per model second
	docShare       = 0.45            // share of the requests that are document questions
	docOutput      = 32              // tokens generated per answer

	agentSchemas = 2500                     // the agent's tool schemas
	agentResult  = 4000                     // median tool result a step adds
	agentStart   = 25 * time.Second         // when the hot agent session starts
	agentRate    = 5                        // its steps per model second
	agentOutput  = 32                       // tokens generated per step
	agentShare   = 0.1                      // share of the requests that are the agent's
	chatFirstID  = uint64(0x64656d6f) << 32 // "demo": segment ids of this workload
)

// Workload returns about n requests of the named workload, deterministic
// given seed: ChatWorkload, or any trace.Generate workload (its arrivals
// compressed so it spans at most span of model time).
func Workload(name string, n int, seed uint64, span time.Duration) ([]trace.Request, error) {
	if n <= 0 {
		return nil, fmt.Errorf("workload %s: request count %d < 1", name, n)
	}
	if name == ChatWorkload || name == "" {
		return mixed(n, seed), nil
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

// gen draws the workload's random parts and numbers its segments.
type gen struct {
	rng *rand.Rand
	id  uint64
}

// seg returns a new segment of tokens (at least 1).
func (g *gen) seg(tokens int) trace.Segment {
	g.id++
	return trace.Segment{ID: g.id, Tokens: max(tokens, 1)}
}

// logNormal draws a length of the given median, clamped to lo..hi.
func (g *gen) logNormal(median, sigma float64, lo, hi int) int {
	return min(max(int(math.Round(median*math.Exp(sigma*g.rng.NormFloat64()))), lo), hi)
}

// exp draws an exponential duration of the given mean.
func (g *gen) exp(mean time.Duration) time.Duration {
	return time.Duration(g.rng.ExpFloat64() * float64(mean))
}

// request builds one request of kind from a copy of segs.
func request(kind, session string, turn int, at time.Duration, segs []trace.Segment, output int) trace.Request {
	cp := slices.Clone(segs)
	prompt := 0
	for _, g := range cp {
		prompt += g.Tokens
	}
	return trace.Request{
		ID: fmt.Sprintf("%s-%d", session, turn), At: at, Session: session, Tenant: kind,
		Segments: cp, Prompt: prompt, Output: output,
	}
}

// mixed generates ChatWorkload: agentShare of n requests from the hot
// agent session, docShare document questions, the rest conversations,
// all sorted by arrival.
func mixed(n int, seed uint64) []trace.Request {
	g := &gen{rng: rand.New(rand.NewPCG(seed, 0x64656d6f)), id: chatFirstID}
	nAgent := int(math.Round(agentShare * float64(n)))
	if n < 8 {
		nAgent = 0
	}
	nDocs := int(math.Round(docShare * float64(n)))
	reqs := g.chat(n - nAgent - nDocs)
	reqs = append(reqs, g.docs(nDocs)...)
	reqs = append(reqs, g.agent(nAgent)...)
	sortByArrival(reqs)
	return reqs
}

// shape is one kind of question-and-answer session.
type shape struct {
	kind  string
	rate  float64       // sessions starting per model second
	think time.Duration // mean think time between turns
	// question is the median question; maxQuestion and maxAnswer bound
	// a question's and an answer's length.
	question, maxQuestion, maxAnswer int
	output                           int                    // tokens generated per turn
	prefix                           func() []trace.Segment // a session's leading segments
	turns                            func() int             // a session's number of turns
}

// sessions generates n turns of sessions of shape sh: they start as a
// Poisson process; each turn's prompt is the session's prefix, every
// earlier question and answer, and a new question (log-normal lengths);
// the next turn comes a second plus a think time (exponential) after the
// previous one's arrival.
func (g *gen) sessions(n int, sh shape) []trace.Request {
	var reqs []trace.Request
	var start time.Duration
	for s := 0; len(reqs) < n; s++ {
		start += g.exp(time.Duration(float64(time.Second) / sh.rate))
		at, session := start, fmt.Sprintf("%s-%d", sh.kind, s)
		segs := sh.prefix()
		for turn := range sh.turns() {
			segs = append(segs, g.seg(g.logNormal(float64(sh.question), 0.5, 16, sh.maxQuestion)))
			reqs = append(reqs, request(sh.kind, session, turn, at, segs, sh.output))
			segs = append(segs, g.seg(g.logNormal(chatAnswer, 0.5, 16, sh.maxAnswer)))
			at += time.Second + g.exp(sh.think)
			if len(reqs) >= n {
				break
			}
		}
	}
	return reqs
}

// chat generates n turns of conversations after the shared system
// prompt, chatMinTurns..chatMaxTurns turns each.
func (g *gen) chat(n int) []trace.Request {
	sys := g.seg(chatSystem)
	return g.sessions(n, shape{kind: "chat", rate: chatSessionRate, think: chatThink,
		question: chatQuestion, maxQuestion: 1024, maxAnswer: 2048, output: chatOutput,
		prefix: func() []trace.Segment { return []trace.Segment{sys} },
		turns:  func() int { return chatMinTurns + g.rng.IntN(chatMaxTurns-chatMinTurns+1) }})
}

// docs generates n questions of document sessions, each on one of
// docCount documents (uniformly) after a shared instruction, asking
// 1..docMaxTurns questions.
func (g *gen) docs(n int) []trace.Request {
	instr := g.seg(docInstruction)
	docs := make([]trace.Segment, docCount)
	for i := range docs {
		docs[i] = g.seg(docTokens)
	}
	return g.sessions(n, shape{kind: "docs", rate: docSessionRate, think: docThink,
		question: docQuestion, maxQuestion: 512, maxAnswer: 1024, output: docOutput,
		prefix: func() []trace.Segment { return []trace.Segment{instr, docs[g.rng.IntN(docCount)]} },
		turns:  func() int { return 1 + g.rng.IntN(docMaxTurns) }})
}

// agent generates n steps of one hot agent session from agentStart, at
// agentRate steps per second (Poisson): each step's prompt is the tool
// schemas, the task, and a tool result of its own (the agent fans out:
// its steps share the schemas and the task, not each other's results).
func (g *gen) agent(n int) []trace.Request {
	schemas, task := g.seg(agentSchemas), g.seg(200)
	var reqs []trace.Request
	at := agentStart
	for step := range n {
		segs := []trace.Segment{schemas, task, g.seg(g.logNormal(agentResult, 0.3, 256, 8192))}
		reqs = append(reqs, request("agent", "agent-0", step, at, segs, agentOutput))
		at += g.exp(time.Second / agentRate)
	}
	return reqs
}

// Parallel reports whether q, a request of ChatWorkload, goes out at its
// arrival time without waiting for its session's previous request: the
// agent's steps are parallel calls in one session (loadgen.Config's
// Parallel), as the simulator sends every request at its arrival.
func Parallel(q *trace.Request) bool { return q.Tenant == "agent" }

// sortByArrival sorts reqs by At, keeping generation order for ties.
func sortByArrival(reqs []trace.Request) {
	slices.SortStableFunc(reqs, func(a, b trace.Request) int { return cmp.Compare(a.At, b.At) })
}
