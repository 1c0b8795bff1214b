package trace

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// GenOptions parameterises Generate. The zero value gives each workload its
// documented defaults with seed 0.
type GenOptions struct {
	// Seed makes a generated workload reproducible: the same name, options
	// and seed give identical requests.
	Seed uint64
	// Requests is the approximate number of requests; zero means the
	// workload's default. For trace files it keeps the first Requests.
	Requests int
	// Rate is the mean arrival rate in requests/s; zero means the
	// workload's default. The simulator rescales arrivals to its --load
	// anyway (Scale).
	Rate float64
	// Groups is the number of prefix groups (shared-prefix,
	// multi-tenant-context, hot-prefix's cold prefixes), tenants
	// (agentic) or sessions (document-qa); zero means the workload's
	// default.
	Groups int
	// PerGroup is prompts per group (shared-prefix) or users per group
	// (multi-tenant-context); zero means the workload's default.
	PerGroup int
	// FleetKVTokens is the KV capacity of the whole fleet in tokens
	// (replicas × blocks × block size), which multi-tenant-context sizes
	// its groups to (tenantGroupsFor; zero means llm-d's benchmark's
	// fixed 150 groups) and document-qa its sessions (docSessionsFor).
	// Groups, when set, wins.
	FleetKVTokens int
	// Base is the workload the "failure" workload disturbs; empty means
	// "multi-turn-chat".
	Base string
	// TraceDir is the directory of the real traces; empty means DefaultDir().
	TraceDir string
}

// Names lists the workloads Generate knows, in the order
// docs/simulator.md lists them.
func Names() []string {
	return []string{
		"mooncake-conversation", "shared-prefix", "multi-tenant-context",
		"multi-turn-chat", "agentic", "unique", "hot-prefix", "document-qa", "interactive-batch", "failure",
		"azure-conv", "azure-code",
	}
}

// Generate returns the workload called name (see Names). Generated
// workloads are deterministic given opt; the trace workloads
// ("mooncake-conversation", "azure-conv", "azure-code") read their file from
// opt.TraceDir. Requests come sorted by arrival, the first at or near zero.
func Generate(name string, opt GenOptions) (*Workload, error) {
	var reqs []Request
	switch name {
	case "mooncake-conversation", "azure-conv", "azure-code":
		return readNamed(name, opt)
	case "shared-prefix":
		reqs = sharedPrefix(opt)
	case "multi-tenant-context":
		reqs = multiTenant(opt)
	case "multi-turn-chat":
		reqs = multiTurn(opt)
	case "agentic":
		reqs = agentic(opt)
	case "unique":
		reqs = unique(opt)
	case "hot-prefix":
		reqs = hotPrefix(opt)
	case "document-qa":
		reqs = documentQA(opt)
	case "interactive-batch":
		reqs = interactiveBatch(opt)
	case "failure":
		return failure(opt)
	default:
		return nil, fmt.Errorf("unknown workload %q (known: %v)", name, Names())
	}
	sortByArrival(reqs)
	for i := range reqs {
		reqs[i].ID = name + "-" + strconv.Itoa(i)
	}
	return &Workload{Name: name, Requests: reqs}, nil
}

// failure generates opt.Base (default multi-turn-chat) and kills replica 0
// a third of the way through it, then adds a fresh replica two thirds of
// the way through.
func failure(opt GenOptions) (*Workload, error) {
	base := opt.Base
	if base == "" {
		base = "multi-turn-chat"
	}
	if base == "failure" {
		return nil, fmt.Errorf("failure: base workload cannot be failure")
	}
	w, err := Generate(base, opt)
	if err != nil {
		return nil, fmt.Errorf("failure: %w", err)
	}
	var start, end time.Duration
	if n := len(w.Requests); n > 0 {
		start, end = w.Requests[0].At, w.Requests[n-1].At
	}
	span := end - start
	w.Name = "failure"
	w.Events = []FleetEvent{
		{At: start + span/3, Kind: Kill, Replica: 0},
		{At: start + 2*span/3, Kind: Add, Replica: -1},
		{At: start + 5*span/6, Kind: Remove, Replica: 1},
	}
	return w, nil
}

// traceFiles maps the trace workloads to their files under the trace
// directory.
func traceFile(name string) string {
	switch name {
	case "azure-conv":
		return filepath.Join("azure", "AzureLLMInferenceTrace_conv.csv")
	case "azure-code":
		return filepath.Join("azure", "AzureLLMInferenceTrace_code.csv")
	}
	return filepath.Join("mooncake", "conversation_trace.jsonl")
}

func readNamed(name string, opt GenOptions) (*Workload, error) {
	dir := opt.TraceDir
	if dir == "" {
		dir = DefaultDir()
	}
	w, err := ReadFile(filepath.Join(dir, traceFile(name)))
	if err != nil {
		return nil, err
	}
	w.Name = name
	if opt.Requests > 0 && opt.Requests < len(w.Requests) {
		w.Requests = w.Requests[:opt.Requests]
	}
	return w, nil
}

// DefaultDir returns where the real traces live: ../shared/traces beside the
// module root, found by walking up from the working directory to the
// nearest go.mod (so it works from a package directory in tests); if there
// is none, ../shared/traces from the working directory.
func DefaultDir() string {
	wd, err := os.Getwd()
	if err != nil {
		return filepath.Join("..", "shared", "traces")
	}
	for dir := wd; ; {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return filepath.Join(filepath.Dir(dir), "shared", "traces")
		}
		up := filepath.Dir(dir)
		if up == dir {
			return filepath.Join(wd, "..", "shared", "traces")
		}
		dir = up
	}
}

// gen holds a generator's random source and segment id counter.
type gen struct {
	rng *rand.Rand
	id  uint64
	t   time.Duration
}

func newGen(seed uint64, stream uint64) *gen {
	return &gen{rng: rand.New(rand.NewPCG(seed, stream))}
}

// seg returns a new segment of n tokens with a fresh id.
func (g *gen) seg(n int) Segment {
	g.id++
	return Segment{ID: g.id, Tokens: max(n, 1)}
}

// exp returns an exponentially distributed duration with the given mean.
func (g *gen) exp(mean time.Duration) time.Duration {
	return time.Duration(g.rng.ExpFloat64() * float64(mean))
}

// arrive advances the Poisson clock at rate requests/s and returns it.
func (g *gen) arrive(rate float64) time.Duration {
	g.t += g.exp(time.Duration(float64(time.Second) / rate))
	return g.t
}

// logNormal returns a log-normally distributed token count with the given
// median and sigma, clipped to [lo, hi].
func (g *gen) logNormal(median, sigma float64, lo, hi int) int {
	v := int(math.Round(median * math.Exp(sigma*g.rng.NormFloat64())))
	return min(max(v, lo), hi)
}

// request builds a request from segments (copied) and an output length.
func request(at time.Duration, session, tenant string, segs []Segment, output int) Request {
	s := make([]Segment, len(segs))
	copy(s, segs)
	return Request{At: at, Session: session, Tenant: tenant, Segments: s, Prompt: promptOf(s), Output: max(output, 1)}
}
