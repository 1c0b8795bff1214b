package proxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"strings"
)

// The check a prefill leg's kv_transfer_params pass before the decode leg
// carries them. The prefill worker's answer is not trusted: the decode
// engine acts on what the params say (vLLM's NixlConnector dials
// remote_host:remote_port and reads remote_block_ids there), so the
// router forwards only what vLLM's NixlConnectorScheduler.request_finished
// returns (nixl_connector.py), within a size and a depth, naming the
// worker that ran the leg:
//
//	{"do_remote_prefill": true, "do_remote_decode": false,
//	 "remote_block_ids": [<ids>] or [[<ids>], ...], "remote_engine_id": "…",
//	 "remote_request_id": "…", "remote_host": "<the worker>", "remote_port": N, "tp_size": N}
//
// A member the connector does not send is accepted when its value is a
// scalar (a newer vLLM's), never an object or a list.

// Bounds of the params a decode leg carries.
const (
	// maxParamsBytes bounds the params' encoding: the block ids of a
	// prompt of 128k tokens at 16 a block, several times over.
	maxParamsBytes = 256 << 10
	// maxParamsDepth bounds their nesting: the object, the list of
	// KV-cache groups, a group's ids.
	maxParamsDepth = 3
	// maxParamGroups bounds the KV-cache groups remote_block_ids names.
	maxParamGroups = 16
	// maxParamString bounds a string member (ids, the host).
	maxParamString = 256
	// maxBlockIDs bounds one group's ids when the prompt's length is not
	// known.
	maxBlockIDs = 1 << 17
)

// errBadParams: a prefill leg answered kv_transfer_params the router
// does not forward.
var errBadParams = errors.New("kv_transfer_params refused")

// legPeer is the worker a prefill leg ran on: the host its URL names and
// the address the leg's connection reached. remote_host must be one of
// them.
type legPeer struct {
	host, addr string
}

// names reports whether host names the worker.
func (p legPeer) names(host string) bool {
	host = strings.Trim(host, "[]")
	if host == "" {
		return false
	}
	return strings.EqualFold(host, p.host) || host == p.addr || sameIP(host, p.host) || sameIP(host, p.addr)
}

// check is the leg's rule for remote_host: the worker that ran it.
func (p legPeer) check(host string) error {
	if !p.names(host) {
		return fmt.Errorf("%q is not the prefill worker that ran the leg (%s, reached at %s)", host, p.host, p.addr)
	}
	return nil
}

// paramRules are what checkParams holds params to beyond their size and
// depth: answer, the params of a prefill leg's answer (do_remote_prefill
// true, do_remote_decode false), else a client's own, either way; host,
// the rule for remote_host.
type paramRules struct {
	answer bool
	host   func(string) error
}

// sameIP reports whether a and b are the same IP address in any of its
// spellings.
func sameIP(a, b string) bool {
	x, y := net.ParseIP(a), net.ParseIP(b)
	return x != nil && y != nil && x.Equal(y)
}

// checkParams checks params, kv_transfer_params for a prompt of prompt
// tokens (0: not known): the size, the depth, the members and their
// types, and remote_host by rules. The error says which failed.
func checkParams(params []byte, prompt int, rules paramRules) error {
	if len(params) > maxParamsBytes {
		return fmt.Errorf("%w: %d bytes, more than %d", errBadParams, len(params), maxParamsBytes)
	}
	if err := checkDepth(params); err != nil {
		return err
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(params, &m); err != nil {
		return fmt.Errorf("%w: %v", errBadParams, err)
	}
	for k, v := range m {
		if err := checkMember(k, v, prompt, rules); err != nil {
			return fmt.Errorf("%w: %s: %v", errBadParams, k, err)
		}
	}
	return nil
}

// checkDepth refuses JSON nested deeper than maxParamsDepth before it is
// decoded.
func checkDepth(b []byte) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	depth := 0
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%w: %v", errBadParams, err)
		}
		switch tok {
		case json.Delim('{'), json.Delim('['):
			if depth++; depth > maxParamsDepth {
				return fmt.Errorf("%w: nested deeper than %d", errBadParams, maxParamsDepth)
			}
		case json.Delim('}'), json.Delim(']'):
			depth--
		}
	}
}

