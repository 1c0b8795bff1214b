package proxy

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.yaml.in/yaml/v3"

	"github.com/kvrouter/kvrouter/fleet"
	"github.com/kvrouter/kvrouter/route"
	"github.com/kvrouter/kvrouter/view"
)

// Request headers that set a request's own SLO, in whole milliseconds:
// its TTFT bound and its mean time per output token (TPOT, which
// route.SLO.ITL bounds). They are llm-d's x-slo-ttft-ms and
// x-slo-tpot-ms (header names are case-insensitive).
const (
	HeaderSLOTTFT = "X-SLO-TTFT-Ms"
	HeaderSLOTPOT = "X-SLO-TPOT-Ms"
)

// maxSLOMs bounds an SLO header's value: an hour, far above any latency
// target, so that a value past it is a client's mistake.
const maxSLOMs = 3_600_000

// SLO admission modes (SLOs.Admission): what happens to a request whose
// decision predicts it misses its SLO (fleet.Unattainable). The fleet
// decides (fleet.Admission.SLO), as it does in the simulator; the router
// holds or answers the requests it refuses.
const (
	// SLOAdmitRoute routes it anyway, to the replica the policy chose.
	SLOAdmitRoute = fleet.SLORoute
	// SLOAdmitQueue holds it in the router's admission queue (admit.go)
	// until a decision predicts it meets its SLO, or 429 once its TTFT
	// bound (or --queue-timeout) has passed.
	SLOAdmitQueue = fleet.SLOQueue
	// SLOAdmitReject answers 429 with Retry-After at once.
	SLOAdmitReject = fleet.SLOReject
)

// DefaultClass names the class of a request whose SLO is the fleet's own
// (SLOs.TTFT, SLOs.ITL; route.SLO.Class empty), whatever its headers say,
// in metrics' class label, decision records and the access log.
const DefaultClass = "default"

// Bounds of SLOs.Classes: each class is a label value of /metrics.
const (
	maxClasses   = 64
	maxClassName = 32
)

// SLOs are the latency targets requests are routed against
// (route.SLO). A request's is its own headers' (HeaderSLOTTFT,
// HeaderSLOTPOT), each replacing one bound of its API key's class
// (class=NAME), else of the fleet's default. Each is carried into the decision (fleet.Request.SLO), its
// record, the access log, recordings and kvrouter_slo_requests_total.
type SLOs struct {
	// TTFT is the fleet's default bound on the time to first token; zero
	// means none.
	TTFT time.Duration `yaml:"slo-ttft"`
	// ITL is the fleet's default bound on the mean time between output
	// tokens; zero means none.
	ITL time.Duration `yaml:"slo-itl"`
	// Classes are the client classes' SLOs by name, which API keys name
	// (class=NAME in the --api-keys file); empty means none.
	Classes SLOClasses `yaml:"slo-classes"`
	// Admission is what happens to a request no replica is predicted to
	// meet the SLO of (SLOAdmitRoute, SLOAdmitQueue, SLOAdmitReject);
	// empty means route.
	Admission string `yaml:"slo-admission"`
}

