package proxy

import (
	"errors"
	"flag"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/kvrouter/kvrouter/prefix"
)

// validateLimits checks the limits and timeouts.
func (c *Config) validateLimits() []error {
	var errs []error
	for _, v := range []struct {
		name string
		v    int
	}{
		{"max-header-bytes", c.MaxHeaderBytes},
		{"max-headers", c.MaxHeaders},
	} {
		if v.v < 0 {
			errs = append(errs, fmt.Errorf("%s: must not be negative, got %d", v.name, v.v))
		}
	}
	if t := c.MaxBodyBytesTotal; t < 0 || t > 0 && t < c.MaxBodyBytes {
		errs = append(errs, fmt.Errorf("max-body-bytes-total: want 0 (a share of the memory) or at least max-body-bytes (%d), got %d", c.MaxBodyBytes, t))
	}
	for _, v := range []struct {
		name string
		v    time.Duration
	}{
		{"read-header-timeout", c.ReadHeaderTimeout},
		{"body-timeout", c.BodyTimeout},
		{"idle-timeout", c.IdleTimeout},
	} {
		if v.v < 0 {
			errs = append(errs, fmt.Errorf("%s: must not be negative, got %s", v.name, v.v))
		}
	}
	return errs
}

// limitCodes are the error codes of the parse limits, by sentinel.
var limitCodes = []struct {
	err  error
	code string
}{
	{prefix.ErrTooManyMessages, "too_many_messages"},
	{prefix.ErrTooManyParts, "too_many_content_parts"},
	{prefix.ErrTooDeep, "nesting_too_deep"},
	{prefix.ErrTooManyTools, "too_many_tools"},
	{prefix.ErrTooManyPrompts, "too_many_prompts"},
}

// limitError answers 400 for a body past a parse limit, with the limit's
// own code; false if err is no limit error.
func (c *call) limitError(w http.ResponseWriter, err error) bool {
	for _, l := range limitCodes {
		if errors.Is(err, l.err) {
			c.fail(w, http.StatusBadRequest, errInvalidRequest, l.code,
				"request body exceeds the router's limits: "+err.Error())
			return true
		}
	}
	return false
}

// Prefixes is a list of IP prefixes (CIDR), written as a comma-separated
// list ("10.0.0.0/8,192.168.1.7/32"); a bare address is a prefix of one
// address. It is a flag.Value.
type Prefixes []netip.Prefix

// Contains reports whether addr is in one of the prefixes.
func (ps Prefixes) Contains(addr netip.Addr) bool {
	addr = addr.Unmap()
	for _, p := range ps {
		if p.Contains(addr) {
			return true
		}
	}
	return false
}

// String implements flag.Value.
func (ps Prefixes) String() string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return strings.Join(s, ",")
}

// Set replaces the list with the comma-separated s; it implements
// flag.Value.
func (ps *Prefixes) Set(s string) error {
	var out Prefixes
	for f := range strings.SplitSeq(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		p, err := parsePrefix(f)
		if err != nil {
			return err
		}
		out = append(out, p)
	}
	*ps = out
	return nil
}

// parsePrefix reads a CIDR prefix or a bare address.
func parsePrefix(s string) (netip.Prefix, error) {
	if !strings.Contains(s, "/") {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return netip.Prefix{}, fmt.Errorf("trusted proxy %q: want a CIDR prefix or an address", s)
		}
		a = a.Unmap()
		return netip.PrefixFrom(a, a.BitLen()), nil
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("trusted proxy %q: want a CIDR prefix or an address", s)
	}
	return p.Masked(), nil
}

// UnmarshalYAML reads a list of prefixes or one comma-separated string.
func (ps *Prefixes) UnmarshalYAML(n *yaml.Node) error {
	var list []string
	if n.Kind == yaml.SequenceNode {
		if err := n.Decode(&list); err != nil {
			return fmt.Errorf("line %d: %w", n.Line, err)
		}
	} else {
		var s string
		if err := n.Decode(&s); err != nil {
			return fmt.Errorf("line %d: trusted-proxies: want a list of CIDR prefixes", n.Line)
		}
		list = []string{s}
	}
	if err := ps.Set(strings.Join(list, ",")); err != nil {
		return fmt.Errorf("line %d: %w", n.Line, err)
	}
	return nil
}

// MarshalYAML writes the prefixes as a list.
func (ps Prefixes) MarshalYAML() (any, error) {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return s, nil
}

var (
	_ flag.Value       = (*Prefixes)(nil)
	_ yaml.Unmarshaler = (*Prefixes)(nil)
	_ yaml.Marshaler   = Prefixes(nil)
)
