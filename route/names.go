package route

import (
	"fmt"
	"slices"
)

// constructors maps each policy name (the --policy flag) to a constructor
// with the source's defaults. It is built on each call, never stored: there
// is no global registry.
func constructors() map[string]func() Policy {
	return map[string]func() Policy{
		"round-robin":        func() Policy { return RoundRobin{} },
		"random":             func() Policy { return Random{} },
		"least-loaded":       func() Policy { return LeastLoaded{} },
		"power-of-two":       func() Policy { return PowerOfTwo{} },
		"session-hash":       func() Policy { return SessionHash{} },
		"chwbl":              func() Policy { return CHWBL{} },
		"sglang-cache-aware": func() Policy { return SGLangCacheAware{} },
		"dynamo-kv":          func() Policy { return DynamoKV{} },
		"llm-d":              func() Policy { return LLMD{} },
		"llm-d-predicted":    func() Policy { return NewLLMDPredicted() },
		"aibrix-prefix":      func() Policy { return AIBrixPrefix{} },
		"preble-e2":          func() Policy { return PrebleE2{} },
		"mooncake":           func() Policy { return Mooncake{} },
		"mooncake-global":    func() Policy { return MooncakeGlobal{} },
		"kv-aware":           func() Policy { return KVAware{} },
	}
}

// pdConstructors maps the names of the peers' prefill/decode schedulers
// (PD), which only a disaggregated fleet tells from their base policies,
// to their constructors.
func pdConstructors() map[string]func() Policy {
	return map[string]func() Policy{
		"pd-round-robin": func() Policy { return pdRoundRobin() },
		"llm-d-pd":       func() Policy { return llmdPD() },
		"dynamo-pd":      func() Policy { return dynamoPD() },
	}
}

// Default is the name of the default policy.
const Default = "kv-aware"

// Names lists the policies' names, sorted: every one New accepts but the
// peers' prefill/decode schedulers (PDNames).
func Names() []string { return sortedKeys(constructors()) }

// PDNames lists the names of the peers' prefill/decode schedulers
// (PD), sorted.
func PDNames() []string { return sortedKeys(pdConstructors()) }

func sortedKeys(m map[string]func() Policy) []string {
	names := make([]string, 0, len(m))
	for name := range m {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}

// New returns the named policy with its source's defaults.
func New(name string) (Policy, error) {
	c, ok := constructors()[name]
	if !ok {
		c, ok = pdConstructors()[name]
	}
	if !ok {
		return nil, fmt.Errorf("unknown policy %q (want one of %v, or for a disaggregated fleet %v)", name, Names(), PDNames())
	}
	return c(), nil
}

// NeedsOf returns what p reads: p.Needs() if p is a Needer, else the zero
// Needs (no index, default scrape interval).
func NeedsOf(p Policy) Needs {
	if n, ok := p.(Needer); ok {
		return n.Needs()
	}
	return Needs{}
}