// Validate checks the bounds, the classes and the admission mode;
// queueing needs the router's queue (max-wait above zero).
func (s *SLOs) Validate(adm fleet.Admission) error {
	var errs []error
	if s.TTFT < 0 || s.ITL < 0 {
		errs = append(errs, fmt.Errorf("slo-ttft, slo-itl: must not be negative, got %s, %s", s.TTFT, s.ITL))
	}
	if err := (fleet.Admission{MaxWait: adm.MaxWait, SLO: s.Admission}).Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// mode is Admission, or its default.
func (s *SLOs) mode() string {
	if s.Admission == "" {
		return SLOAdmitRoute
	}
	return s.Admission
}

// fleetAdmission is the fleet's admission control: the router's queue
// settings and the SLO admission mode, which the fleet applies in Decide.
func (c *Config) fleetAdmission() fleet.Admission {
	a := c.Admission
	a.SLO = c.SLO.mode()
	return a
}

// SLOClasses are client classes' SLOs by name, each route.SLO's Class its
// name. As a flag, an environment variable or a YAML string:
// "NAME=TTFT/ITL,..." with Go durations, 0 for no bound (e.g.
// "interactive=500ms/50ms,batch=30s/0"); in YAML also a mapping of names
// to "TTFT/ITL".
type SLOClasses map[string]route.SLO

// String is the classes in Set's form, by name.
func (c SLOClasses) String() string {
	names := make([]string, 0, len(c))
	for n := range c {
		names = append(names, n)
	}
	slices.Sort(names)
	for i, n := range names {
		names[i] = n + "=" + c[n].TTFT.String() + "/" + c[n].ITL.String()
	}
	return strings.Join(names, ",")
}

// Set replaces the classes with those of s; an empty s means none.
func (c *SLOClasses) Set(s string) error {
	m := SLOClasses{}
	for f := range strings.SplitSeq(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		name, bounds, ok := strings.Cut(f, "=")
		if !ok {
			return fmt.Errorf("slo class %q: want NAME=TTFT/ITL", f)
		}
		if err := m.add(name, bounds); err != nil {
			return err
		}
	}
	*c = m
	return nil
}

// add adds class name with bounds "TTFT/ITL".
func (c SLOClasses) add(name, bounds string) error {
	switch {
	case !validClassName(name) || name == DefaultClass:
		return fmt.Errorf("slo class %q: want a name of 1 to %d letters, digits, - or _, not %q", name, maxClassName, DefaultClass)
	case len(c) >= maxClasses:
		return fmt.Errorf("slo classes: at most %d", maxClasses)
	}
	if _, dup := c[name]; dup {
		return fmt.Errorf("slo class %q: given twice", name)
	}
	t, i, ok := strings.Cut(bounds, "/")
	ttft, err1 := time.ParseDuration(strings.TrimSpace(t))
	itl, err2 := time.ParseDuration(strings.TrimSpace(i))
	if !ok || err1 != nil || err2 != nil || ttft < 0 || itl < 0 || ttft == 0 && itl == 0 {
		return fmt.Errorf("slo class %s=%q: want TTFT/ITL, non-negative durations, not both 0 (e.g. 500ms/50ms)", name, bounds)
	}
	c[name] = route.SLO{TTFT: ttft, ITL: itl, Class: name}
	return nil
}

// UnmarshalYAML reads Set's string, or a mapping of names to "TTFT/ITL".
func (c *SLOClasses) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.MappingNode {
		var s string
		if err := n.Decode(&s); err != nil {
			return err
		}
		return c.Set(s)
	}
	var kv map[string]string
	if err := n.Decode(&kv); err != nil {
		return err
	}
	m := SLOClasses{}
	for name, bounds := range kv {
		if err := m.add(name, bounds); err != nil {
			return err
		}
	}
	*c = m
	return nil
}

// MarshalYAML writes Set's string.
func (c SLOClasses) MarshalYAML() (any, error) { return c.String(), nil }

// validClassName reports whether s is a class name: 1 to maxClassName
// ASCII letters, digits, - or _.
func validClassName(s string) bool {
	if len(s) == 0 || len(s) > maxClassName {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return false
		}
	}
	return true
}

// checkClasses reports a key whose class=NAME is not one of classes.
func (k *Keys) checkClasses(classes SLOClasses) error {
	for i, c := range k.classes {
		if _, ok := classes[c]; c != "" && !ok {
			return fmt.Errorf("key %s: class %q is not among slo-classes (%q)", k.names[i], c, classes.String())
		}
	}
	return nil
}

// sloState is a call's SLO: what it asked for, what the router did when
// no replica was predicted to meet it, and how the response fared.
type sloState struct {
	// slo is the request's SLO as resolved (setSLO; Class empty for
	// the fleet's default); c.freq.SLO is the
	// same but while the request waits in the queue, when its TTFT is
	// what remains of the bound.
	slo route.SLO
	// sloAction is what the router did with a decision that predicted a
	// miss (Unattainable): routed, queued or rejected; "" none did.
	sloAction string
	// sloOutcome is met, missed_ttft or missed_itl once a streamed
	// response ended ok; "" not judged. itl is its mean inter-token
	// latency (0: fewer than 2 output tokens reported).
	sloOutcome string
	itl        time.Duration
}

// SLO outcomes (sloState.sloOutcome), the outcome label of
// kvrouter_slo_requests_total.
const (
	sloMet        = "met"
	sloMissedTTFT = "missed_ttft"
	sloMissedITL  = "missed_itl"
)

// SLO actions (sloState.sloAction), the action label of
// kvrouter_slo_unattainable_total.
const (
	sloRouted   = "routed"
	sloQueued   = "queued"
	sloRejected = "rejected"
)

