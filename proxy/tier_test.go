package proxy

import (
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/emulator"
	"github.com/kvrouter/kvrouter/engine"
	"github.com/kvrouter/kvrouter/internal/wait"
)

// TestIndexCoversTheCPUTier: two emulated engines with the same GPU cache,
// one with a CPU tier four times as large (reported as vLLM does, in
// cache_config_info's num_cpu_blocks). The router's approximate index
// remembers, per replica, as much as the engine can serve without
// computing: four times as much for the one with the tier.
func TestIndexCoversTheCPUTier(t *testing.T) {
	start := func(cpu int) *emulator.Server {
		e, err := emulator.Start(emulator.Config{Model: "m", Preset: engine.DefaultPreset, TimeScale: 0.02, KVBlocks: 1000, CPUKVBlocks: cpu}, "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })
		return e
	}
	plain, tiered := start(0), start(4000)
	rt, _ := startRouter(t, "kv-aware", func(c *Config) { c.ScrapeInterval = 20 * time.Millisecond }, plain.URL(), tiered.URL())
	runRouter(t, rt)
	tr := rt.st.fleet.Tracker()
	wait.For(t, "both capacities scraped", func() bool {
		_, p := tr.Blocks(0)
		_, c := tr.Blocks(1)
		return p > 0 && c == 4*p
	})
}
