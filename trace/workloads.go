package trace

import (
	"fmt"
	"time"
)

// Stream constants keep the workloads' random sequences apart for one seed.
const (
	streamShared = iota + 1
	streamTenant
	streamChat
	streamAgent
	streamUnique
	streamHot
)

// sharedPrefix: Groups (64) × PerGroup (16) prompts, each a 2,048-token
// group prefix and a 128-token unique question, 256 output tokens, in random
// order, Poisson arrivals at Rate (10/s). Requests, if set, picks the
// number of groups: Requests/PerGroup, rounded up.
func sharedPrefix(opt GenOptions) []Request {
	g := newGen(opt.Seed, streamShared)
	per := or(opt.PerGroup, 16)
	groups := or(opt.Groups, 64)
	if opt.Requests > 0 && opt.Groups == 0 {
		groups = (opt.Requests + per - 1) / per
	}
	rate := or(opt.Rate, 10)
	prefixes := make([]Segment, groups)
	for i := range prefixes {
		prefixes[i] = g.seg(2048)
	}
	reqs := make([]Request, 0, groups*per)
	for _, k := range g.rng.Perm(groups * per) {
		grp := k / per
		reqs = append(reqs, request(g.arrive(rate), "", groupName(grp),
			[]Segment{prefixes[grp], g.seg(128)}, 256))
	}
	return reqs
}

// multiTenant: Groups (256) tenants × PerGroup (4) users, each request a
// 6,000-token tenant context and a 1,200-token unique query, 256 output
// tokens; Requests (2,048) in all. The arrival rate ramps linearly from
// Rate/4 to Rate (8/s) and the set of active tenants grows with it (the
// request at fraction f of the run picks among the first ⌈f·Groups⌉
// tenants), so the live contexts (256 × 6,000 = 1.5M tokens) end up needing
// several times one replica's KV (about 450k tokens on an H100 with
// Llama-3-8B). Session is the user.
func multiTenant(opt GenOptions) []Request {
	g := newGen(opt.Seed, streamTenant)
	groups, users := or(opt.Groups, 256), or(opt.PerGroup, 4)
	n, peak := or(opt.Requests, 2048), or(opt.Rate, 8)
	ctx := make([]Segment, groups)
	for i := range ctx {
		ctx[i] = g.seg(6000)
	}
	reqs := make([]Request, 0, n)
	for i := range n {
		f := float64(i+1) / float64(n)
		active := max(1, min(groups, int(f*float64(groups)+0.999999)))
		grp, user := g.rng.IntN(active), g.rng.IntN(users)
		rate := peak/4 + (peak-peak/4)*f
		reqs = append(reqs, request(g.arrive(rate), fmt.Sprintf("%s-u%d", groupName(grp), user),
			groupName(grp), []Segment{ctx[grp], g.seg(1200)}, 256))
	}
	return reqs
}

// multiTurn: chat sessions of 3–30 turns (uniform) starting as a Poisson
// process, until about Requests (4,000) turns. A turn's prompt is one of 4
// shared 200-token system prompts, then every earlier user message and
// answer, then the new user message; user messages and answers have
// ShareGPT-like log-normal lengths (median 80 and 250 tokens). The next turn
// arrives after the answer's generation (25 ms/token) plus a think time
// (exponential, mean 30 s). A session stops early past 16k tokens. Sessions
// start at Rate/16.5 per second (Rate defaults to 2/s; early stops make the
// real request rate somewhat lower).
func multiTurn(opt GenOptions) []Request {
	g := newGen(opt.Seed, streamChat)
	n, rate := or(opt.Requests, 4000), or(opt.Rate, 2)
	const meanTurns = 16.5
	sys := make([]Segment, 4)
	for i := range sys {
		sys[i] = g.seg(200)
	}
	var reqs []Request
	for s := 0; len(reqs) < n; s++ {
		name := fmt.Sprintf("chat-%d", s)
		at := g.arrive(rate / meanTurns)
		segs := []Segment{sys[g.rng.IntN(len(sys))]}
		for range 3 + g.rng.IntN(28) {
			segs = append(segs, g.seg(g.logNormal(80, 1.1, 4, 4096)))
			out := g.logNormal(250, 0.8, 4, 2048)
			reqs = append(reqs, request(at, name, "", segs, out))
			segs = append(segs, g.seg(out))
			if promptOf(segs) > 16<<10 || len(reqs) >= n {
				break
			}
			at += time.Duration(out)*25*time.Millisecond + g.exp(30*time.Second)
		}
	}
	return reqs
}

