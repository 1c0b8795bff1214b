package sim

import (
	"testing"

	"github.com/kvrouter/kvrouter/engine"
)

func TestFleetKVTokens(t *testing.T) {
	cfg, err := engine.Preset("llama3-8b-h100")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		cfg      engine.Config
		replicas int
		want     int
	}{
		{"16 × llama3-8b-h100", cfg, 16, 16 * 28181 * 16},
		{"zero blocks: the engine's default capacity", engine.Config{BlockSize: 32}, 2, 2 * (28181 * 16 / 32) * 32},
		{"invalid config", engine.Config{NumBlocks: -1}, 4, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := FleetKVTokens(tt.cfg, tt.replicas); got != tt.want {
				t.Errorf("got %d tokens, want %d", got, tt.want)
			}
		})
	}
}
