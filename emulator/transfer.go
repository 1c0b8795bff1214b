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

	"github.com/kvrouter/kvrouter/engine"
	"github.com/kvrouter/kvrouter/route"
)

// The decode leg of prefill/decode disaggregation, after vLLM's
// NixlConnector (nixl_connector.py, get_num_new_matched_tokens and
// update_state_after_alloc, vLLM commit 002a105). The proxy sends the
// client's request with the kv_transfer_params the prefill worker's
// response carried (prefill.go): do_remote_prefill, remote_block_ids,
// remote_request_id, remote_host and remote_port. The engine reads the
// blocks from the prefill worker's side channel (sidechannel.go) at
// remote_host:remote_port, at most the prompt's full blocks but the one
// holding its last token (recomputed for its logits: the engine model
// computes whole blocks, where vLLM reads that block too and recomputes
// only the token), checks that the
// hashes it gets are its own prompt's leading blocks, and admits the
// request with them arriving over its inbound link no earlier than the
// source sent them (engine.Request.RemoteBlocks, RemoteSent): its TTFT is
// the transfer the links imply plus the prefill of the rest. The tokens
// read count in usage.prompt_tokens_details.cached_tokens and in
// vllm:external_prefix_cache_hits_total, as vLLM counts a connector's.
//
// An empty or null remote_block_ids means nothing to read: the prompt is
// computed. A source that cannot be reached, refuses, holds nothing for
// the request (its hold expired, or it was read) or answers nonsense
// costs the request nothing but the recompute: it is served, counted in
// emulator_kv_transfers_total by outcome and in
// vllm:nixl_num_failed_transfers_total, and logged.

// transferTimeout bounds a destination's whole exchange with the source
// (connect, request, answer), in wall time.
const transferTimeout = 2 * time.Second

// maxSentIn bounds the send delay a source may announce: a longer one is
// an invalid answer.
const maxSentIn = time.Hour

// Transfer outcomes, the values of emulator_kv_transfers_total's outcome
// label.
const (
	outcomeReceived    = "received"    // every block asked for is read
	outcomePartial     = "partial"     // only the leading part: the rest is recomputed
	outcomeNotHeld     = "not_held"    // the source holds nothing for the request: recompute
	outcomeMismatch    = "mismatch"    // the blocks are not the prompt's: recompute
	outcomeUnreachable = "unreachable" // no answer from the source: recompute
	outcomeRefused     = "refused"     // the source answered an error or nonsense: recompute
	outcomeInvalid     = "invalid"     // the params name no source or no valid ids: recompute
)

// failedOutcomes are those vllm:nixl_num_failed_transfers_total counts: a
// read tried and failed (invalid params start none).
var failedOutcomes = map[string]bool{outcomeNotHeld: true, outcomeMismatch: true, outcomeUnreachable: true, outcomeRefused: true}

// remoteBlockIDs reads remote_block_ids: a list of ids, or a list per
// KV-cache group of which the first is read; null or empty is none. More
// than maxBlocks ids, or an id that is not one, is an error.
func remoteBlockIDs(raw json.RawMessage, maxBlocks int) ([]int32, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var flat []int64
	if err := json.Unmarshal(raw, &flat); err != nil {
		var groups [][]int64
		if json.Unmarshal(raw, &groups) != nil {
			return nil, fmt.Errorf("remote_block_ids: want a list of block ids: %w", err)
		}
		if len(groups) > 0 {
			flat = groups[0]
		}
	}
	if len(flat) > maxBlocks {
		return nil, fmt.Errorf("remote_block_ids: %d ids, more than the %d blocks of the longest prompt", len(flat), maxBlocks)
	}
	ids := make([]int32, len(flat))
	for i, id := range flat {
		if id < 0 || id > 1<<31-1 {
			return nil, fmt.Errorf("remote_block_ids[%d]: %d is not a block id", i, id)
		}
		ids[i] = int32(id)
	}
	return ids, nil
}

