package tokenizer

import (
	"encoding/json"
	"fmt"
	"github.com/kvrouter/kvrouter/internal/qwen3"
	"strings"
	"testing"
	"unicode/utf8"
)

func utf8Valid(s string) bool { return utf8.ValidString(s) }

// chatOfTokens builds a chat of about n tokens of varied English and code.
func chatOfTokens(n int) []map[string]string {
	para := "The router keeps metadata about cache ownership, not the KV tensors themselves. " +
		"It records token-prefix hashes, block ranges, and the replica that owns them; " +
		"func pick(r *Request) int { return argmin(cost(r, i) for i in replicas) } // 42 tokens? "
	var msgs []map[string]string
	msgs = append(msgs, map[string]string{"role": "system", "content": "You are a careful assistant. " + strings.Repeat(para, 4)})
	for i := 0; ; i++ {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		msgs = append(msgs, map[string]string{"role": role, "content": fmt.Sprintf("Turn %d. %s", i, strings.Repeat(para, 3))})
		if len(msgs)*3*len(para)/4 > n {
			return msgs
		}
	}
}

// BenchmarkChat measures chat tokenization with Qwen3's tokenizer:
// cold (a fresh tokenizer, nothing memoised) and a new turn of a
// conversation whose earlier turns were seen.
//
//	go test -run='^$' -bench=Chat -benchmem ./tokenizer
func BenchmarkChat(b *testing.B) {
	dir := qwen3.Dir(b)
	msgs := chatOfTokens(8000)
	full, _ := json.Marshal(msgs)
	prev, _ := json.Marshal(msgs[:len(msgs)-1])
	b.Run("cold-8k", func(b *testing.B) {
		b.ReportAllocs()
		n := 0
		for b.Loop() {
			b.StopTimer()
			tok, err := Load(dir)
			if err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			ids, err := tok.Chat(full, nil, nil)
			if err != nil {
				b.Fatal(err)
			}
			n = len(ids)
		}
		b.ReportMetric(float64(n), "tokens")
	})
	b.Run("new-turn-8k", func(b *testing.B) {
		tok, err := Load(dir)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := tok.Chat(prev, nil, nil); err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			if _, err := tok.Chat(full, nil, nil); err != nil {
				b.Fatal(err)
			}
		}
	})
}
