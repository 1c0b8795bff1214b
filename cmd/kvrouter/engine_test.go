package main

import (
	"testing"

	"github.com/google/go-cmp/cmp"
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
