package epp

import (
	"net"
	"slices"
	"strings"
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/kvrouter/kvrouter/emulator"
	"github.com/kvrouter/kvrouter/internal/wait"
	"github.com/kvrouter/kvrouter/proxy"
)

// TestSubsetForms: the subset hint in each form GIE's reference picker
// (pkg/lwepp) accepts narrows the choice to the endpoints it names: a
// list of host:port strings; one comma-separated string, as Envoy's
// header-to-metadata filter writes a header; a bare IP, every port of
// that pod; and a list element holding a comma-separated list. With as
// many fallbacks as replicas the destination list is the whole allowed
// set, so each case checks exactly which endpoints the hint allowed. A
// hint that names none of the pool's endpoints gets 503.
func TestSubsetForms(t *testing.T) {
	// The third replica listens on another loopback address, so that a
	// bare IP names some of the replicas and not all.
	other, err := emulator.Start(emulator.Config{Model: "m", TimeScale: 0.01}, "127.0.0.2:0")
	if err != nil {
		t.Skipf("no second loopback address: %v", err)
	}
	t.Cleanup(func() { other.Close() })
	f := start(t, 2, Config{Fallbacks: 3}, func(c *proxy.Config) {
		c.Backends = append(c.Backends, proxy.Backend{URL: other.URL()})
	})
	a, b := hostOf(t, f.reps[0].URL()), hostOf(t, f.reps[1].URL())
	c := hostOf(t, other.URL())
	cIP, _, _ := net.SplitHostPort(c)
	wait.For(t, "replicas healthy", func() bool { return healthy(f) == 3 })

	tests := []struct {
		name string
		hint any
		want []string // the endpoints allowed; nil: 503
	}{
		{"list of endpoints", []any{a, c}, []string{a, c}},
		{"one string, comma-separated", " " + a + " , " + b + ",", []string{a, b}},
		{"bare IP: every port of the pod", "127.0.0.1", []string{a, b}},
		{"bare IP in a list", []any{cIP}, []string{c}},
		{"list element holding a comma list", []any{a + "," + cIP, "10.255.0.1:8000"}, []string{a, c}},
		{"bracketed bare IPv6 of no replica", "[fd00::1]", nil},
		{"empty string: none allowed", "", nil},
		{"empty list: none allowed", []any{}, nil},
		{"no endpoint of the pool", "10.255.0.1:8000,10.255.0.2", nil},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := chat("m", "s", words(i, 40), false)
			r.hint = tt.hint
			ex := f.do(t, r)
			if tt.want == nil {
				if ex.immediate == nil || ex.immediate.GetStatus().GetCode() != 503 {
					t.Fatalf("routed to %q (immediate %v), want 503", ex.list, ex.immediate)
				}
				return
			}
			if ex.immediate != nil {
				t.Fatalf("answered %v, want routed within %v", ex.immediate, tt.want)
			}
			got := strings.Split(ex.list, ",")
			slices.Sort(got)
			want := slices.Sorted(slices.Values(tt.want))
			if !slices.Equal(got, want) {
				t.Errorf("destination list %q, want exactly %v", ex.list, want)
			}
		})
	}
}

// TestSubsetParse: each form of the hint's value, read as subsetOf reads
// it (without a router).
func TestSubsetParse(t *testing.T) {
	tests := []struct {
		hint any
		want []string
	}{
		{[]any{"10.0.0.1:8000", "10.0.0.2:8000"}, []string{"10.0.0.1:8000", "10.0.0.2:8000"}},
		{"10.0.0.1:8000, 10.0.0.2:8000", []string{"10.0.0.1:8000", "10.0.0.2:8000"}},
		{"10.0.0.1", []string{"10.0.0.1"}},
		{[]any{"10.0.0.1:8000,10.0.0.2", 7.0, "[fd00::1]:8000", "[fd00::2]"}, []string{"10.0.0.1:8000", "10.0.0.2", "[fd00::1]:8000", "fd00::2"}},
		{",, ", []string{}},
	}
	for _, tt := range tests {
		got := subsetOf(&extprocv3.ProcessingRequest{MetadataContext: hintMetadata(t, tt.hint)}, DefaultNamespace)
		if got == nil || !slices.Equal(got, tt.want) {
			t.Errorf("hint %#v: got %#v, want %#v", tt.hint, got, tt.want)
		}
	}
}
