package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/kvrouter/kvrouter/emulator"
	"github.com/kvrouter/kvrouter/engine"
	"github.com/kvrouter/kvrouter/proxy"
	"github.com/kvrouter/kvrouter/route"
)

// runEngine runs one emulated vLLM-compatible replica until ctx is done.
func runEngine(ctx context.Context, args []string) error {
	cfg, listen, err := engineFlags(args)
	if err != nil {
		return err
	}
	log := cfg.Logger // engineFlags made it, as --log-format says
	s, err := emulator.Start(cfg, listen)
	if err != nil {
		return err
	}
	ec := s.EngineConfig()
	log.Info("kvrouter engine serving", "url", s.URL(), "models", strings.Join(s.Models(), ","),
		"loras", strings.Join(s.LoRAs(), ","), "preset", cfg.Preset,
		"time_scale", cfg.TimeScale, "kv_blocks", ec.NumBlocks, "block_size", ec.BlockSize,
		"max_num_seqs", ec.MaxNumSeqs, "max_model_len", ec.MaxModelLen, "kv_full_status", cfg.KVFullStatus,
		"kv_events", s.KVEventsEndpoint(), "replay", s.ReplayEndpoint(), "topic", s.Topic(),
		"kv_role", s.KVRole().String(), "kv_engine_id", s.EngineID(), "kv_hold_timeout", cfg.KVHoldTimeout)
	<-ctx.Done()
	log.Info("kvrouter engine stopping")
	err = s.Close()
	log.Info("kvrouter engine stopped")
	return err
}

var engineHelp = help{
	synopsis: "kvrouter engine [flags]",
	about: "Runs an emulated vLLM replica: the engine model (paged KV cache with prefix\n" +
		"caching, continuous batching, a timing preset) on a wall clock behind vLLM's\n" +
		"OpenAI API, /metrics, /health, /tokenize and ZMQ KV-cache events. A stand-in for\n" +
		"a GPU replica, for trying the router, tests and benchmarks. Runs until SIGINT or\n" +
		"SIGTERM.",
	examples: []string{
		"kvrouter engine --listen 127.0.0.1:8001 --time-scale 0.05   # 20x faster than real time",
		"kvrouter engine --listen 127.0.0.1:8002 --model m --kv-events-endpoint 'tcp://*:5557'",
		"kvrouter engine --listen 127.0.0.1:8003 --kv-role prefill --kv-hold-timeout 60s   # a P/D prefill worker",
	},
}

