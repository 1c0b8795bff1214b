package proxy

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// MaxBodyBytes bounds one request body; a BodyBudget bounds them all
// together. Without it, 200 connections that each send all but the last
// byte of an 8 MiB body and stall hold 1.6 GB between them, and a router
// with little memory is killed. A request whose body would take the
// budget past its bound is answered 503 body_budget_exhausted with
// Retry-After before any of its body is read (a body of unknown length,
// chunked, when the bytes read so far would), and counted.

// Defaults of the budget (Config.MaxBodyBytesTotal zero).
const (
	// budgetMemoryShare is the share of the memory limit a zero
	// MaxBodyBytesTotal gives request bodies: 1/16, so that bodies, their
	// usage-injected copy and the routing buffers stay well within the
	// memory a router has.
	budgetMemoryShare = 16
	// budgetMaxBodies caps the default at this many maximal bodies (256
	// MiB at the default 8 MiB): a prompt is seldom a tenth of the
	// maximum, so it still admits thousands of typical bodies at once.
	budgetMaxBodies = 32
	// budgetRetryAfter is the Retry-After of a 503 past the budget: bodies
	// held are usually read and forwarded within a second.
	budgetRetryAfter = time.Second
)

// codeBodyBudget is the error code of a request refused for the budget.
const codeBodyBudget = "body_budget_exhausted"

// errBodyBudget is a body of unknown length that outgrew the budget
// while it was read.
var errBodyBudget = errors.New("the router holds as many request bodies as it may")

// DefaultBodyBudget is the bound of request bodies held together that a
// zero MaxBodyBytesTotal means: a sixteenth of the memory limit (the
// cgroup's memory.max, else the physical memory), at most 32 times
// maxBody, at least maxBody.
func DefaultBodyBudget(maxBody int64) int64 {
	b := budgetMaxBodies * maxBody
	if mem := memoryLimit(); mem > 0 {
		b = min(b, mem/budgetMemoryShare)
	}
	return max(b, maxBody)
}

// memoryLimit returns the memory the process may use: the cgroup v2
// limit when one is set, else MemTotal of /proc/meminfo; 0 when neither
// can be read.
func memoryLimit() int64 {
	var mem int64
	if f, err := os.Open("/proc/meminfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if rest, ok := strings.CutPrefix(sc.Text(), "MemTotal:"); ok {
				kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
				mem = kb << 10
			}
		}
		f.Close()
	}
	if b, err := os.ReadFile("/sys/fs/cgroup/memory.max"); err == nil {
		if n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err == nil && n > 0 && (mem == 0 || n < mem) {
			mem = n
		}
	}
	return mem
}

// BodyBudget bounds the bytes of request bodies held in memory at once,
// over every request of a router (or an endpoint picker). The zero value
// admits nothing; NewBodyBudget sets the bound.
type BodyBudget struct {
	limit int64
	held  atomic.Int64
	peak  atomic.Int64 // the most held since memory was last handed back
	// freeing is set while a goroutine hands memory back to the system.
	freeing atomic.Bool
	// refused counts the requests refused for the budget.
	refused atomic.Int64
}

// NewBodyBudget returns a budget of limit bytes.
func NewBodyBudget(limit int64) *BodyBudget { return &BodyBudget{limit: limit} }

// Limit is the bound, in bytes.
func (b *BodyBudget) Limit() int64 { return b.limit }

// Held is the bytes taken and not given back.
func (b *BodyBudget) Held() int64 { return b.held.Load() }

// Refused is the number of requests refused for the budget so far.
func (b *BodyBudget) Refused() int64 { return b.refused.Load() }

// Take reserves n bytes and reports whether they fit; a request that
// cannot take its body's bytes is refused (counted in Refused).
func (b *BodyBudget) Take(n int64) bool {
	for {
		h := b.held.Load()
		if h+n > b.limit {
			b.refused.Add(1)
			return false
		}
		if b.held.CompareAndSwap(h, h+n) {
			for p := b.peak.Load(); h+n > p && !b.peak.CompareAndSwap(p, h+n); p = b.peak.Load() {
			}
			return true
		}
	}
}

// Give returns n bytes Take reserved. When the bodies held fall to none
// after they had taken more than a quarter of the bound (an attack, or a
// burst of large prompts), the memory they used is handed back to the
// system at once rather than at the garbage collector's leisure: a heap
// grown to the bound would otherwise stay in use for minutes.
func (b *BodyBudget) Give(n int64) {
	if n == 0 {
		return
	}
	if b.held.Add(-n) != 0 || b.peak.Load() <= b.limit/4 || !b.freeing.CompareAndSwap(false, true) {
		return
	}
	b.peak.Store(0)
	go func() {
		defer b.freeing.Store(false)
		debug.FreeOSMemory()
	}()
}

// budgetReader reads a body of unknown length, taking from the budget
// ahead of each read the room it reads into, doubling what it holds as
// the buffer that receives the bytes doubles (readGrowing).
type budgetReader struct {
	r    io.Reader
	b    *BodyBudget
	held *int64 // the call's bytes taken
	read int64
}

// Read implements io.Reader.
func (br *budgetReader) Read(p []byte) (int, error) {
	if need := br.read + int64(len(p)) - *br.held; need > 0 {
		more := max(need, *br.held)
		if !br.b.Take(more) {
			return 0, errBodyBudget
		}
		*br.held += more
	}
	n, err := br.r.Read(p)
	br.read += int64(n)
	return n, err
}

// takeBody reserves r's body in the router's budget before it is read:
// its declared length, or, for a body of unknown length, as it arrives
// (the returned reader). Past the budget it answers 503 with Retry-After
// and returns nil.
func (c *call) takeBody(w http.ResponseWriter, r *http.Request) io.Reader {
	b := c.rt.budget
	if r.ContentLength < 0 {
		return &budgetReader{r: r.Body, b: b, held: &c.bodyHeld}
	}
	if !b.Take(r.ContentLength) {
		c.overBudget(w)
		return nil
	}
	c.bodyHeld = r.ContentLength
	return r.Body
}

// overBudget answers 503 body_budget_exhausted; the connection is closed,
// since the body was not read.
func (c *call) overBudget(w http.ResponseWriter) {
	w.Header().Set("Connection", "close")
	c.status, c.errCode = http.StatusServiceUnavailable, codeBodyBudget
	c.rt.m.errors.WithLabelValues(codeBodyBudget).Inc()
	w.Header().Set("Retry-After", strconv.Itoa(int(budgetRetryAfter/time.Second)))
	writeError(w, http.StatusServiceUnavailable, errUnavailable, codeBodyBudget, BudgetMessage(c.rt.budget))
}

// BudgetMessage is the error message of a request refused for b.
func BudgetMessage(b *BodyBudget) string {
	return fmt.Sprintf("request bodies held would pass their bound of %d bytes (--max-body-bytes-total); retry", b.Limit())
}

// BodyBudget is the router's budget of request bodies, which an endpoint
// picker routing with it shares.
func (rt *Router) BodyBudget() *BodyBudget { return rt.budget }

// newBudget returns the budget of cfg: MaxBodyBytesTotal, or
// DefaultBodyBudget when zero.
func newBudget(cfg *Config) *BodyBudget {
	if cfg.MaxBodyBytesTotal > 0 {
		return NewBodyBudget(cfg.MaxBodyBytesTotal)
	}
	return NewBodyBudget(DefaultBodyBudget(cfg.MaxBodyBytes))
}

// giveBody returns the call's body bytes to the budget.
func (c *call) giveBody() {
	c.rt.budget.Give(c.bodyHeld)
	c.bodyHeld = 0
}
