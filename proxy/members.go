package proxy

import (
	"errors"
	"fmt"
	"net/url"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvrouter/kvrouter/fleet"
)

// DefaultMaxBackends is Config.MaxBackends' zero value's floor: a router
// started with n backends takes up to max(n, DefaultMaxBackends) at once.
const DefaultMaxBackends = 64

// backend is one replica as the data plane reaches it; immutable.
type backend struct {
	cfg Backend
	url *url.URL
}

// backendSet is the replicas by slot, the fleet's snapshot index:
// entry i is the backend fleet slot i was last given. It is published
// whole on every change so that the request path reads it without a
// lock. A removed backend stays in its slot until a new one takes it,
// which the fleet allows only once the removed one's requests have all
// finished: an index a request holds always names the backend it was
// sent to.
type backendSet struct {
	mu  sync.Mutex // serialises membership changes (add, drain, remove); guards owner
	cur atomic.Pointer[[]*backend]
	// owner is, per backend URL, the source that added it (SourceConfig
	// for those given at start): SetBackends of a source changes only its
	// own.
	owner map[string]string
	// apply serialises SetBackends.
	apply sync.Mutex
}

// owners returns a copy of the owner map.
func (s *backendSet) owners() map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]string, len(s.owner))
	for k, v := range s.owner {
		out[k] = v
	}
	return out
}

// list returns the backends by slot; do not modify it.
func (s *backendSet) list() []*backend {
	if p := s.cur.Load(); p != nil {
		return *p
	}
	return nil
}

// at returns slot i's backend, or an empty one for a slot never filled.
func (s *backendSet) at(i int) *backend {
	if l := s.list(); i >= 0 && i < len(l) {
		return l[i]
	}
	return &backend{url: &url.URL{}}
}

// setLocked publishes b in slot i; mu is held.
func (s *backendSet) setLocked(i int, b *backend) {
	l := slices.Clone(s.list())
	for len(l) <= i {
		l = append(l, &backend{url: &url.URL{}})
	}
	l[i] = b
	s.cur.Store(&l)
}

// newBackend validates b (as Config.Validate does a backend) and parses
// its URL.
func newBackend(b Backend) (*backend, error) {
	if err := checkURL(b.URL); err != nil {
		return nil, fmt.Errorf("backend %q: %w", b.URL, err)
	}
	u, err := url.Parse(b.URL)
	if err != nil {
		return nil, fmt.Errorf("backend %q: %w", b.URL, err)
	}
	return &backend{cfg: b, url: u}, nil
}

// Membership errors, for errors.Is.
var (
	// ErrBackendExists: the URL is a backend already.
	ErrBackendExists = errors.New("backend exists")
	// ErrNoBackend: the URL is not a backend.
	ErrNoBackend = errors.New("no such backend")
	// ErrFleetFull: every slot is taken (Config.MaxBackends).
	ErrFleetFull = errors.New("fleet full")
)

// memberMetrics counts membership changes.
type memberMetrics struct {
	changes *prometheus.CounterVec // op, source, result
}

func newMemberMetrics(reg prometheus.Registerer) (*memberMetrics, error) {
	m := &memberMetrics{changes: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvrouter_backend_changes_total",
		Help: "Backend membership changes (op: add, drain, undrain, remove) by source (admin, config, discover, shared: another router's admin change) and result (ok, error).",
	}, []string{"op", "source", "result"})}
	if err := reg.Register(m.changes); err != nil {
		return nil, err
	}
	return m, nil
}

// Sources of a membership change, as logs and metrics name them (and
// SourceShared, shared.go).
const (
	SourceAdmin    = "admin"
	SourceConfig   = "config"
	SourceDiscover = "discover"
)

// changed logs and counts one membership change.
func (rt *Router) changed(op, source, id string, err error, args ...any) {
	result := "ok"
	if err != nil {
		result = "error"
	}
	if rt.mm != nil {
		rt.mm.changes.WithLabelValues(op, source, result).Inc()
	}
	args = append([]any{"op", op, "source", source, "backend", id}, args...)
	if err != nil {
		rt.log.Warn("backend change refused", append(args, "err", err)...)
		return
	}
	rt.log.Info("backend changed", args...)
	if source == SourceAdmin {
		rt.shareMember(op, id) // the other routers, and this one's restart (shared.go)
	}
}

