package proxy

import (
	"cmp"
	"context"
	"net/http"
	"net/url"
	"slices"
	"time"

	"github.com/kvrouter/kvrouter/fleet"
	"github.com/kvrouter/kvrouter/route"
	"github.com/kvrouter/kvrouter/scrape"
)

// Pick is one request the router routed for another data plane (the
// endpoint picker, package epp, behind Envoy): the replica it chose and
// the hold on that replica's load. Settle it with Done exactly once.
type Pick struct {
	c    *call
	done bool
}

// Pick routes one request for a data plane that forwards it itself. r
// carries the method, the path and the headers (session header,
// X-Priority, the SLO headers; the API keys are not checked: the data
// plane authenticates); body is the whole request body. A POST to
// /v1/chat/completions or /v1/completions goes through the same steps as
// serveCompletion up to the choice: parse (the same limits), session,
// priority, SLO, admission queue (for as long as r's context lasts), the
// fleet's decision over the replicas in subset (host:port, or a bare
// host for each of its ports; nil: all of them), and the decision record. Any other request gets a
// healthy replica, round robin, as a pass-through does. When no replica
// is chosen, Pick answers w as the HTTP router would (status,
// Retry-After, an OpenAI-style JSON error, counted in
// kvrouter_errors_total) and returns nil.
func (rt *Router) Pick(w http.ResponseWriter, r *http.Request, body []byte, subset []string) *Pick {
	completion := r.Method == http.MethodPost && (r.URL.Path == "/v1/chat/completions" || r.URL.Path == "/v1/completions")
	c := rt.newCall(r, completion)
	if !completion {
		return rt.pickAny(w, c, subset)
	}
	p, err := rt.cfg.BodyLimits.Parse(body)
	if err != nil {
		c.parseError(w, err)
		c.finish(r.Context())
		return nil
	}
	c.prompt = p
	c.sessionOf(r, p)
	var ok bool
	if c.priority, ok = priorityOf(r); !ok {
		c.fail(w, http.StatusBadRequest, errInvalidRequest, "invalid_priority", HeaderPriority+" must be an integer within ±1000")
		c.finish(r.Context())
		return nil
	}
	if !c.setSLO(w, r) {
		c.finish(r.Context())
		return nil
	}
	c.ctx = r.Context()
	c.failed = rt.outside(c.failed[:0], subset)
	if len(c.failed) == len(rt.st.bes.list()) {
		return rt.noneInSubset(w, c)
	}
	routed := c.route(w)    // answers w itself when it routes nowhere
	c.failed = c.failed[:0] // the subset's exclusions are no failures
	if !routed {
		c.finish(r.Context())
		return nil
	}
	c.picked = true
	return &Pick{c: c}
}

// pickAny gives a request that is not a completion a healthy replica in
// subset, round robin.
func (rt *Router) pickAny(w http.ResponseWriter, c *call, subset []string) *Pick {
	out := rt.outside(nil, subset)
	n := len(rt.st.bes.list())
	start := int(rt.st.pickRR.Add(1) % uint64(max(n, 1)))
	for k := range n {
		i := (start + k) % n
		if rt.st.healthy(i) && !contains(out, i) {
			c.replica, c.sent, c.picked = i, rt.now(), true
			return &Pick{c: c}
		}
	}
	return rt.noneInSubset(w, c)
}

// noneInSubset answers 503: no healthy replica among those allowed.
func (rt *Router) noneInSubset(w http.ResponseWriter, c *call) *Pick {
	c.failed = c.failed[:0]
	c.status, c.errCode = http.StatusServiceUnavailable, rt.writeNoReplica(w)
	rt.m.errors.WithLabelValues(c.errCode).Inc()
	c.finish(context.Background())
	return nil
}

// outside appends to dst the replicas not in subset; none when subset is
// nil.
func (rt *Router) outside(dst []int, subset []string) []int {
	if subset == nil {
		return dst
	}
	for i := range rt.st.bes.list() {
		if !inSubset(subset, rt.url(i)) {
			dst = append(dst, i)
		}
	}
	return dst
}

// inSubset reports whether subset names u: its host:port, or its host
// alone (every port of that pod, as GIE's endpoint subset allows).
func inSubset(subset []string, u *url.URL) bool {
	return slices.Contains(subset, u.Host) || slices.Contains(subset, u.Hostname())
}

// Replica returns the chosen replica's base URL.
func (p *Pick) Replica() string { return p.c.rt.name(p.c.replica) }

