package sim

import (
	"errors"
	"fmt"
	"time"

	"github.com/kvrouter/kvrouter/engine"
	"github.com/kvrouter/kvrouter/fleet"
	"github.com/kvrouter/kvrouter/report"
	"github.com/kvrouter/kvrouter/residency"
	"github.com/kvrouter/kvrouter/route"
	"github.com/kvrouter/kvrouter/scrape"
)

// replica is one simulated backend: its engine.
type replica struct {
	id    string
	model string // the model it serves
	eng   *engine.Engine
	alive bool
	// removed says the replica left the fleet (trace.Remove): its engine
	// runs until its requests in flight end, unscraped, its KV events
	// dropped.
	removed bool
	// wake is the pending wake-up time, or -1 when none is queued.
	wake time.Duration
	// role is its part in a disaggregated fleet (Config.PrefillReplicas).
	role route.Role
}

// epoch is virtual time zero on the wall clock: the fleet takes times as
// time.Time (and scrape.Load stamps), the simulator counts durations.
var epoch = time.Unix(1_000_000_000, 0)

// at is virtual time t on the fleet's clock.
func at(t time.Duration) time.Time { return epoch.Add(t) }

// flight is one request's state while it runs on a replica.
type flight struct {
	rep int32
	// leg is the replica computing the prompt before rep decodes it
	// (legs.go): a prefill worker or a holder of its prefix; −1 when none
	// is.
	leg int32
	// legTicket charges the leg to its source (fleet.LegClaim) while it
	// runs.
	legTicket *fleet.Ticket
	// legComputed and legPredicted are the prompt tokens its prefill leg
	// computed, and was predicted to, on the worker (legs.go).
	legComputed, legPredicted int
	ticket                    *fleet.Ticket
	predicted                 int    // cached tokens the policy predicted
	reason                    string // the decision's reason
	active                    bool
	// first is when the client saw the first token, once seen; sent
	// the tokens generated on replicas that died since, and retried and
	// continued how often it was resumed before and after its first
	// token (continue.go).
	first              time.Duration
	seen               bool
	sent               int
	retried, continued int
}

// runner simulates one policy over the jobs on a fresh fleet: the engines
// are the simulator's, the router's side is package fleet, the same code
// the live router runs.
type runner struct {
	cfg  *Config
	jobs []job
	name string
	fl   *fleet.Fleet

	q    queue
	now  time.Duration
	next int // next job to arrive
	reps []replica

	flights []flight
	byID    map[string]int32
	live    int // requests in flight anywhere

	// wait is admission control's queue of jobs no replica could take;
	// released says a ticket freed load since the queue was last tried.
	wait     *fleet.Queue[int32]
	released bool
	// sloQueued marks the jobs the fleet refused for their SLO and the
	// queue held (admit.go); nil until one is.
	sloQueued []bool

	kvq   []kvEvent // delayed KV events, FIFO (due times are monotonic)
	kvq0  int
	fleet int // next fleet event
	added int // replicas added in all, the first Config.Replicas included

	// Reused buffers.
	sc     fleet.Scratch
	freq   fleet.Request
	chains [1]residency.Chain
	ereq   []engine.Request

	rs routers // the routers beyond fl (Config.Routers > 1)
	// store says the policy's transfers read a pooled KV store rather
	// than run a leg on the holder (pooledStore).
	store bool

	res result
	err error
}

