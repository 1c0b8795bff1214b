package engine

import "encoding/json"

// TransferParams is vLLM's kv_transfer_params, the field by which a P/D
// proxy chains a request's two legs through vLLM's NixlConnector
// (vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py and
// tests/v1/kv_connector/nixl_integration/toy_proxy_server.py, vLLM commit
// 002a105): in the prefill leg's request (DoRemoteDecode, the rest null),
// in the prefill worker's response (DoRemotePrefill and the source's
// fields), and in the decode leg's request (that response's params as
// they are). The emulator reads and writes it (package emulator); the
// fields are in the order vLLM's request_finished writes them.
type TransferParams struct {
	// DoRemotePrefill asks to read the prompt's KV from the source named
	// by the other fields instead of computing it (the decode leg).
	DoRemotePrefill bool `json:"do_remote_prefill"`
	// DoRemoteDecode asks the engine to hold the prompt's KV blocks after
	// the request finishes, for a decode worker to read (the prefill leg).
	DoRemoteDecode bool `json:"do_remote_decode"`
	// RemoteBlockIDs are the source's engine block ids of the prompt's
	// blocks, in order: a list of ints, or a list per KV-cache group
	// (newer vLLM), of which the emulator reads the first. Null or empty:
	// nothing to read.
	RemoteBlockIDs json.RawMessage `json:"remote_block_ids"`
	// RemoteEngineID names the source engine (vLLM's engine_id).
	RemoteEngineID string `json:"remote_engine_id"`
	// RemoteRequestID is the source's id of the prefill leg, whose held
	// blocks the decode worker reads (NixlConnector version 2).
	RemoteRequestID string `json:"remote_request_id"`
	// RemoteHost and RemotePort are the source's side channel. In vLLM
	// they are its NIXL side channel (VLLM_NIXL_SIDE_CHANNEL_HOST/_PORT);
	// an emulator serves its side channel on its HTTP API (TransferPath in
	// package emulator).
	RemoteHost string `json:"remote_host"`
	RemotePort int    `json:"remote_port"`
	// TPSize is the source's tensor-parallel size; the emulator writes 1
	// and reads nothing from it.
	TPSize int `json:"tp_size,omitempty"`
}