// ClientHeaders reports whether the client gets the routing headers
// (HeaderReplica, HeaderDecision): Config.ClientHeaders, the data plane
// authenticating its clients itself.
func (p *Pick) ClientHeaders() bool { return p.c.headers }

// Endpoint returns the chosen replica's host:port, as Envoy's
// x-gateway-destination-endpoint wants it.
func (p *Pick) Endpoint() string { return p.c.rt.url(p.c.replica).Host }

// URL returns the chosen replica's parsed base URL.
func (p *Pick) URL() *url.URL { return p.c.rt.url(p.c.replica) }

// ID returns the router's request id ("" for a request that is not a
// completion).
func (p *Pick) ID() string { return p.c.id }

// Summary returns the decision as the X-Kvrouter-Decision header gives
// it ("" for a request that is not a completion).
func (p *Pick) Summary() string {
	if !p.c.routed {
		return ""
	}
	return p.c.summary()
}

// Fallbacks returns up to n replicas besides the chosen one, as
// host:port, in the order a data plane should try them when the chosen
// one cannot be reached (the Gateway API Inference Extension's endpoint
// list: the primary first, then these): the decision's other candidates,
// cheapest first, then the other replicas by index; only healthy ones,
// not draining, in subset (as in Pick; nil: any) and that serve
// the request's model (or whose models are not known yet). Call it
// before Done.
func (p *Pick) Fallbacks(n int, subset []string) []string {
	c, rt := p.c, p.c.rt
	model := ""
	if c.prompt != nil {
		model = c.prompt.Model
	}
	var out []string
	tried := []int{c.replica}
	add := func(i int) {
		if len(out) >= n || slices.Contains(tried, i) {
			return
		}
		tried = append(tried, i)
		host := rt.url(i).Host
		if !rt.st.healthy(i) || rt.st.fleet.Draining(rt.name(i)) || subset != nil && !inSubset(subset, rt.url(i)) || !rt.serves(i, model) {
			return
		}
		out = append(out, host)
	}
	costs := slices.Clone(c.dec.Costs)
	slices.SortStableFunc(costs, func(a, b route.Cost) int { return cmp.Compare(a.Total, b.Total) })
	for _, k := range costs {
		add(k.Replica)
	}
	for i := range rt.st.bes.list() {
		add(i)
	}
	return out
}

// serves reports whether replica i serves model, or might (its models
// are not known yet); any replica serves "".
func (rt *Router) serves(i int, model string) bool {
	if model == "" {
		return true
	}
	ms, known := rt.st.fleet.Models(rt.name(i))
	return !known || slices.ContainsFunc(ms, func(m scrape.Model) bool { return m.ID == model })
}

// Served records the endpoint (host:port) the data plane reports served
// the request (GIE's x-gateway-destination-endpoint-served) in the
// decision record. Another than the chosen replica's means the data plane
// fell back: the chosen replica is recorded among the request's failed
// ones. The load stays accounted to the chosen replica.
func (p *Pick) Served(endpoint string) {
	c := p.c
	if endpoint == "" || c.served != "" {
		return
	}
	c.served = endpoint
	if endpoint != p.Endpoint() && !slices.Contains(c.failed, c.replica) {
		c.failed = append(c.failed, c.replica)
	}
	if c.rec != 0 {
		c.record()
	}
}

// PredictedCached returns the prompt tokens the policy predicted cached
// on the chosen replica.
func (p *Pick) PredictedCached() int { return p.c.dec.Matched }

// Respond records the upstream's response status (its response headers
// arrived).
func (p *Pick) Respond(status int) { p.c.status = status }

// FirstByte records that the response's first body bytes arrived at at:
// for a successful completion, prefill is over (fleet.Ticket.FirstToken).
func (p *Pick) FirstByte(at time.Time) {
	c := p.c
	if c.ttft == 0 {
		c.ttft = at.Sub(c.start)
	}
	c.firstByte(at)
}

// Done settles the request as the HTTP router's end of a request does:
// the replica's load is released, passive health fed, the metrics and the
// decision record completed. complete says the response reached its end
// (else the request counts as canceled: not the replica's fault); u is the
// engine's usage, fields −1 when unknown. Later calls do nothing.
func (p *Pick) Done(complete bool, u fleet.Usage) {
	if p == nil || p.done {
		return
	}
	p.done = true
	ctx := context.Background()
	if !complete {
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		ctx = cctx
	}
	p.c.usage = u
	p.c.finish(ctx)
}
