package sim

import (
	"errors"
	"fmt"
	"time"

	"kvrouter/engine"
	"kvrouter/fleet"
	"kvrouter/prefix"
	"kvrouter/report"
	"kvrouter/route"
	"kvrouter/scrape"
)

// replica is one simulated backend: its engine and what the router knows
// of it.
type replica struct {
	eng   *engine.Engine
	alive bool
	// wake is the pending wake-up time, or -1 when none is queued.
	wake time.Duration

	// The router's own counts (always fresh).
	inFlight, prefillTokens, decoding, decodeBlocks int
	recent                                          window

	// The engine's figures as of the last scrape tick.
	running, waiting int
	kvUsage          float64
	scraped          bool
	scrapedAt        time.Duration

	// base is the preset's rates; rates is base corrected by cal (Scale)
	// and churn (Horizon), as the live fleet does (package fleet).
	base, rates route.Rates
	cal         fleet.Calibrator
	churn       fleet.Churn
}

// epoch is virtual time zero on the wall clock, for the fleet package's
// scrape.Load timestamps (a zero time.Time means "no timestamp" there).
var epoch = time.Unix(1_000_000_000, 0)

// updateRates recomputes rates from base, as fleet does.
func (rp *replica) updateRates() {
	rp.rates = rp.cal.Apply(rp.base)
	if h := rp.churn.Horizon(); h > 0 {
		rp.rates.Horizon = h
	}
}

// flight is one request's state while it runs on a replica.
type flight struct {
	rep       int32
	routed    time.Duration // when it was sent to rep
	first     time.Duration // first token, -1 before
	predicted int           // cached tokens the policy predicted
	uncached  int           // prompt tokens counted in PrefillTokens
	blocks    int           // counted in DecodeBlocks
	// predTTFT is the policy's Wait+Prefill+Decode of the chosen replica,
	// unscaled (divided by the Rates.Scale it used); 0 if unknown.
	predTTFT time.Duration
	reason   string // the decision's reason
	retries  int
	active   bool
}

// runner simulates one policy over the jobs on a fresh fleet.
type runner struct {
	cfg    *Config
	jobs   []job
	name   string
	policy route.Policy
	needs  route.Needs
	// kind is the index the policy reads; k merges k engine blocks into
	// one index block (Needs.BlockTokens).
	kind route.IndexKind
	k    int

	q    queue
	now  time.Duration
	next int // next job to arrive
	reps []replica

	flights  []flight
	byID     map[string]int32
	sessions map[uint64]int32
	seq      uint64
	live     int // requests in flight anywhere

	idx   *index
	kvq   []kvEvent // delayed KV events, FIFO (due times are monotonic)
	kvq0  int
	fleet int // next fleet event

	// Reused buffers.
	snap    route.Snapshot
	req     route.Request
	ereq    []engine.Request
	idxHash []prefix.Hash
	costs   []route.Cost

	res result
	err error
}

