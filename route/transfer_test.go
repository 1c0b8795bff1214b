package route_test

import (
	"math"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/engine"
	"github.com/kvrouter/kvrouter/route"
)

// holderBatch is the holder's running sequences in transferFleet, each
// with holderContext tokens of KV: a batch whose decode is slow enough
// that the idle replica is the better place to decode.
const holderBatch, holderContext = 240, 2048

// transferFleet is two replicas of preset rates: replica 0 holds the
// first 8,000 tokens of the request's 8,192 but decodes a large batch;
// replica 1 is idle and holds nothing. Both transfer over links of gbps
// GB/s.
func transferFleet(cfg engine.Config, gbps float64, linkWait time.Duration) (*route.Request, *route.Snapshot) {
	rates := cfg.Rates()
	rates.TransferPerMTokens = time.Duration(1e6 * float64(cfg.KVBytesPerToken) / (gbps * 1e9) * float64(time.Second))
	s := &route.Snapshot{BlockSize: 16, Replicas: []route.Replica{
		{ID: "holder", Healthy: true, InFlight: holderBatch, DecodeBlocks: holderBatch * holderContext / 16, Rates: rates, LinkWait: linkWait},
		{ID: "idle", Healthy: true, Rates: rates},
	}}
	r := &route.Request{ID: "r", Tokens: 8192, MaxTokens: 64, Blocks: 512, Match: []int{500, 0}, Pinned: -1}
	return r, s
}

// compute is the model's compute of n new tokens after c cached.
func compute(rt route.Rates, n, c float64) float64 {
	return n*float64(rt.PrefillPerToken) + n*(c+n/2)*float64(rt.AttnPerMPairs)*1e-6
}

// prefill is the model's prefill of n tokens after c cached on an idle
// replica: the compute and one idle iteration (the step overhead) per
// MaxBatchedTokens of it.
func prefill(rt route.Rates, n, c float64) float64 {
	return compute(rt, n, c) + math.Ceil(n/float64(rt.MaxBatchedTokens))*float64(rt.StepOverhead)
}

// holderStep is one decode iteration of transferFleet's holder with a
// batch of b sequences of ctx tokens each.
func holderStep(rt route.Rates, b, ctx float64) float64 {
	return float64(rt.DecodeStep) + b*float64(rt.DecodePerSeq) + b*ctx*float64(rt.DecodePerMTokens)*1e-6
}

// holderLeg is the prefill leg of transferFleet's holder, with a batch of
// b sequences of ctx tokens each, for the request when it caches cached
// tokens of it: the rest of the iteration under way (half a step), then
// the prompt's rest in iterations of its batch.
func holderLeg(rt route.Rates, b, ctx, cached float64) (wait, prefill float64) {
	step, n := holderStep(rt, b, ctx), 8192-cached
	return step / 2, compute(rt, n, cached) + math.Ceil(n/float64(rt.MaxBatchedTokens))*step
}

