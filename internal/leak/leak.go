// Package leak checks that a package's tests leave no goroutine running:
// every goroutine a test starts, its servers' and connections' included,
// must be joined or ended by the time the tests return. It is the
// stdlib-only core of go.uber.org/goleak: TestMain calls Main.
package leak

import (
	"bytes"
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

// grace is how long goroutines that are ending (a closed connection's
// reader, a canceled loop) get to return before they count as leaked.
const grace = 10 * time.Second

// Main runs the tests of m and exits with their code, or with 1 when
// they passed but left goroutines running, which it lists.
func Main(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if left := wait(grace); len(left) > 0 {
			fmt.Fprintf(os.Stderr, "leak: %d goroutines still running after the tests:\n\n%s\n", len(left), strings.Join(left, "\n\n"))
			code = 1
		}
	}
	os.Exit(code)
}

// wait returns the stacks of the goroutines still running after up to d,
// none when every one ended sooner.
func wait(d time.Duration) []string {
	deadline := time.Now().Add(d)
	for {
		left := others()
		if len(left) == 0 || time.Now().After(deadline) {
			return left
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// others returns the stacks of the goroutines but this one and those
// of the runtime and the testing package.
func others() []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var out []string
	for i, g := range bytes.Split(buf, []byte("\n\n")) {
		if i == 0 || ignored(string(g)) { // the first is this goroutine
			continue
		}
		out = append(out, string(g))
	}
	return out
}

// ignored reports whether the goroutine of stack g belongs to the runtime
// or the test binary rather than to the code under test, or is one that
// a dependency leaks: zmq4's PUB socket starts a writer goroutine that
// its Close never stops (go-zeromq/zmq4 v0.17.0, socket.Close leaves
// sck.w open), one per socket.
func ignored(g string) bool {
	for _, s := range []string{
		"testing.(*M).", "testing.tRunner", "testing.runTests",
		"os/signal.signal_recv", "os/signal.loop",
		"runtime.ensureSigM",
		"github.com/go-zeromq/zmq4.(*pubMWriter).run",
	} {
		if strings.Contains(g, s) {
			return true
		}
	}
	return false
}
