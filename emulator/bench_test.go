package emulator

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"
)

// BenchmarkCompletion measures the emulator's own overhead per request
// (HTTP, JSON, tokenizer, engine loop, SSE) with engine time scaled to
// nothing, over loopback.
//
//	go test -run='^$' -bench=Completion -benchmem ./emulator
func BenchmarkCompletion(b *testing.B) {
	for _, tt := range []struct {
		prompt int
		stream bool
	}{{1000, false}, {1000, true}, {8000, false}} {
		b.Run(fmt.Sprintf("prompt=%d/stream=%v", tt.prompt, tt.stream), func(b *testing.B) {
			s, err := Start(Config{Preset: "llama3-8b-h100", TimeScale: 1e-9, Model: "m"}, "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			body, _ := json.Marshal(map[string]any{"prompt": words("bn", tt.prompt/2), "max_tokens": 16, "stream": tt.stream})
			b.ReportAllocs()
			start := time.Now()
			for b.Loop() {
				resp, err := http.Post(s.URL()+"/v1/completions", "application/json", bytes.NewReader(body))
				if err != nil {
					b.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					b.Fatalf("status %d", resp.StatusCode)
				}
			}
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "req/s")
		})
	}
}

// BenchmarkEncodeBatch measures the msgpack encoding of one step's
// BlockStored event of 64 blocks.
//
//	go test -run='^$' -bench=EncodeBatch -benchmem ./emulator
func BenchmarkEncodeBatch(b *testing.B) {
	for _, format := range []string{FormatMap, FormatArray} {
		b.Run("format="+format, func(b *testing.B) {
			ev := storedEvent(64)
			enc := newBatchEncoder(format, nil)
			b.ReportAllocs()
			for b.Loop() {
				enc.encode(1.5, ev)
			}
		})
	}
}