// TestTransferBreakEven sweeps the interconnect from 1 to 400 GB/s: on
// the idle replica, importing the holder's prefix beats computing the
// prompt exactly where the import's time drops below what it spares. The
// import runs as the router runs it, a leg on the holder: the holder
// computes the 192 tokens it lacks at its next iteration (W + L), stalls
// its 240 decodes for that compute (S) and delays the requests that
// arrive behind it (2·λ·L·(W + L/2)), and the 511 blocks of all but the
// last token cross the link (T = 8,176 × KV bytes per token ÷
// bandwidth); the idle replica computes the last 16 tokens (R). Against
// computing the whole prompt there (P), it wins when 2(W + L + T + R) + S
// + 2λL(W + L/2) < 2P + λ(P² − R²): a prefill's own time counts twice, and
// the requests that arrive at the idle replica while it computes wait
// λ·P²/2 twice (λ the fleet's per-replica arrival rate, by Little's law
// the mean batch over MeanOutput mean steps).
func TestTransferBreakEven(t *testing.T) {
	const step = 0.25 // GB/s
	for _, name := range []string{"llama3-8b-h100", "llama3-70b-8xh100"} {
		t.Run(name, func(t *testing.T) {
			cfg, err := engine.Preset(name)
			if err != nil {
				t.Fatal(err)
			}
			rt := cfg.Rates().WithDefaults()
			full, rest := prefill(rt, 8192, 0), prefill(rt, 16, 8176)
			meanBatch, meanContext := holderBatch/2.0, holderBatch*holderContext/2.0
			lambda := meanBatch / (256 * (float64(rt.DecodeStep) + meanBatch*float64(rt.DecodePerSeq) + meanContext*float64(rt.DecodePerMTokens)*1e-6)) // per ns
			w, l := holderLeg(rt, holderBatch, holderContext, 8000)
			leg := 2*(w+l+rest) + holderBatch*compute(rt, 192, 8000) + 2*lambda*l*(w+l/2)
			spared := 2*full + lambda*(full*full-rest*rest) - leg
			want := 2 * 8176 * float64(cfg.KVBytesPerToken) / spared // bytes per ns = GB/s
			switched := 0.0
			for gbps := 1.0; gbps <= 400; gbps += step {
				r, s := transferFleet(cfg, gbps, 0)
				d := route.KVAware{}.Pick(r, s)
				if d.Replica != 1 {
					t.Fatalf("at %v GB/s chose replica %d (%s), want the idle one", gbps, d.Replica, d.Reason)
				}
				importing := d.Transfer.Blocks > 0
				switch {
				case importing && switched == 0:
					switched = gbps
					if d.Reason != route.ReasonTransfer || d.Transfer.From != 0 || d.Transfer.Blocks != 511 || d.Transfer.Cached != 8000 || d.Matched != 8176 {
						t.Errorf("at %v GB/s: %+v, want a leg on the holder sending 511 blocks", gbps, d)
					}
				case !importing && switched > 0:
					t.Fatalf("back to recompute at %v GB/s after importing from %v", gbps, switched)
				}
			}
			t.Logf("switched to transfer at %.2f GB/s; break-even %.2f GB/s", switched, want)
			if switched == 0 || math.Abs(switched-want) > step {
				t.Errorf("switched to transfer at %v GB/s, want the break-even %.2f ± %v", switched, want, step)
			}
		})
	}
}

// TestTransferWaitsForTheLink: the predicted transfer is the holder's leg
// and the blocks' time on an idle 50 GB/s link; a link still busy for a
// second with other transfers makes computing the prompt cheaper.
func TestTransferWaitsForTheLink(t *testing.T) {
	cfg, err := engine.Preset("llama3-8b-h100")
	if err != nil {
		t.Fatal(err)
	}
	r, s := transferFleet(cfg, 50, 0)
	if d := (route.KVAware{}).Pick(r, s); d.Transfer.Blocks == 0 {
		t.Fatalf("idle 50 GB/s link: %+v, want a transfer", d)
	} else {
		w, l := holderLeg(s.Replicas[1].Rates.WithDefaults(), holderBatch, holderContext, 8000)
		want := time.Duration(w + l + 8176*float64(s.Replicas[1].Rates.TransferPerMTokens)*1e-6)
		if d := d.Transfer.Time - want; d < -time.Microsecond || d > time.Microsecond {
			t.Errorf("predicted transfer %v, want %v", d, want)
		}
	}
	r, s = transferFleet(cfg, 50, time.Second)
	if d := (route.KVAware{}).Pick(r, s); d.Transfer.Blocks != 0 || d.Replica != 1 {
		t.Errorf("link busy for 1 s: %+v, want a recompute on the idle replica", d)
	}
}

// TestTransferQueuesOnTheHolder: a leg waits in the holder's queue like
// any request, so a holder with a long prefill queue sends no import,
// however fast the link.
func TestTransferQueuesOnTheHolder(t *testing.T) {
	cfg, err := engine.Preset("llama3-8b-h100")
	if err != nil {
		t.Fatal(err)
	}
	r, s := transferFleet(cfg, 400, 0)
	s.Replicas[0].PrefillTokens = 500_000
	if d := (route.KVAware{}).Pick(r, s); d.Transfer.Blocks != 0 || d.Replica != 1 {
		t.Errorf("holder 500,000 tokens behind: %+v, want a recompute on the idle replica", d)
	}
}

// TestTransferOrdersTheWholePrompt: the holder's match is old enough that
// each of its blocks is still resident only with some probability, so
// its leg is priced on computing the rest (Transfer.Cached below the
// 8,000 it matched); but the leg computes the whole prompt and the order
// names every block of it but the last token's, as vLLM's prefill worker
// returns them.
func TestTransferOrdersTheWholePrompt(t *testing.T) {
	cfg, err := engine.Preset("llama3-8b-h100")
	if err != nil {
		t.Fatal(err)
	}
	r, s := transferFleet(cfg, 50, 0)
	for i := range s.Replicas {
		s.Replicas[i].CacheBlocks = 40000
		s.Replicas[i].Rates.Horizon = 10 * time.Minute
	}
	r.Age = []time.Duration{7 * time.Minute, 0}
	d := route.KVAware{}.Pick(r, s)
	if d.Replica != 1 || d.Transfer.From != 0 {
		t.Fatalf("%+v, want an import from the holder to the idle replica", d)
	}
	if d.Transfer.Cached <= 0 || d.Transfer.Cached >= 8000 {
		t.Errorf("predicted cached on the holder %d, want the expected share of its 8,000 (0 < it < 8,000)", d.Transfer.Cached)
	}
	if d.Transfer.Blocks != 511 || d.Matched != 8176 {
		t.Errorf("ordered %d blocks, cached %d; want all 511 of the prompt's full blocks", d.Transfer.Blocks, d.Matched)
	}
}

