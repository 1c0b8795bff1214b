package route_test

import (
	"math"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/engine"
	"github.com/kvrouter/kvrouter/route"
)

// disaggFleet is an idle prefill worker and a decode replica running
// batch sequences of 2,048 tokens of context each, neither caching any
// of the request's tokens prompt, on links of the preset's interconnect.
func disaggFleet(cfg engine.Config, batch, tokens int) (*route.Request, *route.Snapshot) {
	rates := cfg.Rates()
	rates.TransferPerMTokens = time.Duration(1e6 * float64(cfg.KVBytesPerToken) / (cfg.InterconnectGBps * 1e9) * float64(time.Second))
	s := &route.Snapshot{BlockSize: 16, Replicas: []route.Replica{
		{ID: "prefill", Role: route.RolePrefill, Prefills: true, Rates: rates},
		{ID: "decode", Role: route.RoleDecode, Healthy: true, InFlight: batch, DecodeBlocks: batch * 2048 / 16, Rates: rates},
	}}
	r := &route.Request{ID: "r", Tokens: tokens, MaxTokens: 128, Blocks: tokens / 16, Match: []int{0, 0}, Pinned: -1}
	return r, s
}

// disaggGain is what sending a prompt of n tokens to the idle prefill
// worker saves over computing it on a decode replica of b sequences
// holding k tokens, in the model's terms (KVAware's doc): locally, its
// prefill in ⌈n/budget⌉ iterations of the batch, which stalls the b
// sequences, and the wait of the arrivals behind it (λ·P·(w + P/2), λ
// = b over 256 mean steps); remotely, the worker's prefill in iterations
// of the step overhead alone, the transfer of all blocks but the last
// token's, half a step more for the engine to take it up, the residual
// prefill in one iteration; no leg waits behind it on the worker, which
// has run none (its Share is 0). The time to first token counts twice. The decode, and what
// the request's KV takes, are the same either way.
func disaggGain(rt route.Rates, per float64, b, k, n float64) float64 {
	c := func(n, cached float64) float64 {
		return n*float64(rt.PrefillPerToken) + n*(cached+n/2)*float64(rt.AttnPerMPairs)*1e-6
	}
	so, budget := float64(rt.StepOverhead), float64(rt.MaxBatchedTokens)
	iter, half, lambda := so, 0.0, 0.0
	if b > 0 {
		step := float64(rt.DecodeStep) + b*float64(rt.DecodePerSeq) + k*float64(rt.DecodePerMTokens)*1e-6
		iter, half, lambda = step, step/2, b/(256*step)
	}
	iters := math.Ceil(n / budget)
	local := c(n, 0) + iters*iter
	localCost := 2*(half+local) + b*c(n, 0) + 2*lambda*local*(half+local/2)
	sent := math.Floor((n-1)/16) * 16
	worker := c(n, 0) + iters*so
	rest := c(n-sent, sent) + iter
	remoteCost := 2*(2*half+worker+sent*per*1e-6+rest) + b*c(n-sent, sent) + 2*lambda*rest*(2*half+rest/2)
	return localCost - remoteCost
}

// TestDisaggregationBreakEven: for the 8B and 70B presets and decode
// batches of 0 to 128 sequences, kv-aware prefills locally up to a
// prompt length and on the prefill worker beyond it, switching where the
// two placements' priced times cross (disaggGain changes sign) to within
// one 16-token step of the sweep. On an idle decode replica nothing is
// spared by a remote prefill (no decode to stall) and the transfer is
// pure cost, so it never switches; the larger the batch a local prefill
// would stall, the shorter the prompt from which the worker pays.
func TestDisaggregationBreakEven(t *testing.T) {
	const step = 16
	for _, name := range []string{"llama3-8b-h100", "llama3-70b-8xh100"} {
		t.Run(name, func(t *testing.T) {
			cfg, err := engine.Preset(name)
			if err != nil {
				t.Fatal(err)
			}
			last := math.MaxInt
			for _, b := range []int{0, 1, 8, 32, 128} {
				r, s := disaggFleet(cfg, b, 16)
				rt := s.Replicas[1].Rates.WithDefaults()
				per := float64(rt.TransferPerMTokens)
				want, switched := 0, 0
				for n := step; n <= 32768; n += step {
					r, s = disaggFleet(cfg, b, n)
					d := route.KVAware{}.Pick(r, s)
					if d.Replica != 1 {
						t.Fatalf("batch %d, %d tokens: chose %d (%s), want the decode replica", b, n, d.Replica, d.Reason)
					}
					remote := d.Transfer.Blocks > 0
					switch {
					case remote && switched == 0:
						switched = n
						if d.Reason != route.ReasonDisagg || d.Transfer.From != 0 || d.Transfer.Blocks != (n-1)/16 {
							t.Errorf("batch %d, %d tokens: %+v, want a prefill leg on the worker of %d blocks", b, n, d, (n-1)/16)
						}
					case !remote && switched > 0:
						t.Fatalf("batch %d: back to a local prefill at %d tokens after switching at %d", b, n, switched)
					case !remote && d.Reason != route.ReasonLocalPrefill:
						t.Errorf("batch %d, %d tokens: reason %q, want %q", b, n, d.Reason, route.ReasonLocalPrefill)
					}
					if want == 0 && disaggGain(rt, per, float64(b), float64(b*2048), float64(n)) > 0 {
						want = n
					}
				}
				t.Logf("batch %d: switched at %d tokens, break-even %d", b, switched, want)
				if abs(switched-want) > step {
					t.Errorf("batch %d: switched to the prefill worker at %d tokens, want the break-even %d ± %d", b, switched, want, step)
				}
				if b == 0 && switched != 0 {
					t.Errorf("an idle decode replica sends prompts of %d tokens to the worker", switched)
				}
				if b > 0 && switched > last {
					t.Errorf("batch %d switches at %d tokens, later than a smaller batch's %d", b, switched, last)
				}
				if b > 0 {
					last = switched
				}
			}
		})
	}
}

func abs(x int) int { return max(x, -x) }

// TestKVAwareLegSkipsTheBusyWorker: of two prefill workers, one with
// 60,000 prompt tokens of legs queued, which draws few legs while it
// works through them (a Share of 0.01), and one idle that ran most of
// the recent legs (a Share of 0.3), a 40,000-token prompt's leg goes to
// the idle one. The legs that will arrive behind it are the router's
// to steer: spread evenly over the workers, they cost the same on both,
// and the queue ahead decides. Priced at each worker's own Share, the
// busy one's queue would seem to delay nothing behind it, and the
// square of the long prefill would outweigh its whole queue.
func TestKVAwareLegSkipsTheBusyWorker(t *testing.T) {
	cfg, err := engine.Preset("llama3-8b-h100")
	if err != nil {
		t.Fatal(err)
	}
	r, s := disaggFleet(cfg, 32, 40000)
	busy, idle := s.Replicas[0], s.Replicas[0]
	busy.ID, busy.PrefillTokens, busy.InFlight, busy.Share = "busy", 60000, 2, 0.01
	idle.ID, idle.Share = "idle", 0.3
	s.Replicas = []route.Replica{busy, idle, s.Replicas[1]}
	r.Match = []int{0, 0, 0}
	d := route.KVAware{}.Pick(r, s)
	if d.Replica != 2 || d.Transfer.Blocks == 0 || d.Transfer.From != 1 {
		t.Fatalf("decision %+v (%s): want the decode replica, its prompt prefilled on the idle worker (1)", d, d.Reason)
	}
}
