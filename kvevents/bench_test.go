package kvevents

import (
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/residency"
)

// BenchmarkIngest decodes and applies event batches to a residency index
// on one goroutine, as a replica's ingester does: each op is one batch of
// BlockStored events (requests of 4 blocks of 16 tokens, chained to a
// shared 4-block prefix) or the BlockRemoved batch evicting them, in both
// encodings. It reports block events per second.
//
//	go test -run='^$' -bench=Ingest -benchmem -cpu=1 ./kvevents
func BenchmarkIngest(b *testing.B) {
	for _, format := range []string{"array", "map"} {
		b.Run("format="+format, func(b *testing.B) {
			const reqs, blocks, bs = 16, 4, 16
			var payloads [][]byte
			prefixEv := stored(format, []any{1, 2, 3, 4}, nil, toks(0, 4*bs), bs)
			payloads = append(payloads, pack(b, []any{0.0, []any{prefixEv}}))
			next := 100
			for round := range 64 {
				var st, rm []any
				for r := range reqs {
					hs := make([]any, blocks)
					for i := range hs {
						hs[i] = next
						next++
					}
					st = append(st, stored(format, hs, 4, toks(round*100_000+r*1000, blocks*bs), bs))
					rm = append(rm, removed(format, hs))
				}
				payloads = append(payloads, pack(b, []any{float64(round), st, 0}), pack(b, []any{float64(round), rm, 0}))
			}
			idx := residency.New(residency.Config{MaxReplicas: 8, DefaultCapacity: 1 << 20})
			c := newChain(1, "m", idx, nil, func() time.Duration { return 0 })
			d := NewDecoder()
			var batch Batch
			if err := d.Decode(payloads[0], &batch); err != nil {
				b.Fatal(err)
			}
			c.apply(&batch)
			events := 0
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				i = i%(len(payloads)-1) + 1
				if err := d.Decode(payloads[i], &batch); err != nil {
					b.Fatal(err)
				}
				n := c.apply(&batch)
				events += n.stored + n.removed
			}
			if c.Len() > 4+reqs*blocks {
				b.Fatalf("chain holds %d blocks", c.Len())
			}
			b.ReportMetric(float64(events)/b.Elapsed().Seconds(), "blocks/s")
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(max(events, 1)), "ns/block")
		})
	}
}

func stored(format string, hashes []any, parent any, tokens []any, bs int) any {
	if format == "array" {
		return []any{"BlockStored", hashes, parent, tokens, bs, nil, "GPU", nil}
	}
	return omap{{"type", "BlockStored"}, {"block_hashes", hashes}, {"parent_block_hash", parent}, {"token_ids", tokens},
		{"block_size", bs}, {"lora_id", nil}, {"medium", "GPU"}, {"lora_name", nil}, {"extra_keys", nil}, {"group_idx", 0}}
}

func removed(format string, hashes []any) any {
	if format == "array" {
		return []any{"BlockRemoved", hashes, "GPU"}
	}
	return omap{{"type", "BlockRemoved"}, {"block_hashes", hashes}, {"medium", "GPU"}, {"group_idx", 0}}
}
