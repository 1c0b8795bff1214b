package engine

import "encoding/json"

// TransferParams is vLLM's kv_transfer_params request field, as its
// NixlConnector reads it (vllm/distributed/kv_transfer/kv_connector/v1/
// nixl_connector.py), plus RemoteNumTokens, kvrouter's emulator's own: what
// the router sends a replica with a KV connector to order an import
// (package proxy), and what the emulator reads (package emulator).
type TransferParams struct {
	// DoRemotePrefill asks to import the prompt's KV from the source
	// instead of computing it (a P/D decode instance's leg).
	DoRemotePrefill bool `json:"do_remote_prefill"`
	// DoRemoteDecode marks a P/D prefill instance's leg; the emulator
	// serves such a request as any other.
	DoRemoteDecode bool `json:"do_remote_decode"`
	// RemoteEngineID and RemoteRequestID name the source and its request;
	// the emulator names the source by RemoteEngineID in its log and
	// ignores RemoteRequestID.
	RemoteEngineID  string `json:"remote_engine_id"`
	RemoteRequestID string `json:"remote_request_id"`
	// RemoteHost and RemotePort are the source's address. In vLLM they
	// are the NIXL side channel's; here, the source emulator's HTTP API,
	// which serves TransferPath.
	RemoteHost string `json:"remote_host"`
	RemotePort int    `json:"remote_port"`
	// RemoteBlockIDs are, in vLLM, the source's engine block ids (a list,
	// or a list per KV-cache group). The emulator has no physical ids: an
	// empty or absent list means "the prompt's leading blocks you hold"
	// (what a router, which does not know the source's ids, sends), a
	// non-empty one imports as many leading blocks as it has ids (its first
	// group's, when grouped).
	RemoteBlockIDs json.RawMessage `json:"remote_block_ids"`
	// TPSize is the source's tensor-parallel size; the emulator ignores
	// it, the router does not send it.
	TPSize int `json:"tp_size,omitempty"`
	// RemoteNumTokens (the emulator's own field) caps the import to the
	// prompt's first RemoteNumTokens tokens, rounded down to whole blocks;
	// absent or zero means no cap beyond remote_block_ids.
	RemoteNumTokens int `json:"remote_num_tokens"`
}
