package main

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvrouter/kvrouter/route"
)

func TestEngineFlagsModels(t *testing.T) {
	tests := []struct {
		name           string
		args           []string
		model          string
		aliases, loras []string
		kvFullStatus   int
	}{
		{"defaults", nil, "emulated", []string{}, nil, 0},
		{"one", []string{"--model", "m"}, "m", []string{}, nil, 0},
		{"comma list", []string{"--model", "a,b", "--lora", "sql"}, "a", []string{"b"}, []string{"sql"}, 0},
		{"repeated", []string{"--model", "a", "--model", "b, c", "--lora", "sql", "--lora", "chat,tools"},
			"a", []string{"b", "c"}, []string{"sql", "chat", "tools"}, 0},
		{"kv full status", []string{"--kv-full-status", "500"}, "emulated", []string{}, nil, 500},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, listen, err := engineFlags(tt.args)
			if err != nil {
				t.Fatal(err)
			}
			if listen != "127.0.0.1:8001" {
				t.Errorf("listen %q, want the default", listen)
			}
			if cfg.Model != tt.model || cfg.KVFullStatus != tt.kvFullStatus {
				t.Errorf("model %q, kv full status %d; want %q, %d", cfg.Model, cfg.KVFullStatus, tt.model, tt.kvFullStatus)
			}
			if diff := cmp.Diff(tt.aliases, cfg.Aliases); diff != "" {
				t.Errorf("aliases (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.loras, cfg.LoRAs); diff != "" {
				t.Errorf("loras (-want +got):\n%s", diff)
			}
		})
	}
	if _, _, err := engineFlags([]string{"--model", "a,,b"}); err == nil {
		t.Error("--model a,,b: no error, want one for the empty name")
	}
}

// TestEngineFlagsKVTransfer: --kv-role takes route.ParseRole's names
// (default both), --kv-hold-timeout a positive duration (default vLLM's
// 480 s).
func TestEngineFlagsKVTransfer(t *testing.T) {
	tests := []struct {
		name string
		args []string
		role route.Role
		hold time.Duration
		id   string
	}{
		{"defaults", nil, route.RoleBoth, 480 * time.Second, ""},
		{"prefill", []string{"--kv-role", "prefill", "--kv-hold-timeout", "30s", "--kv-engine-id", "p0"}, route.RolePrefill, 30 * time.Second, "p0"},
		{"decode", []string{"--kv-role", "decode"}, route.RoleDecode, 480 * time.Second, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, _, err := engineFlags(tt.args)
			if err != nil {
				t.Fatal(err)
			}
			if cfg.KVRole != tt.role || cfg.KVHoldTimeout != tt.hold || cfg.EngineID != tt.id {
				t.Errorf("role %v, hold %v, id %q; want %v, %v, %q", cfg.KVRole, cfg.KVHoldTimeout, cfg.EngineID, tt.role, tt.hold, tt.id)
			}
		})
	}
	for _, args := range [][]string{{"--kv-role", "producer"}, {"--kv-hold-timeout", "0s"}, {"--kv-hold-timeout", "-1s"}} {
		if _, _, err := engineFlags(args); err == nil {
			t.Errorf("%v: no error", args)
		}
	}
}
