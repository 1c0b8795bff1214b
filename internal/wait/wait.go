// Package wait is the tests' one way to wait for something that happens
// on another goroutine: poll a condition until it holds, failing the
// test after a timeout long enough for a loaded machine. A test that
// waits for an event or a counter this way does not depend on the
// machine's speed, as a fixed sleep does.
package wait

import (
	"testing"
	"time"
)

// Timeout is how long For waits: long, because a shared CI machine can
// be slow; a condition that holds ends the wait at once.
const Timeout = 15 * time.Second

// interval is the time between two checks of a condition.
const interval = 5 * time.Millisecond

// For waits until cond holds, checking it every few milliseconds, and
// fails t if it does not within Timeout; what names the awaited state in
// the message. It returns how long the wait took.
func For(t testing.TB, what string, cond func() bool) time.Duration {
	t.Helper()
	return Within(t, Timeout, what, cond)
}

// Within is For with the timeout d: for a test whose claim is a bound on
// the time something takes.
func Within(t testing.TB, d time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > d {
			t.Fatalf("timed out waiting for %s (%v)", what, d)
		}
		time.Sleep(interval)
	}
	return time.Since(start)
}
