package route

import (
	"math"
	"testing"
)

// legPool is a fleet of four prefill workers, busy of them with 3,000
// prompt tokens of legs queued, each of Share 0.1, and a decode replica
// running 32 sequences of 2,048 tokens.
func legPool(busy int) *Snapshot {
	rt := Rates{TransferPerMTokens: 1000}
	s := &Snapshot{BlockSize: 16}
	for i := range 4 {
		w := Replica{ID: "p", Role: RolePrefill, Prefills: true, Share: 0.1, Rates: rt}
		if i < busy {
			w.PrefillTokens, w.InFlight = 3000, 1
		}
		s.Replicas = append(s.Replicas, w)
	}
	return withDecoder(s, rt)
}

func withDecoder(s *Snapshot, rt Rates) *Snapshot {
	s.Replicas = append(s.Replicas, Replica{ID: "d", Role: RoleDecode, Healthy: true, InFlight: 32, Decoding: 32,
		DecodeBlocks: 32 * 2048 / 16, CacheBlocks: 28000, Rates: rt})
	return s
}

// TestKVAwareLegRateExact: a prefill worker's leg delays the legs the
// router sends the workers, the fleet's rate (one candidate's λ) times
// the workers' summed Share, spread over the four of them, for as long
// as the pool stays busy: 1/(1 − ρ), ρ = (busy + 1)/(4 + 2). Each that
// arrives while it waits is delayed by its prefill, each that arrives
// while it runs by half of it over the four workers: behind = rate ×
// prefill × (wait + prefill/8), in Others ttftWeight times. Every
// worker's Share counts, not the chosen one's own.
func TestKVAwareLegRateExact(t *testing.T) {
	r := &Request{ID: "l", Hash: 3, Tokens: 4000, Blocks: 250, MaxTokens: 128, Pinned: -1}
	for _, busy := range []int{0, 2, 4} {
		s := legPool(busy)
		if busy == 4 {
			s.Replicas[0].Share = 0.4 // the busiest worker's own Share no longer matters
			s.Replicas[1].Share = 0
		}
		var sc screen
		q := newKVRequest(KVAware{}, r, s, sc.summary(KVAware{}, s), nil)
		rate, workers := q.workerRate(1)
		rho := float64(busy+1) / 6
		share := 0.0
		for _, w := range s.Replicas[:4] {
			share += w.Share
		}
		want := q.arrivals * share / 4 / (1 - rho)
		if math.Abs(rate-want) > 1e-12*want || workers != 4 {
			t.Errorf("%d busy: rate %g per ns over %v workers, want %g over 4", busy, rate, workers, want)
		}
		if q.pw.from < 0 {
			t.Fatalf("%d busy: no prefill worker's leg priced", busy)
		}
		rt := Rates{TransferPerMTokens: 1000}.WithDefaults()
		wait := 0.0
		if busy == 4 {
			wait = rt.queueNS(3000, float64(rt.StepOverhead), 1)
		}
		prefill := rt.prefillNS(4000, 0) + float64(rt.StepOverhead)
		if math.Abs(q.pw.time-(wait+prefill)) > 1e-6 {
			t.Errorf("%d busy: leg time %v, want wait %v + prefill %v", busy, q.pw.time, wait, prefill)
		}
		behind := want * prefill * (wait + prefill/8)
		if got := q.pw.others; math.Abs(got-ttftWeight*behind) > 1e-9*got {
			t.Errorf("%d busy: the leg's others %v, want ttftWeight × %v", busy, got, behind)
		}
	}
}

// TestKVAwareLegBacksOffABusyPool: a 1,500-token prompt beside decode
// batches of 32 on eight decode replicas goes to an idle pool of four
// prefill workers, and is prefilled on its decode replica when every
// worker has 10,000 tokens of legs queued: the legs it would delay on a
// pool busy all the time delay those behind them in turn, six times
// (1/(1 − 5/6)) the legs that arrive while it waits and runs.
func TestKVAwareLegBacksOffABusyPool(t *testing.T) {
	r := &Request{ID: "b", Hash: 5, Tokens: 1500, Blocks: 93, MaxTokens: 128, Pinned: -1}
	pool := func(busy int) *Snapshot {
		s := legPool(busy)
		for i := range 4 {
			s.Replicas[i].Share = 0.2
			if i < busy {
				s.Replicas[i].PrefillTokens = 10000
			}
		}
		for range 7 {
			s = withDecoder(s, s.Replicas[4].Rates)
		}
		return s
	}
	idle := KVAware{}.Pick(r, pool(0))
	if idle.Replica < 4 || idle.Transfer.Blocks == 0 {
		t.Fatalf("idle pool: %+v (%s), want a leg on a worker", idle, idle.Reason)
	}
	busy := KVAware{}.Pick(r, pool(4))
	if busy.Replica < 4 || busy.Transfer.Blocks != 0 || busy.Reason != ReasonLocalPrefill {
		t.Fatalf("busy pool: %+v (%s), want a local prefill", busy, busy.Reason)
	}
}

// TestKVAwareLegJoinsNoQueuedLegsIteration: a 14,000-token prompt's
// leg goes to the worker computing one leg of 3,000 tokens rather than
// to the one with 1,400 tokens to compute in two legs of 700: the
// second of those waits for the next iteration, which the new leg's
// first chunk (8,192 − 700 tokens) would fill, and it would end with it
// rather than 700 tokens in: joined prices that wait, once per leg that
// ends in the iteration (ttftWeight times in the leg's others).
func TestKVAwareLegJoinsNoQueuedLegsIteration(t *testing.T) {
	rt := Rates{TransferPerMTokens: 1000}
	two := Replica{ID: "two", Role: RolePrefill, Prefills: true, Share: 0.1, Rates: rt, InFlight: 2, PrefillTokens: 1400}
	one := Replica{ID: "one", Role: RolePrefill, Prefills: true, Share: 0.1, Rates: rt, InFlight: 1, PrefillTokens: 3000}
	s := withDecoder(&Snapshot{BlockSize: 16, Replicas: []Replica{two, one}}, rt)
	r := &Request{ID: "j", Hash: 9, Tokens: 14000, Blocks: 875, MaxTokens: 128, Pinned: -1}
	var sc screen
	q := newKVRequest(KVAware{}, r, s, sc.summary(KVAware{}, s), nil)
	wt := rt.WithDefaults()
	if got, want := q.joined(&s.Replicas[0], &wt, 14000), wt.prefillNS(8192-700, 0); math.Abs(got-want) > 1e-6 {
		t.Errorf("joined on the worker of two legs %v, want one leg × the compute of 7,492 tokens %v", got, want)
	}
	if got := q.joined(&s.Replicas[1], &wt, 14000); got != 0 {
		t.Errorf("joined on the worker of one leg %v, want 0: its leg is in the iteration under way", got)
	}
	if q.pw.from != 1 {
		t.Errorf("the leg goes to worker %d, want 1 (one leg, in its iteration)", q.pw.from)
	}
}
