package peers

import (
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/fleet"
)

// TestSessionValue: a binding's Redis value reads back as written, and a
// malformed value (Redis is shared: anything may be there) is refused.
func TestSessionValue(t *testing.T) {
	for _, p := range []fleet.PeerSession{
		{Replica: "http://10.0.0.5:8000", Router: "router-a", At: time.Unix(1_800_000_000, 123), Blocks: 42, Tail: 0xfeedface12345678},
		{Replica: "http://10.0.0.5:8000", At: time.Unix(1_800_000_000, 0)}, // no router named
	} {
		got, ok := parseSession(formatSession(p))
		if !ok || got != p {
			t.Errorf("got %+v, %v; want %+v", got, ok, p)
		}
	}
	old := "1800000000000000000 3 7 http://10.0.0.5:8000" // an earlier kvrouter's: no router field
	if got, ok := parseSession(old); !ok || got.Replica != "http://10.0.0.5:8000" || got.Router != "" || got.Blocks != 3 || got.Tail != 7 {
		t.Errorf("earlier value: got %+v, %v", got, ok)
	}
	for _, bad := range []string{"", "1 2 3", "1 2 3 ", "x 2 3 r http://a", "1 -2 3 r http://a", "1 2 -3 r http://a", "1 2 3 r ", "1 2 99999999999999999999 r http://a"} {
		if p, ok := parseSession(bad); ok {
			t.Errorf("parseSession(%q) = %+v, want refused", bad, p)
		}
	}
}