// codeSLOHeader is the error code of a bad SLO header; codeSLOUnattainable
// of a 429 for a request no replica was predicted to meet the SLO of.
const (
	codeSLOHeader       = "invalid_slo_header"
	codeSLOUnattainable = "slo_unattainable"
)

// setSLO resolves the request's SLO into the call: the fleet's default,
// replaced by its API key's class when it has one, each bound replaced
// by the request's header when present. A header that is not a whole
// number of milliseconds within 1..maxSLOMs is answered 400 (counted in
// kvrouter_errors_total{code="invalid_slo_header"}).
func (c *call) setSLO(w http.ResponseWriter, r *http.Request) bool {
	s := c.rt.cfg.SLO
	c.slo = route.SLO{TTFT: s.TTFT, ITL: s.ITL}
	if k, _ := r.Context().Value(keyNameKey{}).(keyInfo); k.class != "" {
		c.slo = s.Classes[k.class]
	}
	for _, h := range [...]struct {
		name string
		to   *time.Duration
	}{{HeaderSLOTTFT, &c.slo.TTFT}, {HeaderSLOTPOT, &c.slo.ITL}} {
		v := r.Header.Get(h.name)
		if v == "" {
			continue
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxSLOMs {
			c.fail(w, http.StatusBadRequest, errInvalidRequest, codeSLOHeader,
				fmt.Sprintf("%s must be a whole number of milliseconds within 1..%d, got %q", h.name, maxSLOMs, v[:min(len(v), 32)]))
			return false
		}
		*h.to = time.Duration(n) * time.Millisecond
	}
	return true
}

// class is the call's class as metrics and records name it.
func (c *call) class() string {
	if c.slo.Class == "" {
		return DefaultClass
	}
	return c.slo.Class
}

// routedSLO counts a first decision that the fleet committed although it
// predicts a miss of the request's SLO (--slo-admission route).
func (c *call) routedSLO() {
	if c.ticket != nil && !c.freq.Admitted && fleet.Unattainable(&c.freq, &c.dec) {
		c.sloAction = sloRouted
		c.rt.sm.unattainable.WithLabelValues(c.class(), sloRouted).Inc()
	}
}

// admitSLO acts on a first decision the fleet refused for its predicted
// SLO miss (route.ReasonUnattainable): it answers 429 with Retry-After
// (--slo-admission reject, or a sheddable request), or queues it. It
// returns the time of the decision that took the request, and false when
// it answered the client (or the client left).
func (c *call) admitSLO(w http.ResponseWriter) (time.Time, bool) {
	if c.rt.cfg.SLO.mode() == SLOAdmitReject || c.priority < 0 {
		c.sloAction = sloRejected
		c.rt.sm.unattainable.WithLabelValues(c.class(), sloRejected).Inc()
		return time.Time{}, c.rejectSLO(w)
	}
	c.sloAction = sloQueued
	c.rt.sm.unattainable.WithLabelValues(c.class(), sloQueued).Inc()
	t0, ok := c.queue(c.ctx, w, c.priority)
	c.freq.SLO = c.slo
	return t0, ok
}

// rejectSLO answers 429 with Retry-After: the time until the least
// backlogged replica's predicted wait is within the request's TTFT bound.
func (c *call) rejectSLO(w http.ResponseWriter) bool {
	msg := fmt.Sprintf("no replica is predicted to meet the request's SLO (TTFT %s, ITL %s; predicted miss %.2f)",
		c.slo.TTFT, c.slo.ITL, c.dec.Miss)
	return c.tooMany(w, codeSLOUnattainable, msg, c.retryAfter(c.slo.TTFT))
}

// queueTimeout is how long the call may wait in the queue
// (fleet.Admission.Patience).
func (c *call) queueTimeout(a *admission) time.Duration {
	return a.cfg.Patience(c.slo, c.sloAction == sloQueued, c.rt.now().Sub(c.start))
}

// queueExpired answers a request whose time in the queue ran out.
func (c *call) queueExpired(w http.ResponseWriter, a *admission) bool {
	if c.sloAction == sloQueued {
		return c.tooMany(w, codeSLOUnattainable, "no replica was predicted to meet the request's SLO before its TTFT bound (or the queue timeout) passed", c.retryAfter(c.slo.TTFT))
	}
	return c.saturated(w, "queue_timeout", "every replica stayed saturated for "+a.cfg.Timeout().String())
}

// redecideSLO readies a queued call's next decision: its TTFT bound is
// what remains of it (fleet.Remaining).
func (c *call) redecideSLO() {
	if c.sloAction == sloQueued {
		c.freq.SLO = fleet.Remaining(c.slo, c.rt.now().Sub(c.start))
	}
}

// admitted reports whether a queued call's last decision ends its wait: a
// replica took it, no replica is healthy (answered 503 by pick), or,
// queued while the fleet was saturated, the fleet refused it for its SLO
// (pick's admitSLO takes it from there).
func (c *call) admitted() bool {
	switch {
	case c.ticket != nil:
		return true
	case c.dec.Reason == route.ReasonSaturated:
		return false
	case c.dec.Reason == route.ReasonUnattainable:
		return c.sloAction != sloQueued
	}
	return true
}

// judgeSLO measures a finished streamed response against its SLO: its
// TTFT (arrival to first byte, the router's queue included) and its mean
// inter-token latency (first byte to end over the output tokens after
// the first).
func (c *call) judgeSLO() {
	if !c.tapped || !c.tap.SSE || c.outcome != view.OutcomeOK || c.ttft <= 0 {
		return
	}
	if n := c.usage.CompletionTokens; n >= 2 {
		c.itl = c.end.Sub(c.tap.First) / time.Duration(n-1)
	}
	switch s := c.slo; {
	case s.IsZero():
	case s.TTFT > 0 && c.ttft > s.TTFT:
		c.sloOutcome = sloMissedTTFT
	case s.ITL > 0 && c.itl > s.ITL:
		c.sloOutcome = sloMissedITL
	default:
		c.sloOutcome = sloMet
	}
}

// sloMetrics count SLO attainment and the requests no replica was
// predicted to meet the SLO of, by class (DefaultClass or a configured
// one: a bounded set).
type sloMetrics struct {
	requests     *prometheus.CounterVec // class, outcome
	unattainable *prometheus.CounterVec // class, action
}

func newSLOMetrics(reg prometheus.Registerer) (*sloMetrics, error) {
	m := &sloMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_slo_requests_total",
			Help: "Streamed requests with an SLO that ended ok, by class (\"default\": the fleet's SLO) and outcome: met, missed_ttft (time to first token, the router's queue included, above its bound), missed_itl (mean inter-token latency above its bound).",
		}, []string{"class", "outcome"}),
		unattainable: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_slo_unattainable_total",
			Help: "Requests whose decision predicted a miss of their SLO at least as likely as not (no replica predicted to meet it), by class and what --slo-admission did: routed, queued or rejected (429 slo_unattainable).",
		}, []string{"class", "action"}),
	}
	for _, c := range []prometheus.Collector{m.requests, m.unattainable} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// observeSLO counts a judged call in kvrouter_slo_requests_total.