// newRunner builds the fleet for one policy.
func newRunner(cfg *Config, jobs []job, name string) (*runner, error) {
	p, precise, err := policyOf(name)
	if err != nil {
		return nil, err
	}
	needs := route.NeedsOf(p)
	fc := fleet.Config{
		MaxReplicas: cfg.Replicas + cfg.adds,
		Policy:      p,
		// The engines always publish their events. A policy that asks for
		// them gets them; one that reads a generic index (kv-aware, Preble)
		// gets them in precise mode only, so that both modes compare.
		Events:      precise || cfg.Mode == ModePrecise || needs.Index == route.Precise,
		Engine:      true,
		Rates:       rates(cfg),
		BlockSize:   cfg.Preset.BlockSize,
		CacheBlocks: cfg.Preset.NumBlocks,
		Start:       epoch,
		Admission:   cfg.Admission,
	}
	r := &runner{cfg: cfg, jobs: jobs, name: name, wait: fleet.NewQueue[int32](cfg.Admission.Capacity()),
		byID: make(map[string]int32, len(jobs)), flights: make([]flight, len(jobs)), ereq: make([]engine.Request, len(jobs))}
	fc.OnRelease = func() { r.released = true }
	fl, err := fleet.New(fc)
	if err != nil {
		return nil, fmt.Errorf("policy %s: %w", name, err)
	}
	r.fl = fl
	r.res.noIndex = fl.Index() == route.NoIndex
	r.store = pooledStore(p)
	if err := r.addRouters(fc); err != nil {
		return nil, fmt.Errorf("policy %s: %w", name, err)
	}
	for range cfg.Replicas {
		if err := r.addReplica(); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// rates is the cost model's start, as the live router's (proxy's
// presetRates): the preset's, PCIe for the CPU tier blocks its engines may
// report, and the interconnect when replicas may transfer.
func rates(cfg *Config) route.Rates {
	rt := cfg.Preset.Rates()
	rt.LoadPerMTokens = cfg.Preset.LoadPerMTokens()
	if cfg.InterconnectGBps > 0 || cfg.PrefillReplicas > 0 {
		rt.TransferPerMTokens = cfg.Preset.TransferPerMTokens()
	}
	return rt
}

// policyOf returns the policy a run name names, and whether the name asks
// for the precise index (PreciseSuffix).
func policyOf(name string) (route.Policy, bool, error) {
	base, precise := name, false
	if len(name) > len(PreciseSuffix) && name[len(name)-len(PreciseSuffix):] == PreciseSuffix {
		base, precise = name[:len(name)-len(PreciseSuffix)], true
	}
	p, err := route.New(base)
	if err != nil {
		return nil, false, fmt.Errorf("policy %s: %w", name, err)
	}
	if n := route.NeedsOf(p); precise && (n.Index == route.NoIndex || n.IndexBlocks > 0 || n.IndexTTL > 0) {
		// It would run on the index it has anyway (fleet.IndexKind).
		what := "reads no residency index"
		if n.Index != route.NoIndex {
			what = "models its router's own approximate index (its size or expiry)"
		}
		return nil, false, fmt.Errorf("policy %s: %s %s, so %s would not change it; %s applies to policies that read a generic index (kv-aware, preble-e2) or the engines' events",
			name, base, what, PreciseSuffix, PreciseSuffix)
	}
	return p, precise, nil
}

// addReplica starts a cold replica serving its share of the models.
func (r *runner) addReplica() error {
	e, err := engine.New(r.cfg.Preset)
	if err != nil {
		return fmt.Errorf("engine: %w", err)
	}
	n := r.added
	r.added++
	// Replicas are named as the live router names them, by base URL (the
	// consistent-hashing peers hash the names).
	id, model := fmt.Sprintf("http://r%d:8000", n), modelName(n%r.cfg.Models)
	role := route.RoleBoth
	switch {
	case n < r.cfg.PrefillReplicas:
		role = route.RolePrefill
	case r.cfg.PrefillReplicas > 0:
		role = route.RoleDecode
	}
	r.each(func(f *fleet.Fleet) {
		if err == nil {
			err = f.AddReplica(fleet.Replica{ID: id, Models: []string{model}, Role: role})
		}
	})
	if err != nil {
		return err
	}
	rp := replica{id: id, model: model, eng: e, alive: true, wake: -1, role: role}
	// The fleet gives it the next slot, or that of a removed replica
	// whose requests have all finished (its engine is idle).
	i := r.fl.At(id)
	if i == len(r.reps) {
		r.reps = append(r.reps, rp)
	} else {
		r.reps[i] = rp
	}
	r.res.replicas = max(r.res.replicas, len(r.reps))
	if r.added > r.cfg.Replicas {
		r.trace(Step{Kind: StepAdd, Replica: i, Backend: id, Model: model})
	}
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
	if len(r.rs.more) > 0 && r.cfg.SyncInterval > 0 {
		r.q.push(event{at: r.cfg.SyncInterval, kind: evSync})
	}
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
		case evSync:
			r.onSync()
		case evArrival:
			r.onArrival(int(ev.idx))
		}
		if r.released {
			r.admitQueued()
		}
	}
	r.rejectQueued()
	r.res.end = r.now
	r.res.learned = r.learned()
}

// learned is what the first router learned of each replica by now.
func (r *runner) learned() []report.Learned {
	var s route.Snapshot
	r.fl.Snapshot(&s, at(r.now), r.cfg.Preset.BlockSize)
	out := make([]report.Learned, len(s.Replicas))
	for i := range s.Replicas {
		rt := &s.Replicas[i].Rates
		out[i] = report.Learned{Scale: rt.Scale, DecodeScale: rt.DecodeScale, HorizonMS: float64(rt.Horizon) / float64(time.Millisecond),
			TierHorizonMS: float64(rt.TierHorizon) / float64(time.Millisecond),
			Displaced:     rt.Displaced, HitScale: rt.HitScale}
	}
	return out
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
	return r.next < len(r.jobs) || r.live > 0 || r.kvq0 < len(r.kvq) || r.fleet < len(r.cfg.fleet) || r.wait.Len() > 0
}

