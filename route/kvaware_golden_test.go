package route

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/internal/sweep"
)

// updateGolden rewrites testdata/kvaware_decisions.txt from the full pricing.
var updateGolden = flag.Bool("update-kvaware-digest", false, "rewrite testdata/kvaware_decisions.txt")

// goldenCases is how many generated decisions the golden covers.
const goldenCases = 2000

// TestKVAwareGoldenDigest pins the kv-aware cost model bit for bit: it runs
// the full pricing (every candidate priced by price) over goldenCases seeded snapshots
// and requests (1..1,000 replicas, varied Match, Age, Rates, health,
// staleness, Scale, Pinned and policy settings) and compares,
// case by case, the decision and a SHA-256 of every Decision field and
// every Cost field with testdata; a failure names the first case that
// differs and how. TestKVAwarePruningMatchesFullPricing holds the pruned
// scan to the full pricing, so speed changes to pruning never touch the
// golden; regenerate it (-update-kvaware-digest) only for a deliberate
// change of the model. Some Rates have a Scale near 1e9, so that terms
// exceed 2^53 ns and the recorded Durations show every last-bit
// difference of the float arithmetic (a reordered sum, say).
//
// The golden is amd64's: other architectures may fuse x*y+z into one
// rounding, and out-of-range float-to-int conversions are
// implementation-defined.
func TestKVAwareGoldenDigest(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skipf("golden recorded on amd64; GOARCH=%s rounds differently", runtime.GOARCH)
	}
	got := kvAwareDecisions()
	path := filepath.Join("testdata", "kvaware_decisions.txt")
	if *updateGolden {
		if err := os.WriteFile(path, []byte(strings.Join(got, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read golden decisions (run with -update-kvaware-digest to create): %v", err)
	}
	want := strings.Split(strings.TrimSpace(string(b)), "\n")
	for c := range max(len(got), len(want)) {
		g, w := "(none)", "(none)"
		if c < len(got) {
			g = got[c]
		}
		if c < len(want) {
			w = want[c]
		}
		if g != w {
			t.Fatalf("the first decision that differs, as case replica reason matched total digest:\n got %s\nwant %s\n(the digest covers every Cost term: equal decisions with another digest are other terms)", g, w)
		}
	}
}

// kvAwareDecisions describes the decisions of the full pricing on
// goldenCases generated cases, a line each: the case, the replica, the
// reason, the matched tokens, the chosen candidate's Total in ns, and the
// first 12 hex digits of a SHA-256 of every Decision and Cost field.
func kvAwareDecisions() []string {
	rng := rand.New(rand.NewPCG(20240611, 3))
	var buf []byte
	put := func(v int64) { buf = binary.LittleEndian.AppendUint64(buf, uint64(v)) }
	out := make([]string, 0, goldenCases)
	for c := range goldenCases {
		p, r, s := goldenCase(rng, c)
		d := p.pick(r, s, false)
		buf = buf[:0]
		put(int64(c))
		put(int64(d.Replica))
		buf = append(buf, d.Reason...)
		put(int64(d.Matched))
		put(int64(len(d.Costs)))
		if d.Costs == nil {
			put(-1)
		}
		var total time.Duration
		for _, k := range d.Costs {
			put(int64(k.Replica))
			put(int64(k.Matched))
			put(int64(k.Wait))
			put(int64(k.Prefill))
			put(int64(k.Decode))
			put(int64(k.Others))
			put(int64(k.Memory))
			put(int64(k.Total))
			if k.Replica == d.Replica {
				total = k.Total
			}
		}
		sum := sha256.Sum256(buf)
		out = append(out, fmt.Sprintf("%d %d %s %d %d %s", c, d.Replica, d.Reason, d.Matched, total, hex.EncodeToString(sum[:6])))
	}
	return out
}

// goldenCase generates case c: a policy, a request and a snapshot.
func goldenCase(rng *rand.Rand, c int) (KVAware, *Request, *Snapshot) {
	var n int
	switch rng.IntN(6) {
	case 0:
		n = 1 + rng.IntN(3)
	case 1, 2:
		n = 1 + rng.IntN(64)
	case 3, 4:
		n = 1 + rng.IntN(1000)
	default:
		n = 1000
	}
	pick := func(vals ...int) int { return vals[rng.IntN(len(vals))] }
	dur := func(max time.Duration) time.Duration { return time.Duration(rng.Int64N(int64(max))) }

	p := KVAware{}
	if rng.IntN(3) == 0 {
		// KVAware.StaleAfter, HighWater and MeanOutput, which only tests
		// set, are gone; the draws stay, so that every case is generated
		// as before.
		_, _, _ = pick(-1, 0, 100, 500, 2000), rng.IntN(7), pick(-3, 0, 1, 64, 1000)
	}
	if rng.IntN(3) == 0 {
		// KVAware.PinBonus, which only tests set, is gone; the draw stays,
		// so that every case is generated as before.
		_ = pick(-5, 1, 10, 100, 1000)
	}

	bsz := pick(0, 0, 16, 32, 1)
	bs := bsz
	if bs == 0 {
		bs = DefaultBlockSize
	}
	r := &Request{ID: "g", Hash: rng.Uint64(), Tokens: pick(0, 1, 15, 100, 1030, 4096, 32000, rng.IntN(20000)),
		MaxTokens: pick(0, 0, -1, 1, 128, 2048), Pinned: pick(-1, -1, 0, n-1, rng.IntN(n), n, n+5), Session: rng.Uint64()}
	r.Blocks = r.Tokens / bs
	if rng.IntN(10) == 0 {
		r.Tokens = rng.IntN(500) // blocks inconsistent with tokens
	}
	switch rng.IntN(8) {
	case 0: // nil Costs: none recorded
	case 1:
		r.Costs = make([]Cost, 0, max(n-1, 0)) // too small: none recorded
	default:
		r.Costs = make([]Cost, min(3, n), n+rng.IntN(3)) // stale contents are overwritten
	}
	matchEvery := pick(1, 2, 8, 50, 0)
	if matchEvery > 0 {
		mlen := n
		if rng.IntN(6) == 0 {
			mlen = rng.IntN(n + 1) // shorter than the fleet
		}
		r.Match = make([]int, mlen)
		for i := range r.Match {
			if rng.IntN(matchEvery) == 0 {
				r.Match[i] = pick(-1, 0, 1, 2, r.Blocks/2, r.Blocks, r.Blocks+3, rng.IntN(r.Blocks+2))
			}
		}
		if rng.IntN(3) != 0 {
			alen := len(r.Match)
			if rng.IntN(5) == 0 {
				alen = rng.IntN(n + 1)
			}
			r.Age = make([]time.Duration, alen)
			for i := range r.Age {
				r.Age[i] = time.Duration(pick(-1, 0, 1, 1000, int(dur(20*time.Minute))))
			}
		}
	}

	base := Rates{}
	switch rng.IntN(4) {
	case 1:
		base = Rates{Horizon: 10 * time.Minute}
	case 2:
		base = Rates{PrefillPerToken: 25 * time.Microsecond, AttnPerMPairs: 900 * time.Microsecond,
			DecodeStep: 12 * time.Millisecond, DecodePerSeq: 80 * time.Microsecond, MaxSeqs: 128, Horizon: 5 * time.Minute, Scale: 1.1}
	case 3:
		base = Rates{MaxSeqs: DefaultMaxSeqs, Scale: 1, PrefillPerToken: -1, DecodeStep: -2}
	}
	rateMode := rng.IntN(5) // 0,1: shared; 2: per-replica calibration; 3: runs; 4: anything
	s := &Snapshot{BlockSize: bsz, Replicas: make([]Replica, n)}
	cur := base
	identical := rng.IntN(8) == 0 // many exact ties
	for i := range s.Replicas {
		rp := &s.Replicas[i]
		if identical {
			*rp = Replica{Healthy: rng.IntN(10) != 0, Scraped: true, Running: 3, InFlight: 2, PrefillTokens: 100, CacheBlocks: 1000, Rates: base}
			continue
		}
		rp.Healthy = rng.IntN(pick(2, 10, 100, 1000)) != 0
		rp.Scraped = rng.IntN(5) != 0
		rp.LoadAge = time.Duration(pick(0, 50, 100, 500, 999, 1000, 1001, 5000)) * time.Millisecond
		rp.Running = pick(0, 1, 20, 255, 300, rng.IntN(400))
		rp.Waiting = pick(0, 0, 1, 5, rng.IntN(100))
		rp.KVUsage = []float64{0, 0.1, 0.5, 0.89, 0.9, 0.95, 0.999, 1, 1.2, rng.Float64()}[rng.IntN(10)]
		rp.InFlight = pick(0, 1, 3, 40, 256, 300, rng.IntN(400))
		rp.Decoding = pick(0, 1, rp.InFlight, rp.InFlight+2, rng.IntN(rp.InFlight+1))
		rp.PrefillTokens = pick(0, 100, 1000, 50000, rng.IntN(100000))
		rp.CacheBlocks = pick(0, 0, 1000, 28000, 100)
		rp.DecodeBlocks = pick(0, rp.CacheBlocks/2, rp.CacheBlocks*9/10, rp.CacheBlocks, rp.CacheBlocks+50, rng.IntN(rp.CacheBlocks+1))
		rp.IndexBlocks = rng.IntN(1000)
		switch rateMode {
		case 0, 1:
			rp.Rates = base
		case 2:
			rp.Rates = base
			rp.Rates.Scale = 0.5 + rng.Float64()
			rp.Rates.Horizon = dur(30 * time.Minute)
		case 3:
			if rng.IntN(20) == 0 {
				cur = base
				cur.Scale = []float64{0, 1, 0.9, 1.37, -1, 3.7e8}[rng.IntN(6)]
				cur.PrefillPerToken = time.Duration(pick(0, 30000, 40000, 55000))
				cur.Horizon = time.Duration(pick(0, 60, 600)) * time.Second
			}
			rp.Rates = cur
		default:
			rp.Rates = Rates{
				PrefillPerToken: time.Duration(pick(0, -1, 10000, 40000, 1+rng.IntN(100000))),
				AttnPerMPairs:   time.Duration(pick(0, -1, 1300000, rng.IntN(5000000))),
				DecodeStep:      time.Duration(pick(0, -1, int(15*time.Millisecond), rng.IntN(int(50*time.Millisecond)))),
				DecodePerSeq:    time.Duration(pick(0, -1, int(100*time.Microsecond), rng.IntN(int(time.Millisecond)))),
				MaxSeqs:         pick(0, -1, 1, 64, DefaultMaxSeqs, 512),
				Horizon:         time.Duration(pick(0, -1, int(time.Minute), rng.IntN(int(time.Hour)))),
				Scale:           []float64{0, -1, 1, 0.25, 3, rng.Float64() * 2, math.SmallestNonzeroFloat64, 1e9 + rng.Float64()}[rng.IntN(8)],
			}
		}
	}
	_ = c
	return p, r, s
}

// TestKVAwarePruningMatchesFullPricing checks the pruned scan against the
// full pricing on the digest's cases, as many more, as many again with
// links, CPU tiers and Displaced, with sessions, and with SLOs: the same decision and reason, the same
// terms for every candidate priced in full, the others counted as pruned;
// and for every candidate, bound at most its full Total and quick at most
// bound.
func TestKVAwarePruningMatchesFullPricing(t *testing.T) {
	rng := rand.New(rand.NewPCG(20240611, 3))
	pruned := 0
	// The bounds sum their terms in another order, so they may exceed
	// the full Total by a rounding.
	le := func(a, b float64) bool { return a <= b*(1+1e-12) }
	// Each of the five groups (the digest's cases, as many more, with
	// links, with sessions, with SLOs) runs its first n cases; the full
	// sweep, KVROUTER_FULL_SWEEP=1, all goldenCases of each.
	n := sweep.N(t, goldenCases/8, goldenCases)
	for k := range 5 * n {
		group, c := k/n, k/n*goldenCases+k%n
		if k == n {
			rng = rand.New(rand.NewPCG(7, uint64(goldenCases)))
		}
		p, r, s := goldenCase(rng, c)
		if group >= 2 {
			withPaths(rng, r, s)
		}
		if group == 3 {
			withSession(rng, r, s)
		}
		if group == 4 {
			withSLO(rng, r, s)
		}
		rr := *r
		if r.Costs != nil {
			rr.Costs = make([]Cost, 0, cap(r.Costs))
		}
		want := p.pick(&rr, s, false)
		got := p.pick(r, s, true)
		if got.Replica != want.Replica || got.Reason != want.Reason || got.Matched != want.Matched || got.Transfer != want.Transfer ||
			(got.Costs == nil) != (want.Costs == nil) || got.Costs != nil && len(got.Costs)+got.Pruned != len(want.Costs) {
			t.Fatalf("case %d: got %d %s matched %d with %d costs and %d pruned, want %d %s matched %d with %d costs",
				c, got.Replica, got.Reason, got.Matched, len(got.Costs), got.Pruned, want.Replica, want.Reason, want.Matched, len(want.Costs))
		}
		pruned += got.Pruned
		j := 0
		for _, k := range got.Costs {
			for j < len(want.Costs) && want.Costs[j].Replica != k.Replica {
				j++
			}
			if j == len(want.Costs) || k != want.Costs[j] {
				t.Fatalf("case %d: candidate %d priced %+v, not as in full pricing", c, k.Replica, k)
			}
		}
		sc := new(screen)
		sc.size(len(s.Replicas))
		q := newKVRequest(p, r, s, sc.summary(p, s), make([]int, 0, len(s.Replicas)))
		if q.first >= 0 {
			q.screen(sc)
		}
		for i := range s.Replicas {
			if !s.Replicas[i].Healthy || i == r.Pinned {
				continue
			}
			_, total := q.price(&s.Replicas[i], i)
			lb := q.bound(&s.Replicas[i], i, math.Inf(1))
			if !le(lb, total) {
				t.Fatalf("case %d: candidate %d bound %g above its total %g", c, i, lb, total)
			}
			if ql := q.quick(i); !q.mixed && !le(ql, lb) {
				t.Fatalf("case %d: candidate %d quick bound %g above its bound %g", c, i, ql, lb)
			}
			if ql := q.quick(i); !q.mixed && sc.quick[i] != ql {
				t.Fatalf("case %d: candidate %d screened at %g, quick bound %g", c, i, sc.quick[i], ql)
			}
			if qm := q.quickMisses(i, sc.quick[i], math.Inf(1)); q.slo.on() && !q.mixed && !le(qm, lb) {
				t.Fatalf("case %d: candidate %d quick bound with misses %g above its bound %g", c, i, qm, lb)
			} else if f := q.missFloor(sc.quick, sc.quick[i]); q.slo.on() && !q.mixed && !le(sc.quick[i]+f, qm) {
				t.Fatalf("case %d: candidate %d quick bound with the misses' floor %g above it with its own misses %g", c, i, sc.quick[i]+f, qm)
			}
		}
	}
	if pruned == 0 {
		t.Error("no candidate pruned: the cases do not exercise the bound")
	}
	t.Logf("%d candidates pruned", pruned)
}

// withSLO gives the request of a golden case an SLO, and its replicas
// learned spreads, so that the pruned scan is checked with the miss term.
func withSLO(rng *rand.Rand, r *Request, s *Snapshot) {
	ms := func(vals ...int) time.Duration { return time.Duration(vals[rng.IntN(len(vals))]) * time.Millisecond }
	r.SLO = SLO{TTFT: ms(0, 1, 50, 500, 5000), ITL: ms(0, 1, 10, 40, 200)}
	for i := range s.Replicas {
		rt := &s.Replicas[i].Rates
		rt.Spread = []float64{0, 0.01, 0.3, 2}[rng.IntN(4)]
		rt.DecodeSpread = []float64{0, 0.01, 0.3, 2}[rng.IntN(4)]
		s.Replicas[i].PrefillWork = time.Duration(rng.IntN(3)) * time.Duration(rng.IntN(2000)) * time.Millisecond
	}
}

// withPaths gives the replicas of a golden case the other ways to a
// prefix (links to import it over, CPU tiers to load it from) and a
// measured Displaced, so that the pruned scan is checked on them too.
func withPaths(rng *rand.Rand, r *Request, s *Snapshot) {
	r.Offloaded = make([]int, len(s.Replicas))
	for i := range s.Replicas {
		rt := &s.Replicas[i].Rates
		if rng.IntN(3) != 0 {
			rt.TransferPerMTokens = time.Duration(1+rng.IntN(20)) * time.Millisecond
			s.Replicas[i].LinkWait = time.Duration(rng.IntN(3)) * time.Duration(rng.IntN(int(time.Second)))
		}
		if rng.IntN(4) == 0 {
			rt.LoadPerMTokens = time.Duration(1+rng.IntN(50)) * time.Millisecond
			r.Offloaded[i] = rng.IntN(r.Blocks + 8)
		}
		if rp := &s.Replicas[i]; rng.IntN(2) == 0 && rp.InFlight > 0 {
			// Some of its requests said their output length.
			rp.Outputs = 1 + rng.IntN(rp.InFlight)
			for range rp.Outputs {
				rp.InvOutput += 1 / float64(1+rng.IntN(2000))
			}
		}
		if rng.IntN(8) == 0 && rt.TransferPerMTokens > 0 && s.Replicas[i].Healthy {
			// A prefill worker.
			s.Replicas[i].Healthy, s.Replicas[i].Prefills, s.Replicas[i].Role = false, true, RolePrefill
		}
		rt.Displaced = []float64{0, 0, 0.3, 1}[rng.IntN(4)]
	}
}

// withSession makes r the first request of a session expected to bring
// more, on a fleet whose replicas had random shares of the requests and
// keep what they cache for random horizons: the terms of Future, which
// the bounds leave out but for its copy's share.
func withSession(rng *rand.Rand, r *Request, s *Snapshot) {
	r.Session, r.Pinned, r.Seq = 1+rng.Uint64(), -1, uint64(rng.IntN(1000))
	r.FutureTurns = []float64{0.5, 3, 20}[rng.IntN(3)]
	s.Seqs = rng.Float64() * float64(len(s.Replicas)) * 8
	for i := range s.Replicas {
		rp := &s.Replicas[i]
		rp.Share, rp.ShareSeq = rng.Float64()*2/float64(len(s.Replicas)), uint64(rng.IntN(1000))
		rp.Rates.Horizon = time.Duration(rng.IntN(3)) * time.Duration(rng.IntN(int(time.Hour)))
	}
	if r.Age == nil {
		r.Age = make([]time.Duration, len(s.Replicas))
	}
	for i := range r.Age {
		r.Age[i] = time.Duration(rng.IntN(int(time.Minute)))
	}
}

// TestKVAwarePrunesLargeFleets shows what pruning does on the benchmark's
// fleets: at 1,000 replicas nearly every candidate is pruned, the winner
// is not, and the decision is the reference's; up
// to kvPruneAbove replicas every candidate is priced in full.
func TestKVAwarePrunesLargeFleets(t *testing.T) {
	for _, n := range []int{kvPruneAbove, 1000} {
		r, s := benchFleet(n)
		healthy := 0
		for _, rp := range s.Replicas {
			if rp.Healthy {
				healthy++
			}
		}
		want := KVAware{}.pick(&Request{ID: r.ID, Hash: r.Hash, Tokens: r.Tokens, Blocks: r.Blocks, Pinned: r.Pinned,
			Match: r.Match, Age: r.Age}, s, false)
		d := KVAware{}.Pick(r, s)
		pruned, winner := d.Pruned, false
		for _, k := range d.Costs {
			winner = winner || k.Replica == d.Replica
		}
		if !winner {
			t.Errorf("%d replicas: the winner %d is not priced in full", n, d.Replica)
		}
		if d.Replica != want.Replica || d.Reason != want.Reason || d.Matched != want.Matched || len(d.Costs)+pruned != healthy {
			t.Errorf("%d replicas: got %d %s %d with %d costs and %d pruned, want %d %s %d with %d", n, d.Replica, d.Reason, d.Matched,
				len(d.Costs), pruned, want.Replica, want.Reason, want.Matched, healthy)
		}
		switch {
		case n <= kvPruneAbove && pruned != 0:
			t.Errorf("%d replicas: %d pruned, want every candidate priced in full", n, pruned)
		case n > kvPruneAbove && pruned < healthy*8/10:
			t.Errorf("%d replicas: %d of %d pruned, want at least 80%%", n, pruned, healthy)
		}
		t.Logf("%d replicas: %d of %d candidates pruned", n, pruned, healthy)
	}
}
