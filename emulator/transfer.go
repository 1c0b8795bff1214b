package emulator

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvrouter/kvrouter/engine"
	"github.com/kvrouter/kvrouter/prefix"
)

// KV transfer between emulated replicas, after vLLM's NixlConnector.
//
// A request whose body carries kv_transfer_params with do_remote_prefill
// imports its prompt's leading KV blocks from a peer instead of computing
// them. In vLLM the decode instance's connector reads them over RDMA from
// the instance at remote_host:remote_port (its NIXL side channel), which
// named its block ids in remote_block_ids. Here the destination asks the
// source emulator over HTTP (POST TransferPath on the source's API
// address): the source's engine loop checks which of the blocks its GPU
// cache still holds (engine.Holds), reserves its outbound link for them
// (engine.Send) and answers with their hashes and when they will have
// been sent, as a duration from now (the two engine clocks differ). The
// destination then adds the request with RemoteBlocks and RemoteSent, and
// its engine waits the time the interconnect bandwidth implies. A source
// that cannot be reached, refuses, or no longer holds the blocks costs the
// request nothing but the recompute: it is served, counted in
// emulator_kv_transfers_total by outcome, and logged.

// TransferPath is the side-channel endpoint a source emulator serves for
// peers that import its KV blocks.
const TransferPath = "/kv_transfer/blocks"

// transferTimeout bounds a destination's whole exchange with the source
// (connect, request, answer), in wall time.
const transferTimeout = 2 * time.Second

// maxSentIn bounds the send delay a source may announce: a longer one is
// an invalid answer.
const maxSentIn = time.Hour

// Transfer outcomes, the values of emulator_kv_transfers_total's outcome
// label.
const (
	outcomeReceived    = "received"    // every block asked for is imported
	outcomePartial     = "partial"     // the source held only the leading part
	outcomeEvicted     = "evicted"     // the source held none: recompute
	outcomeUnreachable = "unreachable" // no answer from the source: recompute
	outcomeRefused     = "refused"     // the source answered an error or nonsense
	outcomeInvalid     = "invalid"     // the params name no source: recompute
)

// blockCount is how many blocks p.RemoteBlockIDs names; 0 for none (or a
// value that is not a list of ids).
func blockCount(p *engine.TransferParams) int {
	raw := bytes.TrimSpace(p.RemoteBlockIDs)
	if len(raw) == 0 || string(raw) == "null" {
		return 0
	}
	var flat []int64
	if json.Unmarshal(raw, &flat) == nil {
		return len(flat)
	}
	var groups [][]int64
	if json.Unmarshal(raw, &groups) == nil && len(groups) > 0 {
		return len(groups[0])
	}
	return 0
}

// transferAsk is the body of POST TransferPath.
type transferAsk struct {
	// RequestID is the destination's request, for the source's log.
	RequestID string `json:"request_id"`
	// Hashes are the chained hashes of the leading blocks wanted.
	Hashes []prefix.Hash `json:"hashes"`
}

// transferAnswer is the source's answer.
type transferAnswer struct {
	// Hashes are the leading blocks of those asked for that the source
	// holds and sends; empty when it holds none.
	Hashes []prefix.Hash `json:"hashes"`
	// SentInNS is when the last of them leaves the source's link, in
	// engine nanoseconds from the answer: its outbound link is shared
	// with the other transfers it serves.
	SentInNS int64 `json:"sent_in_ns"`
}

// sendOrder asks the engine loop to send the leading blocks of hashes it
// holds.
type sendOrder struct {
	hashes []prefix.Hash
	reply  chan sendReply // capacity 1
}

type sendReply struct {
	blocks int
	sentIn time.Duration
}

// send answers o from the engine goroutine: the blocks held, reserved on
// the outbound link at now.
func (l *loop) send(o *sendOrder) {
	l.t = max(l.t, l.now())
	n := l.s.eng.Holds(o.hashes)
	var in time.Duration
	if n > 0 {
		in = l.s.eng.Send(l.t, n) - l.t
	}
	st := l.s.eng.Stats()
	l.s.stats.Store(&st)
	o.reply <- sendReply{blocks: n, sentIn: in}
}