// onScrape gives the fleet every live engine's metrics, as the live
// router's scrape of /metrics does, and queues the next tick at the
// interval the policy's source scrapes at.
func (r *runner) onScrape() {
	for i := range r.reps {
		rp := &r.reps[i]
		if rp.alive && !rp.removed {
			l := loadOf(rp.eng.Stats(), r.cfg.Preset.BlockSize, at(r.now))
			r.each(func(f *fleet.Fleet) { f.SetLoad(rp.id, l) })
			r.trace(Step{Kind: StepScrape, Replica: i, Load: l})
		}
	}
	// The engines' queues the scrape shows may have shrunk: the queued
	// jobs try again, as the live router's queue does on its tick.
	r.released = r.released || r.wait.Len() > 0
	if r.busy() {
		r.q.push(event{at: r.now + r.fl.ScrapeInterval(r.cfg.ScrapeInterval), kind: evScrape})
	}
}

// loadOf is what a scrape of an engine with stats s reads (the figures
// emulator/metrics.go exports), taken at t.
func loadOf(s engine.Stats, blockSize int, t time.Time) scrape.Load {
	l := scrape.Load{Running: s.Running, Waiting: s.Waiting, BlockSize: blockSize, NumBlocks: s.TotalBlocks, CPUBlocks: s.CPUBlocks,
		PrefixQueries: float64(s.PrefixQueries), PrefixHits: float64(s.PrefixHits), ExternalHits: float64(s.CPUHits + s.RemoteHits),
		GenerationTokens: float64(s.OutputTokens), At: t}
	if s.TotalBlocks > 0 {
		l.KVUsage = float64(s.UsedBlocks) / float64(s.TotalBlocks)
	}
	return l
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
		if j, ok := r.byID[ev.Req]; ok && r.jobs[j].id == ev.Req { // a leg's is not the request's
			f := &r.flights[j]
			f.ticket.FirstToken(at(ev.At))
			if !f.seen {
				f.first, f.seen = ev.At, true
			}
			r.trace(Step{Kind: StepFirstToken, Replica: i, ReqID: ev.Req})
		}
	case engine.Token:
		if j, ok := r.byID[ev.Req]; ok && r.jobs[j].id == ev.Req {
			r.flights[j].ticket.Token(at(ev.At)) // the stream's progress, as the live router sees it
			r.trace(Step{Kind: StepToken, Replica: i, ReqID: ev.Req})
		}
	case engine.Done:
		r.onDone(i, ev)
	case engine.BlockStored, engine.BlockRemoved, engine.AllCleared:
		if r.fl.Tracker().Precise() != nil {
			r.queueKV(i, ev)
		}
	}
}

func (r *runner) onDone(i int, ev *engine.Event) {
	if ev.RemoteCachedTokens > 0 {
		r.res.transfers++
		r.res.transferBytes += int64(ev.RemoteCachedTokens) * int64(r.cfg.Preset.KVBytesPerToken)
	}
	j, ok := r.byID[ev.Req]
	if !ok {
		return
	}
	if r.jobs[j].id != ev.Req {
		r.onLegDone(int(j), ev)
		return
	}
	f := &r.flights[j]
	u := fleet.Usage{PromptTokens: ev.PromptTokens, CachedTokens: ev.CachedTokens, CompletionTokens: ev.OutputTokens}
	f.ticket.Done(at(ev.At), u, nil)
	r.trace(Step{Kind: StepDone, Replica: i, ReqID: ev.Req, Usage: u})
	f.active = false
	delete(r.byID, ev.Req)
	r.live--
	jb := &r.jobs[j]
	// A prompt prefilled on a worker is not cached where the decode
	// replica reports it so: what the worker computed is deducted
	// (legs.go), and the prediction likewise.
	// A resumed request (continue.go) reached the client as one stream:
	// its first token the first replica's, its output both's.
	first, out := ev.First, f.sent+ev.OutputTokens
	if f.seen {
		first = f.first
	}
	r.res.samples = append(r.res.samples, report.Sample{
		At: jb.at, TTFT: first - jb.at, E2E: ev.At - jb.at, ITL: itl(first, ev.At, out),
		Prompt: jb.prompt, Cached: min(max(ev.CachedTokens-f.legComputed, 0), jb.prompt), PredictedCached: max(f.predicted-f.legPredicted, 0),
		Output: out, Replica: i, OK: true, Reason: f.reason,
	})
	s := &r.res.samples[len(r.res.samples)-1]
	s.Class, s.SLO = classOf(jb)
	s.SLOQueued = r.queuedForSLO(int(j))
	r.progress()
}

// itl is a request's mean inter-token latency: the time from its first
// token to its last over the gaps between its output tokens, (E2E −
// TTFT)/(Output − 1); zero for a single output token. Per-token gaps are
// not kept (the Token events only tell the tickets of the stream's
// progress); the mean is what the SLO checks.
func itl(first, last time.Duration, output int) time.Duration {
	if output <= 1 {
		return 0
	}
	return (last - first) / time.Duration(output-1)
}

// progress reports a finished (or rejected) request.
func (r *runner) progress() {
	r.res.finished++
	if r.cfg.Progress != nil && (r.res.finished%256 == 0 || r.res.finished == len(r.jobs)) {
		r.cfg.Progress(r.name, r.res.finished, len(r.jobs))
	}
}
