package sim

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/trace"
)

// mooncakePath is the Mooncake conversation trace, relative to this package.
var mooncakePath = filepath.Join("..", "..", "shared", "traces", "mooncake", "conversation_trace.jsonl")

// BenchmarkMooncake runs the whole Mooncake conversation trace (12,031
// requests, one hour) on 16 llama3-8b-h100 replicas at load 0.8, one
// sub-benchmark per policy, and reports wall seconds per policy run
// (s/policy), process CPU seconds per policy run (cpu-s/policy, steadier on
// a busy machine) and simulated requests per wall second. The "prepare"
// sub-benchmark is the once-per-run part: block hashes and both oracles.
// Skipped when the trace is absent.
//
//	go test -run='^$' -bench=Mooncake -benchtime=1x ./sim
func BenchmarkMooncake(b *testing.B) {
	if _, err := os.Stat(mooncakePath); err != nil {
		b.Skipf("trace absent: %v", err)
	}
	w, err := trace.ReadFile(mooncakePath)
	if err != nil {
		b.Fatal(err)
	}
	cfg := Config{Requests: w.Requests, Replicas: 16, Load: 0.8}
	var o *outcome
	b.Run("prepare", func(b *testing.B) { // jobs, hashes and oracles, once per run
		b.ReportAllocs()
		for b.Loop() {
			if o, err = prepare(cfg); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(b.Elapsed().Seconds()/float64(b.N), "s/run")
	})
	for _, name := range allPolicies() {
		b.Run(name, func(b *testing.B) {
			if o == nil {
				if o, err = prepare(cfg); err != nil {
					b.Fatal(err)
				}
				b.ResetTimer()
			}
			b.ReportAllocs()
			cpu0 := cpuTime()
			for b.Loop() {
				if _, err := o.run(name); err != nil {
					b.Fatal(err)
				}
			}
			sec := b.Elapsed().Seconds() / float64(b.N)
			b.ReportMetric(sec, "s/policy")
			b.ReportMetric((cpuTime()-cpu0).Seconds()/float64(b.N), "cpu-s/policy")
			b.ReportMetric(float64(len(o.jobs))/sec, "req/s")
		})
	}
}

// cpuTime is the process's user+system CPU time: on a shared, noisy machine
// it is a steadier measure than wall time (it includes the GC's workers).
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