// AddBackend adds a replica while the router runs: it is scraped and
// probed from now on and gets requests at once (healthy until its probes
// say otherwise, as at start). In precise mode its KV events are followed
// when it has a kv= endpoint (precisemembers.go), else it is tracked
// approximately. source
// names who asked (SourceAdmin, ...) for the log and metrics.
func (rt *Router) AddBackend(b Backend, source string) error {
	err := rt.addBackend(b, source)
	rt.changed("add", source, b.URL, err, "models", b.Models, "kv", b.KV, "role", b.Role.String())
	return err
}

func (rt *Router) addBackend(b Backend, source string) error {
	be, err := newBackend(b)
	if err != nil {
		return err
	}
	set := &rt.st.bes
	set.mu.Lock()
	defer set.mu.Unlock()
	fl := rt.st.fleet
	// Added draining: no request picks its slot before the slot names it.
	err = fl.AddReplica(fleet.Replica{ID: b.URL, Models: b.Models, Role: b.Role, MaxNumSeqs: b.MaxNumSeqs, Draining: true})
	switch {
	case err != nil && fl.At(b.URL) >= 0:
		return fmt.Errorf("backend %q: %w", b.URL, ErrBackendExists)
	case errors.Is(err, fleet.ErrFull):
		return fmt.Errorf("backend %q: %w (max-backends %d; removed backends with requests in flight keep their slot)", b.URL, ErrFleetFull, rt.st.maxBackends)
	case err != nil:
		return err
	}
	i := fl.At(b.URL)
	set.setLocked(i, be)
	set.own(b.URL, source)
	rt.st.health.Add(b.URL)
	rt.st.scraper.Add(b.URL)
	if p := rt.st.feed; p != nil {
		if err := p.add(i, b); err != nil {
			rt.log.Warn("added backend tracked approximately", "backend", b.URL, "err", err)
		}
	}
	return fl.Undrain(b.URL)
}

// DrainBackend stops new requests to a replica and lets those in flight
// finish; it stays scraped and probed, and listed, until removed.
func (rt *Router) DrainBackend(id, source string) error {
	err := rt.st.fleet.Drain(id)
	if errors.Is(err, fleet.ErrUnknownReplica) {
		err = fmt.Errorf("backend %q: %w", id, ErrNoBackend)
	}
	rt.changed("drain", source, id, err, "in_flight", rt.st.fleet.InFlight(id))
	return err
}

// UndrainBackend returns a draining replica to service.
func (rt *Router) UndrainBackend(id, source string) error {
	err := rt.st.fleet.Undrain(id)
	if errors.Is(err, fleet.ErrUnknownReplica) {
		err = fmt.Errorf("backend %q: %w", id, ErrNoBackend)
	}
	rt.changed("undrain", source, id, err)
	return err
}

// RemoveBackend takes a replica out at once: no new request goes to it,
// its scrape and probe loops stop (and, in precise mode, its KV-event
// stream), its residency entries and sessions are dropped. Its requests
// in flight are not cut: they finish on it (listed as "removed" until
// then), like a drain's. It returns their number.
func (rt *Router) RemoveBackend(id, source string) (inFlight int, err error) {
	inFlight, err = rt.removeBackend(id)
	rt.changed("remove", source, id, err, "in_flight", inFlight)
	return inFlight, err
}

func (rt *Router) removeBackend(id string) (int, error) {
	set := &rt.st.bes
	set.mu.Lock()
	defer set.mu.Unlock()
	i := rt.st.fleet.At(id)
	n, err := rt.st.fleet.RemoveReplica(id)
	if err != nil {
		return 0, fmt.Errorf("backend %q: %w", id, ErrNoBackend)
	}
	delete(set.owner, id)
	rt.st.health.Remove(id)
	rt.st.scraper.Remove(id)
	if p := rt.st.feed; p != nil {
		p.stop(i)
	}
	return n, nil
}