// newRunner builds the fleet for one policy.
func newRunner(cfg *Config, jobs []job, name string) (*runner, error) {
	base, precise := name, false
	if len(name) > len(PreciseSuffix) && name[len(name)-len(PreciseSuffix):] == PreciseSuffix {
		base, precise = name[:len(name)-len(PreciseSuffix)], true
	}
	p, err := route.New(base)
	if err != nil {
		return nil, fmt.Errorf("policy %s: %w", name, err)
	}
	r := &runner{cfg: cfg, jobs: jobs, name: name, policy: p,
		byID: make(map[string]int32, len(jobs)), sessions: make(map[uint64]int32),
		flights: make([]flight, len(jobs)), ereq: make([]engine.Request, len(jobs))}
	if n, ok := p.(route.Needer); ok {
		r.needs = n.Needs()
	}
	r.kind = r.needs.Index
	if base == "kv-aware" && (precise || cfg.Mode == ModePrecise) {
		r.kind = route.Precise
	} else if precise {
		r.kind = route.Precise
	}
	bs := cfg.Preset.BlockSize
	r.k = 1
	if r.kind == route.Approximate && r.needs.BlockTokens > bs {
		r.k = r.needs.BlockTokens / bs
	}
	r.snap.BlockSize = bs * r.k
	if r.kind != route.NoIndex {
		r.idx = newIndex(r.kind, r.needs, cfg.Preset.NumBlocks/r.k)
	}
	for i := 0; i < cfg.Replicas; i++ {
		if err := r.addReplica(); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// addReplica starts a cold replica.
func (r *runner) addReplica() error {
	e, err := engine.New(r.cfg.Preset)
	if err != nil {
		return fmt.Errorf("engine: %w", err)
	}
	rates := r.cfg.Preset.Rates()
	r.reps = append(r.reps, replica{eng: e, alive: true, wake: -1, base: rates, rates: rates})
	id := fmt.Sprintf("r%d", len(r.reps)-1)
	r.snap.Replicas = append(r.snap.Replicas, route.Replica{ID: id})
	if r.idx != nil {
		r.idx.addReplica()
	}
	r.res.replicas = len(r.reps)
	return nil
}

// run is the event loop.
func (r *runner) run() {
	if len(r.jobs) > 0 {
		r.q.push(event{at: r.jobs[0].at, kind: evArrival, idx: 0})
	}
	if len(r.cfg.fleet) > 0 {
		r.q.push(event{at: r.cfg.fleet[0].at, kind: evFleet})
	}
	r.q.push(event{at: 0, kind: evScrape})
	for n := 0; r.q.len() > 0; n++ {
		if n&4095 == 0 && r.canceled() {
			r.err = errors.New("canceled")
			return
		}
		ev := r.q.pop()
		r.now = ev.at
		r.drainKV()
		switch ev.kind {
		case evWake:
			r.onWake(int(ev.rep))
		case evFleet:
			r.onFleet()
		case evScrape:
			r.onScrape()
		case evArrival:
			r.onArrival(int(ev.idx))
		}
	}
	r.res.end = r.now
}

// canceled reports whether Config.Cancel is closed.
func (r *runner) canceled() bool {
	select {
	case <-r.cfg.Cancel:
		return true
	default:
		return false
	}
}

// busy reports whether anything but ticks is still to happen.
func (r *runner) busy() bool {
	return r.next < len(r.jobs) || r.live > 0 || r.kvq0 < len(r.kvq) || r.fleet < len(r.cfg.fleet)
}

func (r *runner) onScrape() {
	for i := range r.reps {
		rp := &r.reps[i]
		if !rp.alive {
			continue
		}
		s := rp.eng.Stats()
		rp.running, rp.waiting = s.Running, s.Waiting
		rp.kvUsage = 0
		if s.TotalBlocks > 0 {
			rp.kvUsage = float64(s.UsedBlocks) / float64(s.TotalBlocks)
		}
		rp.scraped, rp.scrapedAt = true, r.now
		rp.churn.Observe(scrape.Load{Running: s.Running, Waiting: s.Waiting, KVUsage: rp.kvUsage,
			BlockSize: r.cfg.Preset.BlockSize, NumBlocks: s.TotalBlocks,
			PrefixQueries: float64(s.PrefixQueries), PrefixHits: float64(s.PrefixHits), At: epoch.Add(r.now)})
		rp.updateRates()
	}
	if r.busy() {
		iv := r.cfg.ScrapeInterval
		if r.needs.ScrapeInterval > 0 {
			iv = r.needs.ScrapeInterval
		}
		r.q.push(event{at: r.now + iv, kind: evScrape})
	}
}

// onWake steps replica i's engine.
func (r *runner) onWake(i int) {
	rp := &r.reps[i]
	if !rp.alive || rp.wake != r.now {
		return // a dead replica's or a superseded wake-up
	}
	rp.wake = -1
	r.step(i)
}

// step runs replica i's engine at now, handles its events and queues its
// next wake-up.
func (r *runner) step(i int) {
	rp := &r.reps[i]
	evs, next := rp.eng.Step(r.now)
	for k := range evs {
		r.onEngine(i, &evs[k])
	}
	if next == engine.Idle {
		return
	}
	if next <= r.now {
		next = r.now + 1
	}
	rp.wake = next
	r.q.push(event{at: next, kind: evWake, rep: int32(i)})
}

// onEngine handles one engine event of replica i.
func (r *runner) onEngine(i int, ev *engine.Event) {
	switch ev.Kind {
	case engine.FirstToken:
		r.onFirst(i, ev)
	case engine.Done:
		r.onDone(i, ev)
	case engine.BlockStored, engine.BlockRemoved, engine.AllCleared:
		if r.kind == route.Precise {
			r.queueKV(i, ev)
		}
	}
}

func (r *runner) onFirst(i int, ev *engine.Event) {
	j, ok := r.byID[ev.Req]
	if !ok {
		return
	}
	f := &r.flights[j]
	rp := &r.reps[i]
	f.first = ev.At
	rp.prefillTokens -= f.uncached
	f.uncached = 0
	rp.decoding++
	if f.predTTFT > 0 {
		rp.cal.Observe(f.predTTFT, ev.At-f.routed)
		rp.updateRates()
	}
}

func (r *runner) onDone(i int, ev *engine.Event) {
	j, ok := r.byID[ev.Req]
	if !ok {
		return
	}
	f := &r.flights[j]
	rp := &r.reps[i]
	if f.first < 0 { // done without a first token (canceled): release prefill
		rp.prefillTokens -= f.uncached
	} else {
		rp.decoding--
	}
	rp.inFlight--
	rp.decodeBlocks -= f.blocks
	f.active = false
	r.live--
	jb := &r.jobs[j]
	r.res.samples = append(r.res.samples, report.Sample{
		At: jb.at, TTFT: ev.First - jb.at, E2E: ev.At - jb.at, ITL: itl(ev),
		Prompt: ev.PromptTokens, Cached: ev.CachedTokens, PredictedCached: f.predicted, Output: ev.OutputTokens,
		Replica: i, OK: true, Reason: f.reason,
	})
	r.progress()
}

// itl is a request's mean inter-token latency: the time from its first
// token to its last over the gaps between them, (E2E − TTFT)/(Output − 1);
// zero for a single output token. The engine runs without per-token events
// (Config.NoTokenEvents), so per-token gaps are not seen; the mean is what
// the SLO checks.
func itl(ev *engine.Event) time.Duration {
	if ev.OutputTokens <= 1 {
		return 0
	}
	return (ev.At - ev.First) / time.Duration(ev.OutputTokens-1)
}

// progress reports a finished (or rejected) request.
func (r *runner) progress() {
	r.res.finished++
	if r.cfg.Progress != nil && (r.res.finished%256 == 0 || r.res.finished == len(r.jobs)) {
		r.cfg.Progress(r.name, r.res.finished, len(r.jobs))
	}
}