// serveTransfer is the source's side channel: POST TransferPath with a
// transferAsk. It answers 400 for a malformed ask, 413 for one larger
// than a prompt of the model length could need, 503 when the engine is
// not running.
func (s *Server) serveTransfer(w http.ResponseWriter, r *http.Request) {
	maxBlocks := s.ecfg.MaxModelLen/s.ecfg.BlockSize + 1
	limit := int64(1<<10 + 24*maxBlocks)
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		var mb *http.MaxBytesError
		if errors.As(err, &mb) {
			writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("transfer ask exceeds %d bytes", limit))
			return
		}
		writeError(w, http.StatusBadRequest, "read body: "+err.Error())
		return
	}
	var ask transferAsk
	if err := json.Unmarshal(body, &ask); err != nil {
		writeError(w, http.StatusBadRequest, "invalid JSON body: "+err.Error())
		return
	}
	if len(ask.Hashes) == 0 || len(ask.Hashes) > maxBlocks {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("hashes: want 1..%d, got %d", maxBlocks, len(ask.Hashes)))
		return
	}
	o := &sendOrder{hashes: ask.Hashes, reply: make(chan sendReply, 1)}
	select {
	case s.sends <- o:
	case <-s.stopped:
		writeError(w, http.StatusServiceUnavailable, "the engine is not running")
		return
	case <-r.Context().Done():
		return
	}
	rep := <-o.reply
	s.tm.sent.Add(float64(rep.blocks))
	writeJSON(w, transferAnswer{Hashes: ask.Hashes[:rep.blocks], SentInNS: int64(rep.sentIn)})
}

// importBlocks carries out j's kv_transfer_params before f is submitted:
// with do_remote_prefill it asks the source for the prompt's leading
// blocks and, for those it sends, sets f's RemoteBlocks, RemoteSent (as a
// delay from remoteAt, which the engine loop turns into its own clock)
// and remoteAt. Any failure leaves f to recompute; it is counted and
// logged, never the client's error.
func (s *Server) importBlocks(ctx context.Context, j *job, f *flight) {
	p := j.kv
	if p == nil || !p.DoRemotePrefill {
		return
	}
	bs := s.ecfg.BlockSize
	want := min(len(f.req.Hashes), (len(j.tokens)-1)/bs)
	if n := blockCount(p); n > 0 {
		want = min(want, n)
	}
	if p.RemoteNumTokens > 0 {
		want = min(want, p.RemoteNumTokens/bs)
	}
	if want <= 0 {
		return
	}
	if p.RemoteHost == "" || p.RemotePort <= 0 || p.RemotePort > 65535 {
		s.transferFailed(j, p, outcomeInvalid, errors.New("kv_transfer_params needs remote_host and remote_port"))
		return
	}
	ans, outcome, err := s.askSource(ctx, j.id, p, f.req.Hashes[:want])
	if ctx.Err() != nil {
		return // the client went away: nothing to import for
	}
	if err != nil {
		s.transferFailed(j, p, outcome, err)
		return
	}
	got := len(ans.Hashes)
	switch {
	case got == 0:
		s.transferFailed(j, p, outcomeEvicted, errors.New("the source holds none of the blocks"))
		return
	case got < want:
		s.tm.outcomes.WithLabelValues(outcomePartial).Inc()
		s.log.Info("kv transfer: partial import", "request", j.id, "source", p.RemoteEngineID, "blocks", got, "asked", want)
	default:
		s.tm.outcomes.WithLabelValues(outcomeReceived).Inc()
	}
	s.tm.received.Add(float64(got))
	f.req.RemoteBlocks, f.req.RemoteSent, f.remoteAt = got, time.Duration(ans.SentInNS), time.Now()
}

