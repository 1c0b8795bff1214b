package proxy

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvrouter/kvrouter/engine"
	"github.com/kvrouter/kvrouter/fleet"
	"github.com/kvrouter/kvrouter/route"
	"github.com/kvrouter/kvrouter/view"
)

// Prefill/decode disaggregation and KV transfers, on the wire as vLLM's
// NixlConnector runs them (vLLM's tests/v1/kv_connector/nixl_integration/
// toy_proxy_server.py and vllm/distributed/kv_transfer/kv_connector/v1/
// nixl_connector.py). A decision orders a transfer with
// route.Decision.Transfer{From, Blocks}: replica From computes the
// prompt and hands its KV to the decision's Replica, which decodes. From
// is a prefill worker (a backend of role prefill) or, with
// Config.KVTransfer, a replica that holds the prompt's prefix. The router
// runs the request as two legs:
//
//  1. The prefill leg (prefill.go): a POST of the request's path to From
//     with the body changed as vLLM's proxy changes it:
//     "kv_transfer_params": {"do_remote_decode": true, "do_remote_prefill":
//     false, "remote_engine_id": null, "remote_block_ids": null,
//     "remote_host": null, "remote_port": null}, "stream": false,
//     "max_tokens": 1, "max_completion_tokens": 1 when the body has it, and
//     neither stream_options nor min_tokens nor min_completion_tokens; the
//     header X-Request-Id is the router's request id. From answers a
//     completion whose top-level kv_transfer_params (what its connector's
//     request_finished returned: remote_engine_id, remote_block_ids,
//     remote_host, remote_port, tp_size, remote_request_id) name the blocks
//     it now holds for a reader.
//  2. The decode leg: the body as the client sent it (with the router's
//     include_usage, if it added one) plus "kv_transfer_params", the
//     object From returned, verbatim, through the reverse proxy to the
//     decision's Replica, which reads the blocks and streams the answer
//     as any other.
//
// A body that carries its own kv_transfer_params is forwarded as it is,
// without legs. Failures:
//
//   - a prefill leg that fails, times out (Config.LegTimeout, within
//     Config.RequestTimeout), answers without params or with params that
//     fail their check (legparams.go) is counted, and the
//     request decided again without that worker: the new decision may
//     name another prefill worker (a new leg; at most 1 + Config.Retries
//     legs a request) or no transfer, and the decode replica computes the
//     prompt itself;
//   - a decode replica that fails before the first token is retried as
//     any other (transport.go); when the new decision orders a transfer,
//     a new prefill leg runs for it, else the retry carries no params;
//   - a prefill leg runs to its end when the client goes away meanwhile
//     (legContext); a client gone once it answered, before the decode leg
//     was sent, leaves blocks held on the prefill worker: the router sends
//     the decode leg all the same, detached, to read and so free them
//     (release). Once the decode leg was sent, the decode worker frees
//     them itself when it aborts the request (see release).
//
// Every path releases the fleet's tickets: the decode replica's (finish,
// or at a new decision), each leg's on its worker (prefill), a release's.

// Prefill-leg outcomes, the values of the outcome label of
// kvrouter_kv_transfer_legs_total{leg="prefill"} and of the fallback
// reasons.
const (
	legOK       = "ok"
	legError    = "error"     // a transport error or a status other than 200
	legTimeout  = "timeout"   // no answer within the TTFT or request timeout
	legNoParams = "no_params" // an answer without usable kv_transfer_params
	// legBadParams: kv_transfer_params the router does not forward (past
	// its size or depth, not the connector's schema, or a remote_host
	// other than the worker's; legparams.go).
	legBadParams = "bad_params"
)

// Legs, the values of kvrouter_kv_transfer_legs_total's leg label.
const (
	legPrefill = "prefill"
	legDecode  = "decode"
)

// Fallback reasons beyond a failed prefill leg's outcome: the decode
// replica failed before its first token, or the request ran out of legs.
const (
	fallbackDecodeFailed = "decode_failed"
	fallbackExhausted    = "legs_exhausted"
)

// How held blocks were released, the values of
// kvrouter_kv_transfer_releases_total's how label.
const (
	releaseSent    = "sent"    // the detached decode leg read them
	releaseFailed  = "failed"  // that leg failed: the worker's abort timeout frees them
	releaseEngine  = "engine"  // the decode worker had the request: its abort frees them
	releaseTimeout = "timeout" // the decode worker never had the request, or refused it: the abort timeout frees them
)

