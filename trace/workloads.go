package trace

import (
	"cmp"
	"fmt"
	"math"
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
	streamDocs
	streamClasses
)

// sharedPrefix: Groups (64) × PerGroup (16) prompts, each a 2,048-token
// group prefix and a 128-token unique question, 256 output tokens, in random
// order, Poisson arrivals at Rate (10/s). Requests, if set, picks the
// number of groups: Requests/PerGroup, rounded up.
func sharedPrefix(opt GenOptions) []Request {
	g := newGen(opt.Seed, streamShared)
	per := cmp.Or(opt.PerGroup, 16)
	groups := cmp.Or(opt.Groups, 64)
	if opt.Requests > 0 && opt.Groups == 0 {
		groups = (opt.Requests + per - 1) / per
	}
	rate := cmp.Or(opt.Rate, 10)
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

// Shape of multi-tenant-context: llm-d's precise prefix-cache-aware routing
// benchmark (llm-d/llm-d guides/precise-prefix-cache-aware: workload A of
// benchmark-templates/guide.yaml, sized in its report as "X-70R-6kSys"),
// an inference-perf shared_prefix workload with num_groups 150,
// num_prompts_per_group 5, system_prompt_len 6000, question_len 1200,
// output_len 1000 (ignore_eos), enable_multi_turn_chat false, Poisson
// arrivals.
const (
	tenantGroups   = 150  // groups at FleetKVTokens zero
	tenantUsers    = 5    // users per group
	tenantContext  = 6000 // tokens of a group's shared context
	tenantQuestion = 1200 // tokens of a user's question
	tenantOutput   = 1000 // tokens generated per request
	tenantRate     = 15   // requests/s: the benchmark's warm-up stage
	tenantSets     = 3    // default length, in full sets of prompts
	// tenantFill is the fraction of the fleet's KV capacity the groups'
	// resident state fills: llm-d sized 150 groups to 73.2% of 8 replicas
	// × 307,328 tokens.
	tenantFill = 0.73
)

// tenantGroupsFor returns the number of groups whose resident state fills
// tenantFill of a fleet of kvTokens tokens of KV, or tenantGroups when
// kvTokens is zero.
//
// What a group keeps resident: its context, shared by its users, and one
// question per user, since a user sends the same prompt every time (the
// benchmark draws every request from one fixed set of groups × users
// prompts, so a question is "cached per user", in the report's words).
// That is tenantContext + users × tenantQuestion = 6,000 + 5 × 1,200 =
// 12,000 tokens, the report's "resident per group". Output tokens are not
// counted: no prompt repeats them, so they hold KV only while their request
// runs (and then churn the cache). So groups = round(tenantFill × kvTokens
// / (6,000 + users × 1,200)): llm-d's 150 × 12,000 = 1.8M tokens is 73.2%
// of its 2.46M (about six replicas' worth); 16 llama3-8b-h100 replicas
// (16 × 450,896 tokens) get 439 groups, 4 replicas 110.
func tenantGroupsFor(kvTokens, users int) int {
	if kvTokens <= 0 {
		return tenantGroups
	}
	per := tenantContext + users*tenantQuestion
	return max(1, int(math.Round(tenantFill*float64(kvTokens)/float64(per))))
}

// multiTenant: llm-d's prefix-cache-aware routing benchmark. Groups
// (tenantGroupsFor FleetKVTokens: 150 at zero) × PerGroup (5) users; each
// group has a 6,000-token context and each user a 1,200-token question, so
// a user's prompt is its group's context then its own question, the same
// every time; 1,000 output tokens. As inference-perf's shared_prefix
// generator does (inference_perf/datagen/shared_prefix_datagen.py), the
// Groups × PerGroup prompts are shuffled once and then sent in that order
// over and over, one full set every Groups × PerGroup requests. Requests
// defaults to 3 full sets: the first seats the residents (the benchmark's
// warm-up is one set), the next two reuse them; 3 × 3 × 73% = 6.6 times the
// fleet's KV in prompt tokens. Poisson arrivals at Rate (15/s). Session is
// the user, Tenant the group.
//
// The working set fits the fleet (llm-d calls the workload "no system cache
// pressure"): a pooled cache holds it all, and what a policy loses is its
// placement (a group on too many replicas overflows them) and the output
// tokens' churn of each replica's cache.
func multiTenant(opt GenOptions) []Request {
	g := newGen(opt.Seed, streamTenant)
	users := cmp.Or(opt.PerGroup, tenantUsers)
	groups := cmp.Or(opt.Groups, tenantGroupsFor(opt.FleetKVTokens, users))
	n, rate := cmp.Or(opt.Requests, tenantSets*groups*users), cmp.Or(opt.Rate, tenantRate)
	type user struct {
		name, group string
		segs        []Segment
	}
	all := make([]user, 0, groups*users)
	for grp := range groups {
		ctx := g.seg(tenantContext)
		for u := range users {
			all = append(all, user{fmt.Sprintf("%s-u%d", groupName(grp), u), groupName(grp),
				[]Segment{ctx, g.seg(tenantQuestion)}})
		}
	}
	order := g.rng.Perm(len(all))
	reqs := make([]Request, 0, n)
	for i := range n {
		u := &all[order[i%len(order)]]
		reqs = append(reqs, request(g.arrive(rate), u.name, u.group, u.segs, tenantOutput))
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
	n, rate := cmp.Or(opt.Requests, 4000), cmp.Or(opt.Rate, 2)
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
	n, rate, tenants := cmp.Or(opt.Requests, 3000), cmp.Or(opt.Rate, 4), cmp.Or(opt.Groups, 8)
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
	n, rate := cmp.Or(opt.Requests, 2000), cmp.Or(opt.Rate, 8)
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
	n, rate, groups := cmp.Or(opt.Requests, 2000), cmp.Or(opt.Rate, 20), cmp.Or(opt.Groups, 128)
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