// TestTransferTakesOnlySettledBlocks: the holder's index matches 500
// blocks, but a request it has yet to prefill is computing them
// (Request.Settled): the holder is no source, and the idle replica
// computes the prompt. With 400 of them computed its leg computes the
// rest after those 400, priced as such. (The holder decodes 4 sequences
// of 131,072 tokens each: a slow place to decode, where a leg of 1,792
// tokens stalls few.)
func TestTransferTakesOnlySettledBlocks(t *testing.T) {
	cfg, err := engine.Preset("llama3-8b-h100")
	if err != nil {
		t.Fatal(err)
	}
	const b, ctx = 4, 131072
	r, s := transferFleet(cfg, 50, 0)
	s.Replicas[0].InFlight, s.Replicas[0].DecodeBlocks = b, b*ctx/16
	r.Settled = []int{0, 0}
	if d := (route.KVAware{}).Pick(r, s); d.Transfer.Blocks != 0 || d.Replica != 1 || d.Matched != 0 {
		t.Errorf("nothing settled: %+v, want a recompute on the idle replica", d)
	}
	r.Settled = []int{400, 0}
	d := route.KVAware{}.Pick(r, s)
	if d.Replica != 1 || d.Transfer.From != 0 || d.Transfer.Blocks != 511 || d.Transfer.Cached != 400*16 {
		t.Fatalf("400 blocks settled: %+v, want a leg on the holder from those 400", d)
	}
	w, l := holderLeg(s.Replicas[1].Rates.WithDefaults(), b, ctx, 400*16)
	want := time.Duration(w + l + 8176*float64(s.Replicas[1].Rates.TransferPerMTokens)*1e-6)
	if got := d.Transfer.Time - want; got < -time.Microsecond || got > time.Microsecond {
		t.Errorf("predicted transfer %v, want %v", d.Transfer.Time, want)
	}
}

// TestKVAwarePricesCopies: an import, like a recompute, stores on the idle
// replica a copy of the 8,000 tokens the holder caches, and each token it
// stores evicts one that requests ask for again with probability
// Displaced (the replica's measured share): Memory carries 2 × Displaced ×
// the prefill of the copy, which the next request pays in both
// latencies. With nothing displaced the import to the idle replica wins
// over the holder's queue; when what it evicts is asked for again, the
// holder's queue is the cheaper price, and going there copies nothing.
func TestKVAwarePricesCopies(t *testing.T) {
	cfg, err := engine.Preset("llama3-8b-h100")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		displaced float64
		want      int
	}{{0, 1}, {1, 0}} {
		r, s := transferFleet(cfg, 50, 0)
		r.Costs = make([]route.Cost, 0, len(s.Replicas))
		for i := range s.Replicas {
			s.Replicas[i].Rates.Displaced = tc.displaced
		}
		d := route.KVAware{}.Pick(r, s)
		if d.Replica != tc.want {
			t.Errorf("Displaced %g: chose %d (%s), want %d", tc.displaced, d.Replica, d.Reason, tc.want)
		}
		rt := s.Replicas[1].Rates.WithDefaults()
		copied := 8000.0
		meanBatch := holderBatch / 2.0
		want := (2 + meanBatch) * tc.displaced * (copied*float64(rt.PrefillPerToken) + copied*copied/2*float64(rt.AttnPerMPairs)*1e-6)
		for _, k := range d.Costs {
			switch {
			case k.Replica == 1 && math.Abs(float64(k.Memory)-want) > 1e3:
				t.Errorf("Displaced %g: the idle replica's Memory %v, want %v", tc.displaced, k.Memory, time.Duration(want))
			case k.Replica == 0 && k.Memory != 0:
				t.Errorf("Displaced %g: the holder's Memory %v, want 0 (it copies nothing)", tc.displaced, k.Memory)
			}
		}
	}
}
