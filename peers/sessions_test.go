package peers

import (
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/fleet"
)

// TestSessionValue: a binding's Redis value reads back as written, and a
// malformed value (Redis is shared: anything may be there) is refused.
func TestSessionValue(t *testing.T) {
	p := fleet.PeerSession{Replica: "http://10.0.0.5:8000", At: time.Unix(1_800_000_000, 123), Blocks: 42, Tail: 0xfeedface12345678}
	got, ok := parseSession(formatSession(p))
	if !ok || got.Replica != p.Replica || !got.At.Equal(p.At) || got.Blocks != p.Blocks || got.Tail != p.Tail {
		t.Errorf("got %+v, %v; want %+v", got, ok, p)
	}
	for _, bad := range []string{"", "1 2 3", "x 2 3 http://a", "1 -2 3 http://a", "1 2 -3 http://a", "1 2 3 ", "1 2 99999999999999999999 http://a"} {
		if p, ok := parseSession(bad); ok {
			t.Errorf("parseSession(%q) = %+v, want refused", bad, p)
		}
	}
}
