package scrape

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
)

// Engines, as Load.Engine and a backend's engine= option name them.
const (
	EngineVLLM     = "vllm"
	EngineSGLang   = "sglang"
	EngineLlamaCpp = "llamacpp"
)

// ParseEngine checks an engine name (a backend's engine= option).
func ParseEngine(s string) (string, error) {
	switch s {
	case EngineVLLM, EngineSGLang, EngineLlamaCpp:
		return s, nil
	}
	return "", fmt.Errorf("engine %q: want %s, %s or %s", s, EngineVLLM, EngineSGLang, EngineLlamaCpp)
}

// llama.cpp's llama-server families (started with --metrics): gauges of
// the slots processing and the requests deferred for want of an idle
// slot; counters of the prompt tokens processed (not reused), those
// reused from a slot's cache, and the tokens generated.
const (
	lcppProcessing = "llamacpp:requests_processing"
	lcppDeferred   = "llamacpp:requests_deferred"
	lcppPrompt     = "llamacpp:prompt_tokens"
	lcppCached     = "llamacpp:prompt_tokens_cached"
	lcppPredicted  = "llamacpp:tokens_predicted"
)

// engine names the engine whose families the scrape had, "" if none;
// the first in Parse's list of known families when it had several.
func (s series) engine() string {
	for _, name := range known {
		if _, ok := s[name]; !ok {
			continue
		}
		switch {
		case strings.HasPrefix(name, "vllm:"):
			return EngineVLLM
		case strings.HasPrefix(name, "sglang:"):
			return EngineSGLang
		case strings.HasPrefix(name, "llamacpp:"):
			return EngineLlamaCpp
		}
	}
	return ""
}

// maxSlotsBody bounds a /slots answer read (a slot's entry is a few
// kilobytes with its sampling parameters and last prompt).
const maxSlotsBody = 4 << 20

// Slots reads a llama.cpp replica's GET /slots: its slot count and the
// context of one slot, in tokens. It is an error when the replica answers
// no slot (the endpoint is off: --no-slots).
func Slots(ctx context.Context, get func(ctx context.Context, url string) (io.ReadCloser, error), base string) (n, nCtx int, err error) {
	url := strings.TrimSuffix(base, "/") + "/slots"
	body, err := get(ctx, url)
	if err != nil {
		return 0, 0, err
	}
	defer body.Close()
	var slots []struct {
		NCtx int `json:"n_ctx"`
	}
	if err := json.NewDecoder(io.LimitReader(body, maxSlotsBody)).Decode(&slots); err != nil {
		return 0, 0, fmt.Errorf("slots %s: %w", url, err)
	}
	if len(slots) == 0 || len(slots) > 1<<16 {
		return 0, 0, fmt.Errorf("slots %s: %d slots", url, len(slots))
	}
	for _, s := range slots {
		nCtx = max(nCtx, min(max(s.NCtx, 0), 1<<30))
	}
	return len(slots), nCtx, nil
}
