package engine

import (
	"github.com/kvrouter/kvrouter/route"

	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestPresets checks each preset against the public figures it claims:
// KV capacity, prefill throughput and decode step time.
func TestPresets(t *testing.T) {
	for _, tc := range []struct {
		name                     string
		kvPerToken               int
		minKTokens, maxKTokens   int // KV capacity, thousands of tokens
		minPrefill, maxPrefill   int // tokens/s of a 4K prompt
		minDecodeMS, maxDecodeMS int // one step of 64 sequences at 2K context
	}{
		{"llama3-8b-h100", 128 << 10, 430, 470, 15_000, 30_000, 10, 30},
		{"llama3-70b-8xh100", 320 << 10, 1200, 1600, 10_000, 25_000, 10, 30},
		{"qwen3-32b-2xh100", 256 << 10, 280, 360, 5_000, 15_000, 15, 40},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Preset(tc.name)
			if err != nil {
				t.Fatal(err)
			}
			e := mustNew(t, c)
			if c.KVBytesPerToken != tc.kvPerToken {
				t.Errorf("KV bytes/token %d, want %d", c.KVBytesPerToken, tc.kvPerToken)
			}
			if k := c.NumBlocks * c.BlockSize / 1000; k < tc.minKTokens || k > tc.maxKTokens {
				t.Errorf("KV capacity %dk tokens, want %d..%dk", k, tc.minKTokens, tc.maxKTokens)
			}
			e.batch = []*seq{{n: 4096, prompt: 4096}}
			if r := int(4096 / e.duration().Seconds()); r < tc.minPrefill || r > tc.maxPrefill {
				t.Errorf("prefill %d tokens/s, want %d..%d", r, tc.minPrefill, tc.maxPrefill)
			}
			e.batch = e.batch[:0]
			for range 64 {
				e.batch = append(e.batch, &seq{n: 1, prompt: 2000, output: 48, computed: 2047})
			}
			if d := e.duration(); d < time.Duration(tc.minDecodeMS)*time.Millisecond || d > time.Duration(tc.maxDecodeMS)*time.Millisecond {
				t.Errorf("decode step %v, want %d..%d ms", d, tc.minDecodeMS, tc.maxDecodeMS)
			}
			r := c.Rates()
			if r.PrefillPerToken != c.PrefillPerToken || r.AttnPerMPairs != c.AttnPerMPairs || r.MaxSeqs != c.MaxNumSeqs ||
				r.DecodeStep != c.StepOverhead+c.DecodeStep || r.DecodePerSeq != c.DecodePerSeq ||
				r.DecodePerMTokens != c.DecodePerMTokens || r.MaxBatchedTokens != c.MaxBatchedTokens {
				t.Errorf("Rates %+v do not follow the preset", r)
			}
		})
	}
	// route's defaults are the default preset's figures.
	if got, want := (route.Rates{}).WithDefaults(), (Config{}).Rates().WithDefaults(); got != want {
		t.Errorf("route defaults %+v, want the llama3-8b-h100 preset's %+v", got, want)
	}
	if _, err := Preset("gpt-5"); err == nil {
		t.Errorf("unknown preset accepted")
	}
	if diff := cmp.Diff([]string{"llama3-70b-8xh100", "llama3-8b-h100", "qwen3-32b-2xh100"}, Presets()); diff != "" {
		t.Errorf("Presets (-want +got):\n%s", diff)
	}
}

// TestPrefillSuperLinear checks the attention term: doubling the context
// more than doubles the prefill time, and a longer batch context slows a
// decode step.
func TestPrefillSuperLinear(t *testing.T) {
	e := mustNew(t, Config{})
	prefill := func(n, c int) time.Duration {
		e.batch = []*seq{{n: n, prompt: n + c, computed: c}}
		return e.duration() - e.cfg.StepOverhead
	}
	if a, b := prefill(8000, 0), prefill(16000, 0); b <= 2*a {
		t.Errorf("prefill 16k %v, want > 2 × prefill 8k %v", b, a)
	}
	if a, b := prefill(1000, 0), prefill(1000, 30000); b <= a {
		t.Errorf("1k chunk after 30k context %v, want > without context %v", b, a)
	}
	decode := func(seqs, ctx int) time.Duration {
		e.batch = e.batch[:0]
		for range seqs {
			e.batch = append(e.batch, &seq{n: 1, prompt: ctx, output: 1, computed: ctx})
		}
		return e.duration()
	}
	if a, b, c := decode(8, 1000), decode(64, 1000), decode(64, 8000); !(a < b && b < c) {
		t.Errorf("decode steps %v (8×1k) %v (64×1k) %v (64×8k), want increasing", a, b, c)
	}
	if d := (Config{}).defaults(); d.NumBlocks != 28181 || d.MaxModelLen != 131072 {
		t.Errorf("zero Config: %d blocks, max len %d; want the llama3-8b-h100 figures", d.NumBlocks, d.MaxModelLen)
	}
}
