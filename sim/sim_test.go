package sim

import (
	"fmt"
	"testing"
	"time"

	"kvrouter/trace"
)

// sharedPrefix builds groups × prompts requests: each prompt is its group's
// prefix segment (prefix tokens) then a unique question (question tokens),
// arriving every gap, groups interleaved.
func sharedPrefix(groups, prompts, prefixTokens, question, output int, gap time.Duration) []trace.Request {
	var reqs []trace.Request
	for p := 0; p < prompts; p++ {
		for g := 0; g < groups; g++ {
			n := len(reqs)
			reqs = append(reqs, trace.Request{
				ID: fmt.Sprintf("g%d-p%d", g, p), At: time.Duration(n) * gap, Tenant: fmt.Sprint(g),
				Segments: []trace.Segment{{ID: uint64(1000 + g), Tokens: prefixTokens}, {ID: uint64(1_000_000 + n), Tokens: question}},
				Prompt:   prefixTokens + question, Output: output,
			})
		}
	}
	return reqs
}

func hitRate(res *result) float64 {
	var p, c int64
	for _, s := range res.samples {
		p += int64(s.prompt)
		c += int64(s.cached)
	}
	return float64(c) / float64(p)
}

func TestSmoke(t *testing.T) {
	reqs := sharedPrefix(4, 8, 2048, 128, 64, 2*time.Second)
	o, err := simulate(Config{Requests: reqs, Replicas: 4})
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range o.runs {
		t.Logf("%-20s done %d rej %v hit %.3f end %v reasons %v", o.names[i], len(r.samples), r.rejected, hitRate(r), r.end, r.reasons)
	}
	t.Logf("infinite %.3f pooled %.3f", float64(o.infinite.Cached)/float64(o.infinite.Prompt), float64(o.pooled.Cached)/float64(o.pooled.Prompt))
}
