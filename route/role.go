package route

import "fmt"

// Role is a replica's part in a disaggregated fleet, where some replicas
// compute prompts for others (prefill workers) and hand the KV over to
// the replicas that decode (vLLM's NixlConnector, SGLang's PD mode).
type Role uint8

const (
	// RoleBoth prefills and decodes its own requests: an aggregated
	// replica, the default.
	RoleBoth Role = iota
	// RolePrefill runs prefill legs for the decode replicas and decodes
	// nothing: never a candidate of Pick (Replica.Healthy is false), a
	// prefill worker when Replica.Prefills says it can take legs.
	RolePrefill
	// RoleDecode takes requests and decodes them; it prefills one itself
	// when no prefill worker pays (conditional disaggregation).
	RoleDecode
)

// String is the role as flags and config files write it.
func (r Role) String() string {
	switch r {
	case RolePrefill:
		return "prefill"
	case RoleDecode:
		return "decode"
	}
	return "both"
}

// ParseRole reads a Role as String writes it; "" is RoleBoth.
func ParseRole(s string) (Role, error) {
	switch s {
	case "", "both":
		return RoleBoth, nil
	case "prefill":
		return RolePrefill, nil
	case "decode":
		return RoleDecode, nil
	}
	return RoleBoth, fmt.Errorf("unknown role %q (known: prefill, decode, both)", s)
}
