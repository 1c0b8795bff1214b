// Package browser starts a headless Chromium for tests that drive a page
// (the dashboard, the HTML reports) through chromedp, and collects the
// page's console errors. Only tests import it.
package browser

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// Chromium is where Debian's chromium package installs the browser.
const Chromium = "/usr/bin/chromium"

// Console collects a page's console messages. mu guards msgs.
type Console struct {
	mu   sync.Mutex
	msgs []chromedp.ConsoleMessage
}

// Errors returns the console errors and uncaught exceptions seen so far.
func (c *Console) Errors() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, m := range c.msgs {
		if m.Type == chromedp.ConsoleError || m.IsException() {
			out = append(out, m.String()+" at "+m.URL)
		}
	}
	return out
}

// Start starts a headless Chromium of width × height pixels for the
// test's life and returns its context and the console it writes to. It
// skips the test when Chromium is not installed, unless $CI is set (then
// it fails it).
func Start(t testing.TB, width, height int) (context.Context, *Console) {
	t.Helper()
	if _, err := os.Stat(Chromium); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI is set but %s is missing (apt-get install -y chromium chromium-driver): %v", Chromium, err)
		}
		t.Skipf("%s not installed", Chromium)
	}
	dir, err := os.MkdirTemp("", "kvrouter-chromium")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Chromium's children may still write for a moment after it stops.
		for range 50 {
			if os.RemoveAll(dir) == nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(Chromium),
		chromedp.Headless, chromedp.NoSandbox, chromedp.NoFirstRun,
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(dir),
		chromedp.WindowSize(width, height),
	)
	actx, acancel := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() { cancel(); acancel() })
	con := &Console{}
	msgs := chromedp.Console(ctx) // starts the browser
	go func() {
		for m, err := range msgs {
			if err != nil {
				return
			}
			con.mu.Lock()
			con.msgs = append(con.msgs, m)
			con.mu.Unlock()
		}
	}()
	return ctx, con
}

// Run runs a with timeout d and fails the test, naming what, on an error.
func Run[T any](t testing.TB, ctx context.Context, d time.Duration, what string, a chromedp.Action[T]) T {
	t.Helper()
	tctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	v, err := chromedp.Run(tctx, a)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return v
}
