package sim

import (
	"strconv"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/kvrouter/kvrouter/engine"
	"github.com/kvrouter/kvrouter/prefix"
	"github.com/kvrouter/kvrouter/route"
	"github.com/kvrouter/kvrouter/trace"
)

// prefixKeyTokens is how much of the prompt keys consistent-hashing
// policies: KubeAI hashes the first 100 characters, about 25 tokens.
const prefixKeyTokens = 25

// job is one request as every policy run sees it: derived once from the
// workload and shared (read-only) by the runs.
type job struct {
	id     string
	at     time.Duration // arrival, after load scaling
	prompt int
	// output is the tokens to generate, at least 1 (a trace's zero output
	// length becomes 1: the engine rejects MaxTokens < 1).
	output int
	hashes []prefix.Hash // engine block hashes
	// hash seeds tie-breaks (route.Request.Hash): xxhash of the id, mixed
	// with the seed.
	hash      uint64
	session   string // the session id, empty for none
	model     string // the model requested (modelName)
	prefixKey uint64
	// slo is the request's own SLO class (trace.Request.SLO), its zero
	// bounds derived for the class (classSLOs); no Class: the run's SLO.
	slo route.SLO
}

// modelName names the i-th model of a fleet of several (Config.Models).
func modelName(i int) string { return "m" + strconv.Itoa(i) }

// modelOf assigns request r one of n models: by its session, else its
// tenant, else its id, hashed, so that a conversation or a tenant stays
// with one model.
func modelOf(r *trace.Request, n int) int {
	if n <= 1 {
		return 0
	}
	key := r.Session
	if key == "" {
		key = r.Tenant
	}
	if key == "" {
		key = r.ID
	}
	return int(route.Mix64(xxhash.Sum64String(key)) % uint64(n))
}

// fleetEvent is a trace.FleetEvent on the scaled clock.
type fleetEvent struct {
	at      time.Duration
	kind    trace.FleetEventKind
	replica int
}

// makeJobs derives the jobs from reqs, for a fleet of models models.
// Arrival times are relative to the first request. A request's block
// hashes chain from its model's root, so that two models never share a
// block, as in the router (prefix.Root).
func makeJobs(reqs []trace.Request, blockSize int, seed uint64, models int) []job {
	jobs := make([]job, len(reqs))
	total := 0
	for i := range reqs {
		total += reqs[i].Prompt / blockSize
	}
	// One backing array for every job's hashes: fewer, larger allocations.
	buf := make([]prefix.Hash, 0, total)
	var t0 time.Duration
	if len(reqs) > 0 {
		t0 = reqs[0].At
	}
	for i := range reqs {
		r := &reqs[i]
		start := len(buf)
		m := modelOf(r, models)
		root := trace.Root()
		if models > 1 {
			root = prefix.Root(modelName(m), "")
		}
		buf = r.Hashes(root, blockSize, buf)
		j := &jobs[i]
		j.model = modelName(m)
		j.id = r.ID
		j.at = r.At - t0
		j.prompt = r.Prompt
		j.output = max(r.Output, 1)
		j.hashes = buf[start:len(buf):len(buf)]
		j.hash = route.Mix64(xxhash.Sum64String(r.ID) ^ seed*0x9e3779b97f4a7c15)
		j.session = r.Session
		j.prefixKey = r.PrefixKey(prefixKeyTokens)
		j.slo = r.SLO
	}
	return jobs
}

// FleetKVTokens returns the KV capacity, in tokens, of a fleet of replicas
// engines configured as preset (zero fields as the engine fills them), or
// zero if preset is invalid: what trace.GenOptions.FleetKVTokens asks for,
// so that a workload sized to the fleet (multi-tenant-context) fits this
// one.
func FleetKVTokens(preset engine.Config, replicas int) int {
	e, err := engine.New(preset)
	if err != nil {
		return 0
	}
	c := e.Config()
	return replicas * c.NumBlocks * c.BlockSize
}