// Why a decode leg that carried params shows no read, the values of
// kvrouter_kv_transfers_unread_total's why label.
const (
	unreadNotRead = "not_read" // its usage shows nothing cached past its own
	unreadNoUsage = "no_usage" // its answer reported no cached tokens
	unreadFailed  = "failed"   // it failed, or the client left, before its usage
	unreadCut     = "cut"      // continued elsewhere after its first token
)

// transferMetrics count the transfers the router orders and their legs.
type transferMetrics struct {
	count, bytes *prometheus.CounterVec // from, to
	legs         *prometheus.CounterVec // leg, outcome
	fallbacks    *prometheus.CounterVec // reason
	releases     *prometheus.CounterVec // how
	unread       *prometheus.CounterVec // why
	// perToken is the KV bytes of one token (the preset's).
	perToken int64
}

func newTransferMetrics(reg prometheus.Registerer, preset string) (*transferMetrics, error) {
	ec, err := engine.Preset(preset)
	if err != nil {
		return nil, err
	}
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
	}
	m := &transferMetrics{
		count: counter("kvrouter_kv_transfers_total",
			"KV transfers run: a prefill leg on the source answered with kv_transfer_params, the decode leg to the destination carried them, and the destination's usage shows it read blocks (cached tokens past those the index saw it hold), by source and destination replica.",
			"from", "to"),
		bytes: counter("kvrouter_kv_transfer_bytes_total",
			"KV bytes of the transfers run: the tokens the destination read (its cached tokens past those the index saw it hold, within the blocks the source named: remote_block_ids × its block size, within the prompt) × the preset's KV bytes per token, by source and destination replica.",
			"from", "to"),
		legs: counter("kvrouter_kv_transfer_legs_total",
			"Legs of disaggregated requests by leg (prefill, decode) and outcome: prefill ok, error, timeout (--leg-timeout), no_params (answered without kv_transfer_params), bad_params (params refused: past their size or depth, not the connector's schema, or a remote_host other than the worker's); decode ok, upstream_error, error, canceled (the request's outcome), retried (failed before its first token: decided again), cut (failed after it: continued elsewhere without params).",
			"leg", "outcome"),
		fallbacks: counter("kvrouter_kv_transfer_fallbacks_total",
			"Ordered transfers that did not go as decided, by reason: the prefill leg's error, timeout, no_params or bad_params (the request is decided again without that worker), decode_failed (the decode replica failed before its first token: decided again), legs_exhausted (no legs left: the decode replica computes the prompt).",
			"reason"),
		releases: counter("kvrouter_kv_transfer_releases_total",
			"Prefill legs whose blocks no client reads, by how they are freed: sent (the client went away between the legs: a detached one-token decode leg read them), failed (that leg failed), engine (the client went away before the first token: the decode worker's abort frees them), timeout (the decode worker never had the request, or refused it with a 4xx: the prefill worker's abort timeout will).",
			"how"),
		unread: counter("kvrouter_kv_transfers_unread_total",
			"Decode legs that carried a prefill leg's kv_transfer_params without a read to show for it, by why: not_read (the destination's usage shows no cached tokens past those the index saw it hold: it computed the prompt), no_usage (its answer reported no cached tokens), failed (the decode leg failed or the client left before its usage), cut (continued on another replica after its first token). Every such decode leg counts here or in kvrouter_kv_transfers_total.",
			"why"),
		perToken: int64(ec.KVBytesPerToken),
	}
	for _, c := range []prometheus.Collector{m.count, m.bytes, m.legs, m.fallbacks, m.releases, m.unread} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// legFrom returns the replica the call's decision wants a prefill leg
// from, or -1: none, a holder's import with Config.KVTransfer off, or a
// replica whose leg failed already (a policy may name one that the
// snapshot excluded).
func (c *call) legFrom() int {
	rt, t := c.rt, c.dec.Transfer
	if t.Blocks <= 0 || t.From < 0 || t.From == c.replica || t.From >= len(rt.st.bes.list()) || slices.Contains(c.skip, t.From) {
		return -1
	}
	if !rt.cfg.KVTransfer && rt.st.bes.at(t.From).cfg.Role != route.RolePrefill {
		return -1
	}
	return t.From
}

