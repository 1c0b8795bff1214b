package main

import (
	"slices"
	"testing"
)

// TestEnvWarnings: a KVROUTER_* variable kvrouter does not read is warned
// about, with the nearest known name when one is close; known ones and
// other variables are not.
func TestEnvWarnings(t *testing.T) {
	known := knownEnv()
	for _, k := range []string{"KVROUTER_BACKEND", "KVROUTER_CONFIG", "KVROUTER_SCRAPE_INTERVAL", "KVROUTER_QWEN3_DIR"} {
		if !slices.Contains(known, k) {
			t.Errorf("knownEnv lacks %s", k)
		}
	}
	cases := []struct {
		env  string
		want []string
	}{
		{"KVROUTER_SCRAPE_INTERVL=250ms", []string{"unknown environment variable KVROUTER_SCRAPE_INTERVL is ignored (did you mean KVROUTER_SCRAPE_INTERVAL?)"}},
		{"KVROUTER_BACKENDS=http://a:1", []string{"unknown environment variable KVROUTER_BACKENDS is ignored (did you mean KVROUTER_BACKEND?)"}},
		{"KVROUTER_LOG_LVL=debug", []string{"unknown environment variable KVROUTER_LOG_LVL is ignored (did you mean KVROUTER_LOG_LEVEL?)"}},
		{"KVROUTER_POLICY=round-robin", nil},
		{"KVROUTER_POLICY", nil},
		{"HOME=/root", nil},
		{"KVROUTER_XYZZY=1", []string{"unknown environment variable KVROUTER_XYZZY is ignored (each serve or epp flag --name is KVROUTER_NAME, dashes as underscores: see kvrouter serve -h, kvrouter epp -h)"}},
	}
	for _, c := range cases {
		got := envWarnings([]string{c.env}, known)
		if !slices.Equal(got, c.want) {
			t.Errorf("%s: got %q, want %q", c.env, got, c.want)
		}
	}
}

// TestClosest: the suggestion is the unique nearest name within the
// distance allowed.
func TestClosest(t *testing.T) {
	names := []string{"policy", "preset", "listen", "log-level", "retries"}
	cases := []struct{ s, want string }{
		{"polcy", "policy"},
		{"polici", "policy"},
		{"prset", "preset"},
		{"log-lvl", "log-level"},
		{"lsten", "listen"},
		{"backend", ""},
		{"p", ""},
	}
	for _, c := range cases {
		if got := closest(c.s, names); got != c.want {
			t.Errorf("closest(%q): got %q, want %q", c.s, got, c.want)
		}
	}
	if d := editDistance("kitten", "sitting"); d != 3 {
		t.Errorf("editDistance(kitten, sitting): got %d, want 3", d)
	}
}
