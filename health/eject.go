package health

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/kvrouter/kvrouter/window"
)

// Ejection kinds: the signal that ejected a replica.
const (
	// KindProbe: Failures consecutive failed probes.
	KindProbe = "probe"
	// KindPassive: failed requests (in a row, or a failure rate in Window).
	KindPassive = "passive"
	// KindConnect: the proxy could not connect (Eject).
	KindConnect = "connect"
)

// Ejection is one ejection, as OnEject reports it.
type Ejection struct {
	// Kind is KindProbe, KindPassive or KindConnect.
	Kind string
	// For is how long the replica stays out at least.
	For time.Duration
	// InARow counts the replica's ejections in a row, 1 for the first.
	InARow int
	// Reason is the transition's reason.
	Reason string
}

// maxModelsBody caps the /v1/models listing read for the model check.
const maxModelsBody = 1 << 20

// Eject takes id out of service at once, for its ejection time, with the
// reason (e.g. "connect: connection refused"): a replica that refuses
// connections answers fast and so looks idle, and would draw traffic until
// passive checks added up. Ejecting an unhealthy or unknown id does
// nothing.
// A replica in panic mode's set (ejected by probes alone) is ejected
// again, for the refused connection, and leaves the set.
func (c *Checker) Eject(id, reason string) {
	t := c.target(id)
	if t == nil {
		return
	}
	defer c.reconcile()
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.healthy.Load() || t.kind == KindProbe {
		c.ejectLocked(t, KindConnect, reason, time.Now())
	}
}

// ejectLocked takes t out of service for EjectBase doubled per ejection in
// a row (reset after EjectMax in service), at most EjectMax; t.mu is held.
func (c *Checker) ejectLocked(t *target, kind, reason string, now time.Time) {
	if !t.admitted.IsZero() && now.Sub(t.admitted) >= c.ejectMax() {
		t.ejections = 0
	}
	t.ejections++
	d := c.ejectMax()
	if shift := t.ejections - 1; shift < 30 && c.ejectBase()<<shift < d {
		d = c.ejectBase() << shift
	}
	t.until = now.Add(d)
	t.kind = kind
	reason = fmt.Sprintf("%s; out for %v", reason, d)
	c.setLocked(t, false, reason)
	if c.OnEject != nil {
		c.OnEject(t.id, Ejection{Kind: kind, For: d, InARow: t.ejections, Reason: reason})
	}
}

// admitLocked returns t to service with a fresh start (old failures are
// forgiven); t.mu is held.
func (c *Checker) admitLocked(t *target, reason string) {
	t.window = window.Sums{}
	t.consec, t.held, t.overruled = 0, "", false
	t.admitted = time.Now()
	c.setLocked(t, true, reason)
}

// succeeded applies a successful probe of t (answer says which), listing
// being the probe's body when it probed /v1/models (nil otherwise). A
// healthy replica learns the models it serves once; an ejected one whose
// ejection time is over is re-admitted if it lists the expected models.
func (c *Checker) succeeded(ctx context.Context, t *target, answer string, listing []byte) {
	defer c.reconcile()
	t.mu.Lock()
	t.probeFails, t.overruled = 0, false
	want := c.expectLocked(t)
	healthy := t.healthy.Load()
	learn := healthy && !t.learned && len(want) == 0
	due := !healthy && !time.Now().Before(t.until)
	t.mu.Unlock()
	if !learn && !due {
		return
	}
	var listed []string
	var err error
	if learn || len(want) > 0 {
		listed, err = c.listModels(ctx, t.id, listing)
		if ctx.Err() != nil {
			return
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if learn {
		t.models, t.learned = listed, err == nil || noRoute(err) || isParse(err)
		return
	}
	switch miss := missing(listed, want); {
	case err != nil:
		c.holdLocked(t, fmt.Sprintf("%s, but %v: cannot check it serves %q", answer, err, want))
	case len(miss) > 0:
		c.holdLocked(t, fmt.Sprintf("%s, but %s lists no %q: another service?", answer, joinURL(t.id, modelsPath), miss))
	default:
		c.admitLocked(t, answer)
	}
}

// expectLocked returns the models t must list to be re-admitted.
func (c *Checker) expectLocked(t *target) []string {
	if c.Models != nil {
		if m := c.Models(t.id); len(m) > 0 {
			return m
		}
	}
	return t.models
}

// holdLocked keeps t out for reason, telling OnHold once per reason.
func (c *Checker) holdLocked(t *target, reason string) {
	if reason == t.held {
		return
	}
	t.held = reason
	if c.OnHold != nil {
		c.OnHold(t.id, reason)
	}
}

// parseError is a /v1/models listing that is not an OpenAI model list.
type parseError struct{ err error }

func (e *parseError) Error() string { return "models listing: " + e.err.Error() }

func isParse(err error) bool {
	_, ok := err.(*parseError)
	return ok
}

// listModels returns the model ids id lists at /v1/models: parsed from
// listing when the probe already read it, else fetched.
func (c *Checker) listModels(ctx context.Context, id string, listing []byte) ([]string, error) {
	if listing == nil {
		url := joinURL(id, modelsPath)
		_, body, err := c.get(ctx, url, maxModelsBody)
		if err != nil {
			return nil, err
		}
		listing = body
	}
	var l struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.Unmarshal(listing, &l); err != nil {
		return nil, &parseError{err}
	}
	ids := make([]string, len(l.Data))
	for i, m := range l.Data {
		ids[i] = m.ID
	}
	return ids, nil
}

// missing returns the models of want that listed lacks.
func missing(listed, want []string) []string {
	var out []string
	for _, m := range want {
		if !slices.Contains(listed, m) {
			out = append(out, m)
		}
	}
	return out
}

// get GETs url once, bounded by Timeout, and returns the answer ("probe
// URL: status 200 OK") and up to limit bytes of the body; an answer other
// than 2xx is a *statusError.
func (c *Checker) get(ctx context.Context, url string, limit int64) (string, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", nil, fmt.Errorf("probe %s: %w", url, err)
	}
	client := c.Client
	if client == nil {
		client = http.DefaultClient
	}
	resp, err := client.Do(req)
	if err != nil {
		return "", nil, fmt.Errorf("probe %s: %w", url, err)
	}
	defer resp.Body.Close()
	body, rerr := io.ReadAll(io.LimitReader(resp.Body, limit))
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return "", nil, &statusError{url: url, code: resp.StatusCode, status: resp.Status}
	}
	if rerr != nil {
		return "", nil, fmt.Errorf("probe %s: reading body: %w", url, rerr)
	}
	return fmt.Sprintf("probe %s: status %s", url, resp.Status), body, nil
}

// isModels reports whether url is a /v1/models probe.
func isModels(url string) bool { return strings.HasSuffix(url, modelsPath) }
