package emulator

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strconv"

	"github.com/kvrouter/kvrouter/engine"
	"github.com/kvrouter/kvrouter/route"
)

// The prefill leg of prefill/decode disaggregation, as vLLM serves it
// (vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py,
// NixlConnectorScheduler.request_finished; the proxy side in
// tests/v1/kv_connector/nixl_integration/toy_proxy_server.py; vLLM commit
// 002a105). The proxy sends the request with
//
//	"kv_transfer_params": {"do_remote_decode": true, "do_remote_prefill": false,
//	  "remote_engine_id": null, "remote_block_ids": null, "remote_host": null, "remote_port": null}
//
// and max_tokens 1, not streaming. The engine computes the prompt (its
// prefix cache counts), samples the token, and when the request finishes
// length-capped it holds the blocks (engine.Request.HoldFor, for
// Config.KVHoldTimeout) and the response carries, at its top level,
//
//	"kv_transfer_params": {"do_remote_prefill": true, "do_remote_decode": false,
//	  "remote_block_ids": [<engine block ids>], "remote_engine_id": "<Config.EngineID>",
//	  "remote_request_id": "<the response's id>", "remote_host": "<side channel host>",
//	  "remote_port": <side channel port>, "tp_size": 1}
//
// which the proxy passes as they are to the decode worker (transfer.go).
// remote_block_ids are the request's computed full prompt blocks, as
// vLLM's connector named them before vllm-project/vllm#21074 (v0.10.0:
// `block_ids if all_full else block_ids[:-1]`): since then vLLM also names
// the partial last block, which the decode worker reads rather than
// recomputes; the engine model moves whole blocks only, so an emulated
// decode worker recomputes that block's tokens. A prompt shorter than a
// block gets an empty list and holds nothing. A request that does not
// finish length-capped (no max_tokens: finish_reason "stop"; or aborted)
// frees its blocks at once and its response has no kv_transfer_params, as
// in vLLM. A streamed prefill leg holds its blocks but, as in vLLM, its
// chunks do not carry the params.

// kvTransferConfig checks and fills cfg's KV-transfer fields.
func kvTransferConfig(cfg *Config) error {
	switch {
	case cfg.KVRole > route.RoleDecode:
		return fmt.Errorf("emulator: kv role %d unknown", cfg.KVRole)
	case cfg.KVHoldTimeout < 0:
		return fmt.Errorf("emulator: negative kv hold timeout %v", cfg.KVHoldTimeout)
	case cfg.KVHoldTimeout == 0:
		cfg.KVHoldTimeout = DefaultKVHoldTimeout
	}
	if cfg.EngineID == "" {
		var b [8]byte
		rand.Read(b[:])
		cfg.EngineID = "emulator-" + hex.EncodeToString(b[:])
	}
	return nil
}

// EngineID is the engine's id in kv_transfer_params (remote_engine_id).
func (s *Server) EngineID() string { return s.cfg.EngineID }

// KVRole is the engine's part in prefill/decode disaggregation.
func (s *Server) KVRole() route.Role { return s.cfg.KVRole }

// prefillLeg decides whether j, a request with kv_transfer_params
// do_remote_decode, holds its blocks for a decode worker: when the
// engine's role serves prefill legs and the request will finish
// length-capped (max_tokens given). It then sets f's hold and j's side
// channel, the address the request came in on.
func (s *Server) prefillLeg(r *http.Request, j *job, f *flight) {
	if j.kv == nil || !j.kv.DoRemoteDecode {
		return
	}
	if s.cfg.KVRole == route.RoleDecode {
		s.ignored(j, "do_remote_decode")
		return
	}
	if !j.explicit {
		return // it finishes with "stop": vLLM frees its blocks at once
	}
	j.hold = true
	f.req.HoldFor = s.cfg.KVHoldTimeout
	j.sideHost, j.sidePort = s.sideChannel(r)
}

// sideChannel is the host and port of the side channel as a peer reaches
// it: the local address r came in on, or Config.SideChannelHost.
func (s *Server) sideChannel(r *http.Request) (string, int) {
	host, port := "", 0
	if a, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok {
		if h, p, err := net.SplitHostPort(a.String()); err == nil {
			host = h
			port, _ = strconv.Atoi(p)
		}
	}
	if s.cfg.SideChannelHost != "" {
		host = s.cfg.SideChannelHost
	}
	return host, port
}

// heldParams are the kv_transfer_params of a finished prefill leg's
// response, or nil when it holds nothing for a decode worker (not a
// prefill leg, or it did not finish length-capped).
func (s *Server) heldParams(j *job, final engine.Event, reason string) *engine.TransferParams {
	if !j.hold || reason != "length" || final.Canceled {
		return nil
	}
	ids, _ := json.Marshal(final.HeldBlocks)
	if final.HeldBlocks == nil {
		ids = []byte("[]")
	}
	return &engine.TransferParams{
		DoRemotePrefill: true, RemoteBlockIDs: ids,
		RemoteEngineID: s.cfg.EngineID, RemoteRequestID: j.id,
		RemoteHost: j.sideHost, RemotePort: j.sidePort, TPSize: 1,
	}
}

// ignored counts and logs kv_transfer_params the engine's role does not
// serve: the request is served as a plain one.
func (s *Server) ignored(j *job, param string) {
	s.tm.ignored.WithLabelValues(param).Inc()
	s.log.Warn("kv_transfer_params ignored: not served by this engine's kv role", "request", j.id,
		"param", param, "kv_role", s.cfg.KVRole.String())
}
