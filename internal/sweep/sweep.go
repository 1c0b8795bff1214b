// Package sweep sizes the tests' randomised checks: a test runs the
// number of cases that proves its claim on every run (the seeds and
// shapes it must cover), and the full-size sweep only when asked, with
// KVROUTER_FULL_SWEEP=1 (go test ./route -run Pruning with it set), so
// that go test ./... stays minutes on a loaded machine and the
// exhaustive run stays one command away.
package sweep

import (
	"os"
	"testing"
)

// Env is the variable that asks for the full sweeps.
const Env = "KVROUTER_FULL_SWEEP"

// Full reports whether the full sweeps were asked for.
func Full() bool { return os.Getenv(Env) == "1" }

// N is quick cases, or full with Full; t's log says which.
func N(t testing.TB, quick, full int) int {
	t.Helper()
	if Full() {
		t.Logf("%d cases (%s=1)", full, Env)
		return full
	}
	t.Logf("%d of the full sweep's %d cases (%s=1 runs them all)", quick, full, Env)
	return quick
}