// importBlocks carries out j's do_remote_prefill before f is submitted: it
// reads the source's blocks and, for those that are the prompt's, sets f's
// RemoteBlocks, RemoteSent (as a delay from remoteAt, which the engine
// loop turns into its own clock) and remoteAt. Any failure leaves f to
// recompute; it is counted and logged, never the client's error.
func (s *Server) importBlocks(ctx context.Context, j *job, f *flight) {
	p := j.kv
	if p == nil || !p.DoRemotePrefill {
		return
	}
	if s.cfg.KVRole == route.RolePrefill {
		s.ignored(j, "do_remote_prefill")
		return
	}
	ids, err := remoteBlockIDs(p.RemoteBlockIDs, s.maxBlocks())
	if err != nil {
		s.transferFailed(j, p, outcomeInvalid, err)
		return
	}
	want := min(len(ids), len(f.req.Hashes), (len(j.tokens)-1)/s.ecfg.BlockSize)
	if want <= 0 {
		return // nothing to read
	}
	if p.RemoteHost == "" || p.RemotePort <= 0 || p.RemotePort > 65535 || p.RemoteRequestID == "" {
		s.transferFailed(j, p, outcomeInvalid, errors.New("kv_transfer_params needs remote_host, remote_port and remote_request_id"))
		return
	}
	ans, outcome, err := s.askSource(ctx, p, ids[:want])
	if ctx.Err() != nil {
		return // the client went away: nothing to import for
	}
	if err != nil {
		s.transferFailed(j, p, outcome, err)
		return
	}
	got := 0
	for got < len(ans.Hashes) && ans.Hashes[got] == f.req.Hashes[got] {
		got++
	}
	switch {
	case got == 0:
		s.transferFailed(j, p, outcomeMismatch, errors.New("the source's blocks are not the prompt's"))
		return
	case got < want:
		s.tm.outcomes.WithLabelValues(outcomePartial).Inc()
		s.log.Info("kv transfer: partial read", "request", j.id, "source", p.RemoteEngineID, "blocks", got, "asked", want)
	default:
		s.tm.outcomes.WithLabelValues(outcomeReceived).Inc()
	}
	sentIn := time.Duration(ans.SentInNS)
	s.tm.received.Add(float64(got))
	s.tm.observe(sentIn, int64(got)*s.ecfg.BlockBytes())
	f.req.RemoteBlocks, f.req.RemoteSent, f.remoteAt = got, sentIn, time.Now()
}

// askSource reads ids of the request p names from its side channel and
// checks the answer: at most one hash per id, sent within maxSentIn. On
// failure it returns the outcome to count.
func (s *Server) askSource(ctx context.Context, p *engine.TransferParams, ids []int32) (*readAnswer, string, error) {
	ctx, cancel := context.WithTimeout(ctx, transferTimeout)
	defer cancel()
	asked := make([]int64, len(ids))
	for i, id := range ids {
		asked[i] = int64(id)
	}
	body, _ := json.Marshal(readAsk{RequestID: p.RemoteRequestID, BlockIDs: asked})
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
	limit := int64(1<<10 + len(p.RemoteRequestID) + 24*len(ids))
	raw, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	switch {
	case err != nil:
		return nil, outcomeUnreachable, err
	case resp.StatusCode == http.StatusNotFound:
		return nil, outcomeNotHeld, fmt.Errorf("source answered %s: %.200s", resp.Status, raw)
	case resp.StatusCode != http.StatusOK:
		return nil, outcomeRefused, fmt.Errorf("source answered %s: %.200s", resp.Status, raw)
	case int64(len(raw)) > limit:
		return nil, outcomeRefused, fmt.Errorf("source answer exceeds %d bytes", limit)
	}
	var ans readAnswer
	if err := json.Unmarshal(raw, &ans); err != nil {
		return nil, outcomeRefused, fmt.Errorf("source answer: %w", err)
	}
	if len(ans.Hashes) > len(ids) || ans.SentInNS < 0 || ans.SentInNS > int64(maxSentIn) {
		return nil, outcomeRefused, fmt.Errorf("source answer: %d blocks of %d, sent in %v", len(ans.Hashes), len(ids), time.Duration(ans.SentInNS))
	}
	return &ans, "", nil
}

// transferFailed counts and logs a read that falls back to recompute.
func (s *Server) transferFailed(j *job, p *engine.TransferParams, outcome string, err error) {
	s.tm.outcomes.WithLabelValues(outcome).Inc()
	if failedOutcomes[outcome] && s.tm.failed != nil {
		s.tm.failed.Inc()
	}
	s.log.Warn("kv transfer failed, recomputing", "request", j.id, "outcome", outcome,
		"source", p.RemoteEngineID, "remote_request", p.RemoteRequestID, "host", p.RemoteHost, "port", p.RemotePort, "err", err)
}

// remoteSent turns f's RemoteSent, a delay from f.remoteAt, into the
// engine time at which the source has sent the blocks.
func (l *loop) remoteSent(f *flight) {
	if f.req.RemoteBlocks > 0 {
		at := time.Duration(float64(f.remoteAt.Sub(l.start)) / l.s.scale)
		f.req.RemoteSent += max(at, 0)
	}
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
