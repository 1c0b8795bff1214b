package proxy

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvrouter/kvrouter/engine"
	"github.com/kvrouter/kvrouter/route"
)

// KV transfer on the wire. When Config.KVTransfer is on and a decision
// orders a transfer (route.Decision.Transfer.Blocks > 0), the body sent to
// the chosen replica gains vLLM's kv_transfer_params naming the source
// replica, as a P/D proxy names the prefill instance to a NixlConnector
// decode instance:
//
//	"kv_transfer_params": {"do_remote_prefill": true, "do_remote_decode": false,
//	  "remote_engine_id": "<source URL>", "remote_request_id": "<request id>",
//	  "remote_host": "<source host>", "remote_port": <source port>,
//	  "remote_block_ids": [], "remote_num_tokens": <tokens>}
//
// remote_block_ids is empty, since the router does not know the source's
// engine block ids: the replica imports the prompt's leading blocks the
// source holds, at most remote_num_tokens tokens of them (a field of
// kvrouter's emulator, package emulator; see README). A request whose body
// already carries kv_transfer_params is forwarded as it is. A retry on
// another replica, and a stream's continuation, drop the params.

// transferMetrics count the transfers the router orders.
type transferMetrics struct {
	count, bytes *prometheus.CounterVec // from, to
	// perToken is the KV bytes of one token (the preset's).
	perToken int64
}

func newTransferMetrics(reg prometheus.Registerer, preset string) (*transferMetrics, error) {
	ec, err := engine.Preset(preset)
	if err != nil {
		return nil, err
	}
	m := &transferMetrics{
		count: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_kv_transfers_total",
			Help: "KV transfers ordered (--kv-transfer): requests forwarded with kv_transfer_params to import their prefix from a peer, by source and destination replica.",
		}, []string{"from", "to"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_kv_transfer_bytes_total",
			Help: "KV bytes of the transfers ordered: tokens × the preset's KV bytes per token, by source and destination replica.",
		}, []string{"from", "to"}),
		perToken: int64(ec.KVBytesPerToken),
	}
	for _, c := range []prometheus.Collector{m.count, m.bytes} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// paramsKey is the field as it appears in a body that has it.
var paramsKey = []byte(`"kv_transfer_params"`)

// withTransfer returns body as the call's replica gets it: with
// kv_transfer_params when the decision orders a transfer (and
// Config.KVTransfer is on), counted; body itself otherwise.
func (c *call) withTransfer(body []byte) []byte {
	rt, t := c.rt, c.dec.Transfer
	if !rt.cfg.KVTransfer || t.Blocks <= 0 || t.From < 0 || t.From >= len(rt.st.bes.list()) || t.From == c.replica {
		return body
	}
	if bytes.Contains(body, paramsKey) {
		rt.log.Debug("kv transfer not ordered: the request has its own kv_transfer_params", "id", c.id)
		return body
	}
	i := bytes.IndexByte(body, '{')
	if i < 0 {
		return body
	}
	bs := c.sc.Snapshot.BlockSize
	if bs <= 0 {
		bs = 16
	}
	tokens := t.Blocks * bs
	if c.freq.Tokens > 0 {
		tokens = min(tokens, c.freq.Tokens)
	}
	src := rt.url(t.From)
	p, _ := json.Marshal(engine.TransferParams{
		DoRemotePrefill: true, RemoteEngineID: rt.name(t.From), RemoteRequestID: c.id,
		RemoteHost: src.Hostname(), RemotePort: portOf(src.Scheme, src.Port()),
		RemoteBlockIDs: json.RawMessage("[]"), RemoteNumTokens: tokens, // the source's block ids are unknown
	})
	b := append(c.xbody[:0], body[:i+1]...)
	b = append(b, `"kv_transfer_params":`...)
	b = append(b, p...)
	if rest := bytes.TrimLeft(body[i+1:], " \t\r\n"); len(rest) > 0 && rest[0] != '}' {
		b = append(b, ',')
	}
	b = append(b, body[i+1:]...)
	c.xbody, c.plain, c.xfer, c.xferTokens = b, body, t, tokens
	from, to := rt.name(t.From), rt.name(c.replica)
	rt.xm.count.WithLabelValues(from, to).Inc()
	rt.xm.bytes.WithLabelValues(from, to).Add(float64(int64(tokens) * rt.xm.perToken))
	c.record()
	return b
}

// portOf is a URL's port, or its scheme's default.
func portOf(scheme, port string) int {
	if n, err := strconv.Atoi(port); err == nil {
		return n
	}
	if strings.EqualFold(scheme, "https") {
		return 443
	}
	return 80
}

// dropTransfer makes req, a retry on another replica, carry the body
// without the transfer's params: the source was picked for the replica
// that failed.
func (c *call) dropTransfer(req *http.Request) {
	plain := c.untransferred()
	if plain == nil {
		return
	}
	if c.rec != 0 {
		c.record() // the retry's decision, without the transfer
	}
	req.Body = io.NopCloser(bytes.NewReader(plain))
	req.ContentLength = int64(len(plain))
	req.Header.Set("Content-Length", strconv.Itoa(len(plain)))
	req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(plain)), nil }
}

// untransferred forgets the call's transfer and returns the body without
// its params; nil when the call ordered none.
func (c *call) untransferred() []byte {
	if c.plain == nil {
		return nil
	}
	c.xfer, c.xferTokens = route.Transfer{}, 0
	return c.plain
}

// appendTransfer appends the X-Kvrouter-Decision part of the call's
// transfer, if any: "; transfer=from <replica> <predicted>ms".
func (c *call) appendTransfer(b []byte) []byte {
	if c.xfer.Blocks <= 0 {
		return b
	}
	b = append(b, "; transfer=from "...)
	b = append(b, c.rt.name(c.xfer.From)...)
	b = append(b, ' ')
	b = strconv.AppendFloat(b, ms(c.xfer.Time), 'f', 3, 64)
	return append(b, "ms"...)
}
