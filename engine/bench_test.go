package engine

import (
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/prefix"
)

// BenchmarkBusyReplica measures the model's speed on a busy replica: 64
// running requests of 8K-token contexts (7680 prompt tokens, the first 2048
// shared, plus 512 output tokens), a new request arriving whenever one
// finishes, on the llama3-70b-8xh100 preset (whose 1.4M-token cache holds
// the whole batch). One op is one Step; engine-s/cpu-s is simulated engine
// seconds per CPU second of the process (getrusage, so that other load on
// the machine does not count). The simulator's budget (a one-hour trace on
// 16 replicas in 30 CPU-seconds) needs about 2,000.
//
//	go test -run='^$' -bench=BusyReplica -benchmem ./engine
func BenchmarkBusyReplica(b *testing.B) {
	for _, tc := range []struct {
		name                      string
		preset                    string
		noTokens                  bool
		seqs, prompt, shared, out int
	}{
		{"tokens", "llama3-70b-8xh100", false, 64, 7680, 2048, 512},
		{"notokens", "llama3-70b-8xh100", true, 64, 7680, 2048, 512},
		// Mooncake's shape (mean 12k prompt, 343 output tokens) at 16 in
		// flight on the 8B preset.
		{"mooncake", "llama3-8b-h100", true, 16, 12288, 0, 343},
	} {
		b.Run(tc.name, func(b *testing.B) {
			cfg, err := Preset(tc.preset)
			if err != nil {
				b.Fatal(err)
			}
			cfg.NoTokenEvents = tc.noTokens
			busy(b, cfg, tc.seqs, tc.prompt, tc.shared, tc.out)
		})
	}
}

// busy keeps seqs requests of prompt tokens (shared of them common to all)
// and out output tokens running on an engine of cfg, and reports
// engine-s/cpu-s.
func busy(b *testing.B, cfg Config, seqs, prompt, shared, out int) {
	e, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	bs := e.Config().BlockSize
	common := make([]prefix.Hash, shared/bs)
	for i := range common {
		common[i] = prefix.Hash(i + 1)
	}
	n := 0
	add := func(now time.Duration) {
		n++
		hs := make([]prefix.Hash, prompt/bs)
		copy(hs, common)
		for i := len(common); i < len(hs); i++ {
			hs[i] = prefix.Hash(uint64(n)<<32 | uint64(i))
		}
		r := Request{ID: strconv.Itoa(n), Prompt: prompt, Hashes: hs, MaxTokens: out}
		if err := e.Add(now, &r); err != nil {
			b.Fatal(err)
		}
	}
	// The token budget admits them one prefill at a time, so their
	// completions stagger.
	for range seqs {
		add(0)
	}
	now, next := time.Duration(0), time.Duration(0)
	step := func() {
		now = next
		var evs []Event
		evs, next = e.Step(now)
		for i := range evs {
			if evs[i].Kind == Done {
				add(now)
			}
		}
		if next == Idle {
			b.Fatal("engine went idle")
		}
	}
	for range 20_000 {
		step()
	}
	start, cpu0 := now, cpuTime()
	b.ReportAllocs()
	for b.Loop() {
		step()
	}
	b.ReportMetric((now-start).Seconds()/(cpuTime()-cpu0).Seconds(), "engine-s/cpu-s")
	st := e.Stats()
	b.ReportMetric(float64(st.Running), "running")
	b.ReportMetric(float64(st.Busy)/float64(st.Steps)/1e6, "ms/step")
}

// cpuTime is the CPU time (user and system) the process has used: on a
// shared machine it is a fairer clock than b.Elapsed.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
