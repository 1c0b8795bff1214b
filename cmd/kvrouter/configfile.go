package main

import (
	"bytes"
	"fmt"
	"os"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/kvrouter/kvrouter/proxy"
)

// readConfigFile overlays the --config YAML file at path on cfg, as
// proxy.ReadConfigFile does, after checking its top-level keys: an
// unknown one is an error naming it, its line and the nearest real key
// (not the Go type the YAML decoder would name). The keys in own (a
// subcommand's flags beside serve's, epp's) are taken out of the file
// and returned as flag values, name to value, for the caller to set.
func readConfigFile(path string, cfg *proxy.Config, own []string) (map[string]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil || len(doc.Content) != 1 || doc.Content[0].Kind != yaml.MappingNode {
		return nil, proxy.DecodeConfig(path, data, cfg) // its own error, or an empty file
	}
	root := doc.Content[0]
	known := topConfigKeys()
	vals := map[string]string{}
	var blank []int // lines of own keys, removed before the decoder reads the file
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		switch {
		case slices.Contains(own, k.Value):
			if v.Kind != yaml.ScalarNode || v.Line != k.Line || root.Style&yaml.FlowStyle != 0 {
				return nil, fmt.Errorf("config %s: line %d: %s takes one value on its key's line", path, k.Line, k.Value)
			}
			vals[k.Value] = v.Value
			blank = append(blank, k.Line)
		case !slices.Contains(known, k.Value):
			msg := fmt.Sprintf("config %s: line %d: unknown key %q", path, k.Line, k.Value)
			if s := closest(k.Value, append(known, own...)); s != "" {
				msg += fmt.Sprintf(" (did you mean %s?)", s)
			}
			return nil, fmt.Errorf("%s; the keys are the flag names, see docs/configuration.md", msg)
		}
	}
	if len(blank) > 0 {
		lines := bytes.Split(data, []byte("\n"))
		for _, l := range blank {
			lines[l-1] = nil // an empty line keeps the others' numbers in the decoder's errors
		}
		data = bytes.Join(lines, []byte("\n"))
	}
	return vals, proxy.DecodeConfig(path, data, cfg)
}

// topConfigKeys are the top-level keys of the --config file: those of
// configFileKeys before any ".", and "backends".
func topConfigKeys() []string {
	top := []string{"backends"}
	for _, k := range configFileKeys() {
		k, _, _ = strings.Cut(k, ".")
		if !slices.Contains(top, k) {
			top = append(top, k)
		}
	}
	return top
}
