package report

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/term"
)

// Progress draws a progress bar on a terminal: nothing at all unless the
// output is a terminal, nothing during the first Delay (short runs stay
// quiet), and at most one redraw per Every. Its methods are safe for
// concurrent use and do nothing on a nil *Progress.
type Progress struct {
	// Delay is how long a run goes before the bar appears; zero means 2 s.
	Delay time.Duration
	// Every is the least time between redraws; zero means 100 ms.
	Every time.Duration

	mu    sync.Mutex // mu guards the fields below
	w     io.Writer
	label string
	total int64
	done  int64
	start time.Time
	last  time.Time
	drawn bool
}

// NewProgress returns a bar counting up to total (units of work, e.g.
// requests × policies) labelled label, drawn on f only if f is a terminal;
// otherwise it returns nil, whose methods do nothing.
func NewProgress(f *os.File, label string, total int64) *Progress {
	if f == nil || !term.IsTerminal(int(f.Fd())) {
		return nil
	}
	return newProgress(f, label, total, time.Now())
}

func newProgress(w io.Writer, label string, total int64, now time.Time) *Progress {
	return &Progress{w: w, label: label, total: max(total, 1), start: now}
}

// Add counts n more units done and redraws if it is time to.
func (p *Progress) Add(n int64) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.done += n
	p.drawLocked(time.Now())
}

// SetLabel changes the label (e.g. the policy being run).
func (p *Progress) SetLabel(label string) {
	if p == nil {
		return
	}
	p.mu.Lock()
	p.label = label
	p.mu.Unlock()
}

// Done erases the bar, if it was drawn.
func (p *Progress) Done() {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.drawn {
		fmt.Fprint(p.w, "\r\x1b[2K")
		p.drawn = false
	}
}

// drawLocked redraws the bar at now if the delay and the redraw interval
// have passed.
func (p *Progress) drawLocked(now time.Time) {
	delay, every := p.Delay, p.Every
	if delay <= 0 {
		delay = 2 * time.Second
	}
	if every <= 0 {
		every = 100 * time.Millisecond
	}
	if now.Sub(p.start) < delay || now.Sub(p.last) < every {
		return
	}
	p.last, p.drawn = now, true
	fmt.Fprint(p.w, "\r\x1b[2K"+p.lineLocked(now))
}

// lineLocked renders the bar: label, bar, percentage, counts, elapsed and
// estimated time left.
func (p *Progress) lineLocked(now time.Time) string {
	const width = 30
	f := min(float64(p.done)/float64(p.total), 1)
	fill := int(f * width)
	elapsed := now.Sub(p.start)
	eta := "?"
	if f > 0 {
		eta = (time.Duration(float64(elapsed)/f) - elapsed).Round(time.Second).String()
	}
	return fmt.Sprintf("%s [%s%s] %3.0f%% %d/%d %s, %s left", p.label,
		strings.Repeat("█", fill), strings.Repeat("░", width-fill), 100*f,
		p.done, p.total, elapsed.Round(time.Second), eta)
}
