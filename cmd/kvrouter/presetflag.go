package main

import (
	"flag"
	"fmt"

	"github.com/kvrouter/kvrouter/engine"
)

// presetFileFlag registers --preset-file: a preset file of the user's own
// (engine.LoadPreset; kvrouter calibrate writes one), read and checked
// when the flag is parsed, whose path then stands in *preset for the
// built-in name (engine.Preset reads it again).
func presetFileFlag(fs *flag.FlagSet, preset *string) {
	fs.Func("preset-file", "engine preset of your own: a YAML file of the engine's shape and rates, such as kvrouter calibrate writes (keys in docs/emulator.md#presets-of-your-own); replaces --preset", func(path string) error {
		if !engine.IsPresetFile(path) {
			return fmt.Errorf("%s: want a .yaml or .yml file", path)
		}
		if _, err := engine.LoadPreset(path); err != nil {
			return err
		}
		*preset = path
		return nil
	})
}