// checkMember checks one member of the params.
func checkMember(k string, v json.RawMessage, prompt int, rules paramRules) error {
	switch k {
	case "do_remote_prefill":
		return wantBool(v, true, rules.answer)
	case "do_remote_decode":
		return wantBool(v, false, rules.answer)
	case "remote_block_ids":
		return checkBlockIDs(v, prompt)
	case "remote_engine_id", "remote_request_id":
		_, err := wantString(v)
		return err
	case "remote_host":
		h, err := wantString(v)
		if err == nil {
			err = rules.host(h)
		}
		return err
	case "remote_port":
		return wantInt(v, 1, 65535, !rules.answer)
	case "tp_size":
		return wantInt(v, 1, 1<<16, !rules.answer)
	}
	if t := bytes.TrimSpace(v); len(t) > 0 && (t[0] == '{' || t[0] == '[') {
		return errors.New("not a member vLLM's NixlConnector sends, and not a scalar")
	}
	if len(v) > maxParamString+2 {
		return fmt.Errorf("longer than %d bytes", maxParamString)
	}
	return nil
}

// wantBool checks a boolean, which must be want when strict.
func wantBool(v json.RawMessage, want, strict bool) error {
	var b bool
	if err := json.Unmarshal(v, &b); err != nil || strict && b != want {
		return fmt.Errorf("want %v, got %.40s", want, v)
	}
	return nil
}

func wantString(v json.RawMessage) (string, error) {
	var s string
	if err := json.Unmarshal(v, &s); err != nil {
		return "", fmt.Errorf("want a string, got %.40s", v)
	}
	if len(s) > maxParamString {
		return "", fmt.Errorf("%d bytes, more than %d", len(s), maxParamString)
	}
	return s, nil
}

// wantInt checks an integer in lo..hi, or null when nullable.
func wantInt(v json.RawMessage, lo, hi float64, nullable bool) error {
	if nullable && string(bytes.TrimSpace(v)) == "null" {
		return nil
	}
	var f float64
	if err := json.Unmarshal(v, &f); err != nil || f != math.Trunc(f) || f < lo || f > hi {
		return fmt.Errorf("want an integer in %v..%v, got %.40s", lo, hi, v)
	}
	return nil
}

// checkBlockIDs checks remote_block_ids: a list of block ids or a list of
// them per KV-cache group, at most one id a prompt token (a block holds
// one at least) and maxParamGroups groups.
func checkBlockIDs(v json.RawMessage, prompt int) error {
	limit := maxBlockIDs
	if prompt > 0 {
		limit = prompt + 1
	}
	var flat []float64
	if json.Unmarshal(v, &flat) == nil {
		return checkIDs(flat, limit)
	}
	var groups [][]float64
	if err := json.Unmarshal(v, &groups); err != nil {
		return errors.New("want a list of block ids or one per KV-cache group")
	}
	if len(groups) > maxParamGroups {
		return fmt.Errorf("%d groups, more than %d", len(groups), maxParamGroups)
	}
	for _, g := range groups {
		if err := checkIDs(g, limit); err != nil {
			return err
		}
	}
	return nil
}

func checkIDs(ids []float64, limit int) error {
	if len(ids) > limit {
		return fmt.Errorf("%d ids, more than the prompt's %d tokens can fill", len(ids), limit)
	}
	for _, id := range ids {
		if id != math.Trunc(id) || id < 0 || id > math.MaxInt32 {
			return fmt.Errorf("%v is not a block id", id)
		}
	}
	return nil
}

// codeBadOwnParams is the error code of a client's body whose
// kv_transfer_params the router does not forward.
const codeBadOwnParams = "invalid_kv_transfer_params"

// ownParams checks the kv_transfer_params a client's body carries, which
// the router forwards without legs and an engine acts on as on a leg's:
// the size, the depth, the types, and a remote_host (when set) naming a
// backend's host as its URL spells it. Params that fail are answered 400
// invalid_kv_transfer_params (counted) and it returns false.
func (c *call) ownParams(w http.ResponseWriter, body []byte) bool {
	at := c.prompt.KVTransferParamsAt
	if at[1] <= at[0] {
		return true
	}
	p := body[at[0]:at[1]]
	if string(p) == "null" {
		return true
	}
	if p[0] != '{' {
		c.failParam(w, http.StatusBadRequest, errInvalidRequest, codeBadOwnParams, "kv_transfer_params", "kv_transfer_params: want an object")
		return false
	}
	if err := checkParams(p, 0, paramRules{host: c.rt.backendHost}); err != nil {
		c.failParam(w, http.StatusBadRequest, errInvalidRequest, codeBadOwnParams, "kv_transfer_params", err.Error())
		return false
	}
	return true
}

// backendHost is a client's remote_host rule: empty (no side channel to
// dial), or the host of one of the fleet's backends.
func (rt *Router) backendHost(host string) error {
	host = strings.Trim(host, "[]")
	if host == "" {
		return nil
	}
	for _, b := range rt.st.bes.list() {
		if h := b.cfg.URL; h != "" {
			if u, err := url.Parse(h); err == nil && (strings.EqualFold(u.Hostname(), host) || sameIP(u.Hostname(), host)) {
				return nil
			}
		}
	}
	return fmt.Errorf("%q is no backend's host", host)
}
