package epp

import (
	"bytes"
	"encoding/json"

	"github.com/kvrouter/kvrouter/fleet"
)

// tailBytes is how much of a response's end is kept to find the usage
// the engine reports: the final JSON object of a completion, or the last
// SSE chunk of a stream (stream_options.include_usage).
const tailBytes = 16 << 10

// usageTail keeps the last tailBytes of a response body.
type usageTail struct{ buf []byte }

// write appends p, keeping the tail.
func (u *usageTail) write(p []byte) {
	if len(p) >= tailBytes {
		u.buf = append(u.buf[:0], p[len(p)-tailBytes:]...)
		return
	}
	if over := len(u.buf) + len(p) - tailBytes; over > 0 {
		u.buf = append(u.buf[:0], u.buf[over:]...)
	}
	u.buf = append(u.buf, p...)
}

// usage returns the last "usage" object in the tail, fields −1 where it
// does not say (fleet.NoUsage when there is none).
func (u *usageTail) usage() fleet.Usage {
	i := bytes.LastIndex(u.buf, []byte(`"usage"`))
	if i < 0 {
		return fleet.NoUsage
	}
	rest := bytes.TrimLeft(u.buf[i+len(`"usage"`):], " \t\r\n")
	if len(rest) == 0 || rest[0] != ':' {
		return fleet.NoUsage
	}
	var v struct {
		PromptTokens        *int `json:"prompt_tokens"`
		CompletionTokens    *int `json:"completion_tokens"`
		PromptTokensDetails *struct {
			CachedTokens *int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	}
	if json.NewDecoder(bytes.NewReader(rest[1:])).Decode(&v) != nil {
		return fleet.NoUsage
	}
	out := fleet.NoUsage
	if v.PromptTokens != nil {
		out.PromptTokens = *v.PromptTokens
	}
	if v.CompletionTokens != nil {
		out.CompletionTokens = *v.CompletionTokens
	}
	if d := v.PromptTokensDetails; d != nil && d.CachedTokens != nil {
		out.CachedTokens = *d.CachedTokens
	}
	return out
}