// askSource posts the ask to the source named by p and checks its answer:
// a prefix of hashes, sent within maxSentIn. On failure it returns the
// outcome to count.
func (s *Server) askSource(ctx context.Context, id string, p *engine.TransferParams, hashes []prefix.Hash) (*transferAnswer, string, error) {
	ctx, cancel := context.WithTimeout(ctx, transferTimeout)
	defer cancel()
	body, _ := json.Marshal(transferAsk{RequestID: id, Hashes: hashes})
	u := "http://" + net.JoinHostPort(p.RemoteHost, strconv.Itoa(p.RemotePort)) + TransferPath
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(body))
	if err != nil {
		return nil, outcomeInvalid, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.peers.Do(req)
	if err != nil {
		return nil, outcomeUnreachable, err
	}
	defer resp.Body.Close()
	limit := int64(1<<10 + 24*len(hashes))
	raw, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	switch {
	case err != nil:
		return nil, outcomeUnreachable, err
	case resp.StatusCode != http.StatusOK:
		return nil, outcomeRefused, fmt.Errorf("source answered %s: %.200s", resp.Status, raw)
	case int64(len(raw)) > limit:
		return nil, outcomeRefused, fmt.Errorf("source answer exceeds %d bytes", limit)
	}
	var ans transferAnswer
	if err := json.Unmarshal(raw, &ans); err != nil {
		return nil, outcomeRefused, fmt.Errorf("source answer: %w", err)
	}
	if len(ans.Hashes) > len(hashes) || ans.SentInNS < 0 || ans.SentInNS > int64(maxSentIn) {
		return nil, outcomeRefused, fmt.Errorf("source answer: %d blocks of %d, sent in %v", len(ans.Hashes), len(hashes), time.Duration(ans.SentInNS))
	}
	for i, h := range ans.Hashes {
		if h != hashes[i] {
			return nil, outcomeRefused, fmt.Errorf("source answer: block %d is not the one asked for", i)
		}
	}
	return &ans, "", nil
}

// transferFailed counts and logs an import that falls back to recompute.
func (s *Server) transferFailed(j *job, p *engine.TransferParams, outcome string, err error) {
	s.tm.outcomes.WithLabelValues(outcome).Inc()
	s.log.Warn("kv transfer failed, recomputing", "request", j.id, "outcome", outcome,
		"source", p.RemoteEngineID, "host", p.RemoteHost, "port", p.RemotePort, "err", err)
}

// remoteSent turns f's RemoteSent, a delay from f.remoteAt, into the
// engine time at which the source has sent the blocks.
func (l *loop) remoteSent(f *flight) {
	if f.req.RemoteBlocks > 0 {
		at := time.Duration(float64(f.remoteAt.Sub(l.start)) / l.s.scale)
		f.req.RemoteSent += max(at, 0)
	}
}

// transferMetrics count the KV transfers a replica takes part in.
type transferMetrics struct {
	outcomes       *prometheus.CounterVec // outcome
	received, sent prometheus.Counter     // blocks
}

func newTransferMetrics(reg prometheus.Registerer) *transferMetrics {
	m := &transferMetrics{
		outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "emulator_kv_transfers_total",
			Help: "KV imports asked for by requests with kv_transfer_params do_remote_prefill, by outcome: received, partial (the source held only the leading part), evicted (it held none), unreachable, refused, invalid; all but received and partial recompute the prompt.",
		}, []string{"outcome"}),
		received: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "emulator_kv_transfer_received_blocks_total",
			Help: "KV blocks imported from peers.",
		}),
		sent: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "emulator_kv_transfer_sent_blocks_total",
			Help: "KV blocks sent to peers that imported them.",
		}),
	}
	for _, o := range []string{outcomeReceived, outcomePartial, outcomeEvicted, outcomeUnreachable, outcomeRefused, outcomeInvalid} {
		m.outcomes.WithLabelValues(o)
	}
	reg.MustRegister(m.outcomes, m.received, m.sent)
	return m
}

// peerClient is the destination's client for sources: no proxy, bounded
// connects and answers.
func peerClient() *http.Client {
	return &http.Client{
		Timeout: transferTimeout,
		Transport: &http.Transport{
			Proxy:                 nil,
			DialContext:           (&net.Dialer{Timeout: transferTimeout}).DialContext,
			MaxIdleConnsPerHost:   16,
			IdleConnTimeout:       30 * time.Second,
			ResponseHeaderTimeout: transferTimeout,
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}