// disaggregate runs the prefill legs the call's decisions order and
// returns the decode leg's body: plain with the params the last leg
// returned, written into dst, or plain itself when no leg is ordered (or
// none is left, or the client's body has its own kv_transfer_params). A
// failed leg is counted and the request decided again without its
// worker; w answers a new decision that finds no replica (nil in a retry,
// where the retrier answers). When it returns false the call is over: the
// client left, or no replica can take the request.
func (c *call) disaggregate(w http.ResponseWriter, dst, plain []byte) ([]byte, bool) {
	c.plain = plain
	for {
		from := c.legFrom()
		if from < 0 || !c.legBody(plain) {
			return plain, true
		}
		if c.pd.legs > c.rt.cfg.Retries {
			c.fallback(fallbackExhausted, from)
			return plain, true
		}
		params, outcome := c.prefill(from)
		if outcome == legOK {
			b := c.attach(dst, plain, params, from)
			if c.ctx.Err() != nil {
				c.release()
				return nil, false
			}
			return b, true
		}
		if c.ctx.Err() != nil {
			return nil, false // the client left; the failed leg holds nothing
		}
		c.fallback(outcome, from)
		c.skip = append(c.skip, from)
		c.ticket.Done(c.rt.now(), fleet.NoUsage, nil) // not the decode replica's fault
		c.ticket = nil
		if !c.pick(w) {
			return nil, false
		}
	}
}

// fallback counts and logs a transfer from replica from that did not go
// as decided.
func (c *call) fallback(reason string, from int) {
	c.rt.xm.fallbacks.WithLabelValues(reason).Inc()
	c.rt.log.Info("kv transfer fallback", "id", c.id, "reason", reason, "from", c.rt.name(from), "replica", c.rt.name(c.replica))
}

// attach returns plain with "kv_transfer_params": params as its first
// member, appended to dst, and notes the transfer it runs: in the
// decision record and the X-Kvrouter-Decision header (counted when the
// decode leg ends, by what it read: settleDecode).
func (c *call) attach(dst, plain, params []byte, from int) []byte {
	i := bytes.IndexByte(plain, '{')
	b := append(dst, plain[:i+1]...)
	b = append(b, `"kv_transfer_params":`...)
	b = append(b, params...)
	if rest := bytes.TrimLeft(plain[i+1:], " \t\r\n"); len(rest) > 0 && rest[0] != '}' {
		b = append(b, ',')
	}
	b = append(b, plain[i+1:]...)
	pd := c.pd
	pd.xfer, pd.xferTokens, pd.params = c.dec.Transfer, c.transferred(params, from), params
	c.record()
	return b
}

// transferred is the tokens of the blocks params name
// (remote_block_ids, a list of ids or one per KV-cache group) at the
// source's block size, within the prompt tokens the prefill leg's usage
// reported (the last block is partly filled); when they name none, the
// decision's blocks (within the prompt).
func (c *call) transferred(params []byte, from int) int {
	var p struct {
		IDs json.RawMessage `json:"remote_block_ids"`
	}
	json.Unmarshal(params, &p)
	n := 0
	var flat []int64
	var groups [][]int64
	if json.Unmarshal(p.IDs, &flat) == nil {
		n = len(flat)
	} else if json.Unmarshal(p.IDs, &groups) == nil && len(groups) > 0 {
		n = len(groups[0])
	}
	bs := c.rt.st.fleet.Tracker().BlockSize(from)
	if bs <= 0 {
		bs = fleet.DefaultBlockSize
	}
	if n > 0 && c.pd.leg.prompt > 0 {
		return min(n*bs, c.pd.leg.prompt)
	}
	if n > 0 {
		return n * bs
	}
	unit := c.seen().Snapshot.BlockSize
	if unit <= 0 {
		unit = fleet.DefaultBlockSize
	}
	tokens := c.dec.Transfer.Blocks * unit
	if c.freq.Tokens > 0 {
		tokens = min(tokens, c.freq.Tokens)
	}
	return tokens
}

// decodeFailed counts how the blocks a decode leg's params name are freed
// when its attempt failed with err before the first token: by the decode
// worker's abort when the client went away (see release), by the prefill
// worker's abort timeout when the decode worker was never reached.
func (c *call) decodeFailed(req *http.Request, err error) {
	switch {
	case err == nil || c.transfer().Blocks <= 0:
	case req.Context().Err() != nil:
		c.rt.xm.releases.WithLabelValues(releaseEngine).Inc()
	case isDialError(err):
		c.rt.xm.releases.WithLabelValues(releaseTimeout).Inc()
	}
}