// engineFlags parses the engine subcommand's flags into a config and the
// listen address.
func engineFlags(args []string) (emulator.Config, string, error) {
	fs := flag.NewFlagSet("engine", flag.ContinueOnError)
	var cfg emulator.Config
	models := &nameList{list: []string{"emulated"}}
	loras := &nameList{}
	listen := fs.String("listen", "127.0.0.1:8001", "HTTP listen address")
	fs.Var(models, "model", "served model names, comma-separated or repeated (vLLM --served-model-name): one model, one KV cache; the first is the name in responses, metrics and the KV-event topic")
	fs.Var(loras, "lora", "LoRA adapter names loaded on the engine, comma-separated or repeated; each is a model of its own whose blocks never match the base model's")
	fs.StringVar(&cfg.Preset, "preset", engine.DefaultPreset, "engine preset: "+strings.Join(engine.Presets(), ", "))
	presetFileFlag(fs, &cfg.Preset)
	fs.Float64Var(&cfg.TimeScale, "time-scale", 1, "wall seconds per engine second (0.05 runs 20x faster than real time)")
	fs.StringVar(&cfg.KVEventsEndpoint, "kv-events-endpoint", "", "ZMQ PUB endpoint for KV events, e.g. tcp://*:5557 (binds with * or ::, connects otherwise); empty: no events")
	fs.StringVar(&cfg.ReplayEndpoint, "kv-events-replay-endpoint", "", "ZMQ ROUTER endpoint for event replay, e.g. tcp://*:5558")
	fs.StringVar(&cfg.KVEventsFormat, "kv-events-format", emulator.FormatMap, "KV event encoding: map (vLLM >= 0.26) or array (legacy)")
	fs.StringVar(&cfg.Topic, "kv-events-topic", "", "KV event topic; empty: kv@<listen>@<first model>")
	fs.StringVar(&cfg.MetricsFlavor, "metrics-flavor", emulator.FlavorVLLM, "metric names: vllm or sglang")
	fs.IntVar(&cfg.MaxNumSeqs, "max-num-seqs", 0, "max running requests; 0: the preset's")
	fs.IntVar(&cfg.KVBlocks, "kv-blocks", 0, "KV cache capacity in blocks; 0: the preset's")
	fs.IntVar(&cfg.BlockSize, "block-size", 0, "tokens per KV block, as vLLM's --block-size; 0: the preset's (16)")
	fs.IntVar(&cfg.CPUKVBlocks, "cpu-kv-blocks", 0, "CPU offload tier in blocks (as vLLM's CPU offloading or LMCache): computed blocks are copied there and loaded back over PCIe instead of recomputed, reported as medium CPU in KV events; 0: none")
	fs.Float64Var(&cfg.PCIeGBps, "pcie-gbps", 0, fmt.Sprintf("host-to-GPU bandwidth of the CPU tier in GB/s (gigabytes); 0: %d", engine.DefaultPCIeGBps))
	logFormat := fs.String("log-format", proxy.LogText, "log lines as text (key=value) or json (one object per line)")
	fs.Float64Var(&cfg.InterconnectGBps, "interconnect-gbps", 0, "bandwidth in GB/s (gigabytes) each way of the links KV transfers to and from peers take (kv_transfer_params); 0: the preset's")
	kvRole := fs.String("kv-role", "both", "part in prefill/decode disaggregation, as vLLM's kv_role: prefill (holds a prefill leg's KV for its decode worker; computes a decode leg's prompt itself), decode (reads a decode leg's KV from its prefill worker; serves a prefill leg as a plain request) or both")
	fs.DurationVar(&cfg.KVHoldTimeout, "kv-hold-timeout", emulator.DefaultKVHoldTimeout, "how long, in engine time, a prefill leg's KV blocks are held for a decode worker that does not read them (vLLM's VLLM_NIXL_ABORT_REQUEST_TIMEOUT)")
	fs.StringVar(&cfg.EngineID, "kv-engine-id", "", "the engine's id in kv_transfer_params (remote_engine_id, vLLM's kv_transfer_config engine_id); empty: a random id")
	fs.StringVar(&cfg.SideChannelHost, "kv-side-channel-host", "", "host a prefill leg's kv_transfer_params name for the side channel decode workers read KV from (remote_host, vLLM's VLLM_NIXL_SIDE_CHANNEL_HOST; the port is --listen's); empty: the local address the leg came in on")
	fs.IntVar(&cfg.KVFullStatus, "kv-full-status", 0, "HTTP status (e.g. 500, as llm-d-inference-sim) answered to a request whose uncached prompt blocks exceed the free ones on arrival; 0: queue it, as vLLM does")
	err := parseFlags(fs, args, engineHelp, os.Stderr)
	if err != nil {
		return cfg, "", err
	}
	if *logFormat != proxy.LogText && *logFormat != proxy.LogJSON {
		return cfg, "", fmt.Errorf("log-format %q: want text or json", *logFormat)
	}
	if cfg.KVRole, err = route.ParseRole(*kvRole); err != nil {
		return cfg, "", fmt.Errorf("kv-role: %w", err)
	}
	if cfg.KVHoldTimeout <= 0 {
		return cfg, "", fmt.Errorf("kv-hold-timeout %v: want a positive duration", cfg.KVHoldTimeout)
	}
	cfg.Logger = newLogger(os.Stderr, proxy.DefaultLogLevel, *logFormat)
	cfg.Model, cfg.Aliases = models.list[0], models.list[1:]
	cfg.LoRAs = loras.list
	return cfg, *listen, nil
}

// nameList is a repeatable flag of comma-separated names. The first Set
// replaces the default; later ones append.
type nameList struct {
	list    []string
	touched bool
}

func (n *nameList) String() string {
	if n == nil {
		return ""
	}
	return strings.Join(n.list, ",")
}

func (n *nameList) Set(s string) error {
	if !n.touched {
		n.list, n.touched = nil, true
	}
	for name := range strings.SplitSeq(s, ",") {
		name = strings.TrimSpace(name)
		if name == "" {
			return errors.New("empty name")
		}
		n.list = append(n.list, name)
	}
	return nil
}
