// Package promtool finds Prometheus' promtool for the tests that evaluate
// rules and queries with it (`promtool test rules`).
package promtool

import (
	"os"
	"os/exec"
	"testing"
)

// Path returns promtool's path. It is in Debian's prometheus package,
// which .ci/run installs: under CI=true its absence fails the test,
// elsewhere the test is skipped saying so.
func Path(t testing.TB) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("promtool not found (.ci/run installs Debian's prometheus package)")
		}
		t.Skip("promtool not found: apt-get install prometheus (CI=true makes this a failure)")
	}
	return p
}