// redo makes req, a retry after the decode replica failed before its
// first token, carry the body the new decision wants: with the params of
// a new prefill leg when it orders a transfer, else without any. The
// body is a new slice: the failed attempt's transport may still read the
// old one. It reports false when the call is over (disaggregate).
func (c *call) redo(req *http.Request) bool {
	if c.plain == nil {
		return true
	}
	if x := c.transfer(); x.Blocks > 0 {
		c.fallback(fallbackDecodeFailed, x.From)
		c.rt.xm.legs.WithLabelValues(legDecode, "retried").Inc()
		c.rt.xm.unread.WithLabelValues(unreadFailed).Inc()
	}
	c.dropTransfer()
	body, ok := c.disaggregate(nil, nil, c.plain)
	if !ok {
		return false
	}
	if c.rec != 0 {
		c.record() // the retry's decision
	}
	req.Body = io.NopCloser(bytes.NewReader(body))
	req.ContentLength = int64(len(body))
	req.Header.Set("Content-Length", strconv.Itoa(len(body)))
	req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	return true
}

// untransferred forgets the call's transfer and returns the body without
// its params; nil when the call ordered none. A continuation (another
// replica after the first token) starts from it: the blocks were read.
func (c *call) untransferred() []byte {
	if c.transfer().Blocks <= 0 {
		return nil
	}
	c.rt.xm.legs.WithLabelValues(legDecode, "cut").Inc()
	c.rt.xm.unread.WithLabelValues(unreadCut).Inc()
	c.dropTransfer()
	return c.plain
}

// dropTransfer forgets the transfer the call's body ran, if any.
func (c *call) dropTransfer() {
	if c.pd != nil {
		c.pd.xfer, c.pd.xferTokens, c.pd.params = route.Transfer{}, 0, nil
	}
}

// settleDecode counts the decode leg of a call that ran a transfer, by
// the call's outcome, and the transfer by what the decode worker's usage
// shows it read (readTokens). A decode worker that refused the request (a
// 4xx answer, from its API before its engine saw the request) never read
// the blocks: the prefill worker's abort timeout frees them.
func (c *call) settleDecode() {
	if c.transfer().Blocks <= 0 {
		return
	}
	rt := c.rt
	rt.xm.legs.WithLabelValues(legDecode, c.outcome).Inc()
	if c.status >= 400 && c.status < 500 && c.errCode == "" {
		rt.xm.releases.WithLabelValues(releaseTimeout).Inc()
	}
	read, why := c.readTokens()
	if why != "" {
		rt.xm.unread.WithLabelValues(why).Inc()
		return
	}
	name, to := rt.name(c.transfer().From), rt.name(c.replica)
	rt.xm.count.WithLabelValues(name, to).Inc()
	rt.xm.bytes.WithLabelValues(name, to).Add(float64(int64(read) * rt.xm.perToken))
}

// readTokens is the tokens the decode worker of the call's transfer read,
// as its usage shows them: its cached tokens past those the index saw it
// hold of the prompt (in the engine's tokens), within the tokens
// transferred. Without a read it returns why not (kvrouter_kv_transfers_unread_total).
func (c *call) readTokens() (int, string) {
	u := c.usage
	switch {
	case c.outcome != view.OutcomeOK:
		return 0, unreadFailed
	case u.CachedTokens < 0:
		return 0, unreadNoUsage
	}
	local := 0
	if m := c.seen().Request.Match; c.replica < len(m) {
		local = m[c.replica] * max(c.seen().Snapshot.BlockSize, 1)
		if c.freq.Tokens > 0 && u.PromptTokens > 0 {
			local = local * u.PromptTokens / c.freq.Tokens
		}
	}
	read := u.CachedTokens - local
	if read <= 0 {
		return 0, unreadNotRead
	}
	if x := c.pd.xferTokens; x > 0 {
		read = min(read, x)
	}
	return read, ""
}

// appendTransfer appends the X-Kvrouter-Decision part of the call's
// transfer, if any: "; transfer=from <replica> <predicted>ms".
func (c *call) appendTransfer(b []byte) []byte {
	x := c.transfer()
	if x.Blocks <= 0 {
		return b
	}
	b = append(b, "; transfer=from "...)
	b = append(b, c.rt.name(x.From)...)
	b = append(b, ' ')
	b = strconv.AppendFloat(b, ms(x.Time), 'f', 3, 64)
	return append(b, "ms"...)
}