// agentic: agent runs of Groups (8) tenants. Every prompt starts with the
// same 1,536-token tool schemas (shared across tenants), then the tenant's
// 400-token instructions, the run's task (median 300 tokens), and the
// loop so far: per step a tool call (the previous output, median 80 tokens)
// and its result (median 300 tokens). Runs take 5–40 steps and start as a
// Poisson process; a step follows the previous one after its generation
// (20 ms/token) and a fast tool call (exponential, mean 1 s). A run stops
// past 32k tokens. About Requests (3,000) steps in all; runs start at
// Rate/22.5 per second (Rate defaults to 4/s).
func agentic(opt GenOptions) []Request {
	g := newGen(opt.Seed, streamAgent)
	n, rate, tenants := or(opt.Requests, 3000), or(opt.Rate, 4), or(opt.Groups, 8)
	const meanSteps = 22.5
	tools := g.seg(1536)
	inst := make([]Segment, tenants)
	for i := range inst {
		inst[i] = g.seg(400)
	}
	var reqs []Request
	for run := 0; len(reqs) < n; run++ {
		t := g.rng.IntN(tenants)
		name := fmt.Sprintf("agent-%d", run)
		at := g.arrive(rate / meanSteps)
		segs := []Segment{tools, inst[t], g.seg(g.logNormal(300, 0.6, 20, 4000))}
		for range 5 + g.rng.IntN(36) {
			out := g.logNormal(80, 0.6, 8, 1024)
			reqs = append(reqs, request(at, name, tenantName(t), segs, out))
			segs = append(segs, g.seg(out), g.seg(g.logNormal(300, 1.0, 10, 8000)))
			if promptOf(segs) > 32<<10 || len(reqs) >= n {
				break
			}
			at += time.Duration(out)*20*time.Millisecond + g.exp(time.Second)
		}
	}
	return reqs
}

// unique: Requests (2,000) prompts with no shared content (log-normal,
// median 1,024 tokens), log-normal outputs (median 200), Poisson arrivals
// at Rate (8/s).
func unique(opt GenOptions) []Request {
	g := newGen(opt.Seed, streamUnique)
	n, rate := or(opt.Requests, 2000), or(opt.Rate, 8)
	reqs := make([]Request, 0, n)
	for range n {
		reqs = append(reqs, request(g.arrive(rate), "", "",
			[]Segment{g.seg(g.logNormal(1024, 0.8, 16, 16384))}, g.logNormal(200, 0.7, 1, 2048)))
	}
	return reqs
}

// hotPrefix: Requests (2,000) at Rate (20/s); half use one hot 4,096-token
// prefix, the other half one of Groups (128) cold 2,048-token prefixes;
// each adds a 256-token unique question and asks for 128 tokens.
func hotPrefix(opt GenOptions) []Request {
	g := newGen(opt.Seed, streamHot)
	n, rate, groups := or(opt.Requests, 2000), or(opt.Rate, 20), or(opt.Groups, 128)
	hot := g.seg(4096)
	cold := make([]Segment, groups)
	for i := range cold {
		cold[i] = g.seg(2048)
	}
	reqs := make([]Request, 0, n)
	for range n {
		p, tenant := hot, "hot"
		if g.rng.IntN(2) == 1 {
			k := g.rng.IntN(groups)
			p, tenant = cold[k], groupName(k)
		}
		reqs = append(reqs, request(g.arrive(rate), "", tenant, []Segment{p, g.seg(256)}, 128))
	}
	return reqs
}

func groupName(i int) string  { return fmt.Sprintf("g%03d", i) }
func tenantName(i int) string { return fmt.Sprintf("t%02d", i) }