// BackendState is one backend as GET /admin/v1/backends lists it.
type BackendState struct {
	// URL, KV and Models are as configured (Models: declared, or listed
	// by the replica when none were declared).
	URL    string   `json:"url"`
	KV     string   `json:"kv,omitempty"`
	Models []string `json:"models"`
	// Role is its part in a disaggregated fleet: "prefill", "decode" or
	// "both".
	Role string `json:"role"`
	// State is "serving", "draining" or "removed" (its requests in
	// flight still finishing).
	State string `json:"state"`
	// Healthy is the health checker's verdict; Ejected says failures
	// keep it out for a while (health ejection).
	Healthy bool `json:"healthy"`
	Ejected bool `json:"ejected"`
	// InFlight is the router's requests sent to it and not finished.
	InFlight int `json:"in_flight"`
	// Slot is its index in the fleet's snapshot order.
	Slot int `json:"slot"`
}

// Backends returns every backend with its state, in slot order.
func (rt *Router) Backends() []BackendState {
	bes := rt.st.bes.list()
	var out []BackendState
	for _, m := range rt.st.fleet.Members() {
		b := BackendState{URL: m.ID, State: m.State, Healthy: m.Healthy, InFlight: m.InFlight, Slot: m.Index, Models: []string{}}
		if m.Index < len(bes) {
			b.KV, b.Role = bes[m.Index].cfg.KV, bes[m.Index].cfg.Role.String()
		}
		if m.State == fleet.StateRemoved && m.Index < len(bes) {
			b.Models = append(b.Models, bes[m.Index].cfg.Models...) // the fleet forgot them
		} else if ms, _ := rt.st.fleet.Models(m.ID); len(ms) > 0 {
			for _, x := range ms {
				b.Models = append(b.Models, x.ID)
			}
		}
		if hs, ok := rt.st.health.Status(m.ID); ok {
			b.Ejected = !hs.Healthy && hs.Until.After(rt.now())
		}
		out = append(out, b)
	}
	return out
}

// SetBackends makes the backends source added (SourceConfig: also those
// given at start) the list want: those not in it are removed (their
// streams finish, see RemoveBackend), new ones added, and one of source's
// whose options (kv, replay, models, role) changed is removed and added again.
// A wanted URL that another source added (the admin API, say) is left as
// it is and becomes source's too. It returns the errors of the changes
// that failed; the others are applied.
func (rt *Router) SetBackends(want []Backend, source string) error {
	set := &rt.st.bes
	set.apply.Lock()
	defer set.apply.Unlock()
	owners := set.owners()
	wanted := map[string]bool{}
	var errs []error
	for _, b := range want {
		wanted[b.URL] = true
		owner, ok := owners[b.URL]
		i := rt.st.fleet.At(b.URL)
		switch {
		case ok && i >= 0 && sameBackend(set.at(i).cfg, b):
			if owner != source {
				set.mu.Lock()
				set.own(b.URL, source)
				set.mu.Unlock()
			}
			continue
		case ok && i >= 0 && owner != source:
			continue // another source's, configured otherwise: theirs to change
		case ok && i >= 0:
			if _, err := rt.RemoveBackend(b.URL, source); err != nil {
				errs = append(errs, err)
				continue
			}
		}
		if err := rt.AddBackend(b, source); err != nil {
			errs = append(errs, err)
		}
	}
	for id, owner := range owners {
		if owner == source && !wanted[id] {
			if _, err := rt.RemoveBackend(id, source); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// own records source as url's owner; mu is held.
func (s *backendSet) own(url, source string) {
	if s.owner == nil {
		s.owner = map[string]string{}
	}
	s.owner[url] = source
}

// sameBackend reports whether a and b are configured alike.
func sameBackend(a, b Backend) bool {
	return a.URL == b.URL && a.KV == b.KV && a.Replay == b.Replay && slices.Equal(a.Models, b.Models) && a.Role == b.Role
}

// maxBackends is MaxBackends with its default.
func (c *Config) maxBackends() int {
	if c.MaxBackends > 0 {
		return c.MaxBackends
	}
	return max(len(c.Backends), DefaultMaxBackends)
}