func (rt *Router) observeSLO(c *call) {
	if c.sloOutcome != "" {
		rt.sm.requests.WithLabelValues(c.class(), c.sloOutcome).Inc()
	}
}

// fillSLO writes the call's SLO into its decision record.
func (c *call) fillSLO(rec *view.Decision) {
	if c.slo.IsZero() {
		return
	}
	rec.SLOClass, rec.SLOTTFTMS, rec.SLOITLMS = c.class(), ms(c.slo.TTFT), ms(c.slo.ITL)
	rec.PredictedMiss, rec.SLOAdmission, rec.SLOOutcome, rec.ITLMS = c.dec.Miss, c.sloAction, c.sloOutcome, ms(c.itl)
}

// appendSLO appends the access log's SLO attributes: the class and
// bounds of a request with an SLO, what --slo-admission did, the outcome,
// and the measured mean inter-token latency.
func (c *call) appendSLO(a []slog.Attr) []slog.Attr {
	if c.itl > 0 {
		a = append(a, slog.Float64("itl_ms", roundMS(ms(c.itl))))
	}
	if c.slo.IsZero() {
		return a
	}
	a = append(a, slog.String("slo_class", c.class()), slog.Float64("slo_ttft_ms", ms(c.slo.TTFT)), slog.Float64("slo_itl_ms", ms(c.slo.ITL)))
	if c.sloAction != "" {
		a = append(a, slog.String("slo_admission", c.sloAction))
	}
	if c.sloOutcome != "" {
		a = append(a, slog.String("slo_outcome", c.sloOutcome))
	}
	return a
}
