package kvevents

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"
)

// resolveTimeout bounds one host name lookup at Start.
const resolveTimeout = 2 * time.Second

// peers is who may publish on the bind socket beyond each replica's own
// host: Config.Allow, parsed once at Start.
type peers struct {
	any   bool           // "*": every peer
	allow []netip.Prefix // CIDRs, and single addresses as /32 or /128
}

// parsePeers reads Config.Allow: CIDRs, IP addresses, host names
// (resolved now) or "*".
func parsePeers(list []string) (peers, error) {
	var p peers
	for _, s := range list {
		s = strings.TrimSpace(s)
		switch {
		case s == "":
		case s == "*":
			p.any = true
		case strings.Contains(s, "/"):
			pfx, err := netip.ParsePrefix(s)
			if err != nil {
				return peers{}, fmt.Errorf("kvevents: allow %q: %w", s, err)
			}
			p.allow = append(p.allow, pfx.Masked())
		default:
			addrs, err := resolve(s)
			if err != nil {
				return peers{}, fmt.Errorf("kvevents: allow %q: %w", s, err)
			}
			for _, a := range addrs {
				p.allow = append(p.allow, netip.PrefixFrom(a, a.BitLen()))
			}
		}
	}
	return p, nil
}

// allowed reports whether ip is in the allow list.
func (p peers) allowed(ip netip.Addr) bool {
	if p.any {
		return true
	}
	return slices.ContainsFunc(p.allow, func(pfx netip.Prefix) bool { return pfx.Contains(ip) })
}

// resolve returns host's addresses: host itself if it is an address,
// else its lookup.
func resolve(host string) ([]netip.Addr, error) {
	if a, err := netip.ParseAddr(strings.Trim(host, "[]")); err == nil {
		return []netip.Addr{a.Unmap()}, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), resolveTimeout)
	defer cancel()
	addrs, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
	for i := range addrs {
		addrs[i] = addrs[i].Unmap()
	}
	return addrs, err
}

// hostAddrs resolves the host of a replica's "host:port" Addr; an empty
// or unresolvable one has none (only Config.Allow then admits its
// engine).
func hostAddrs(hostport string) ([]netip.Addr, error) {
	if hostport == "" {
		return nil, nil
	}
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		return nil, err
	}
	return resolve(host)
}

// remoteIP is the IP of a connection's peer; ok is false for a peer with
// none (a unix socket: local, trusted by the file's permissions).
func remoteIP(addr net.Addr) (ip netip.Addr, ok bool) {
	tcp, isTCP := addr.(*net.TCPAddr)
	if !isTCP {
		return netip.Addr{}, false
	}
	a, _ := netip.AddrFromSlice(tcp.IP)
	return a.Unmap(), true
}
