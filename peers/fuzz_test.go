package peers

import (
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/fleet"
)

// FuzzMergeShare: whatever a Redis value holds, decoding it and merging it
// into a fleet neither panics nor leaves negative load in the snapshot.
func FuzzMergeShare(f *testing.F) {
	f.Add(`{"router":"a","at":"2026-01-01T00:00:00Z","load":[{"replica":"http://r0","in_flight":2,"prefill_tokens":100}]}`)
	f.Add(`{"sessions":[{"key":"s","replica":"http://r1","at":"2026-01-01T00:00:00Z"}],"touches":[{"replica":"http://r2","at":"2026-01-01T00:00:00Z","chains":[{"tokens":16,"hashes":[1,2,3]}]}]}`)
	f.Add(`{"load":[{"replica":"http://r0","in_flight":-5}],"touches":[{"replica":"http://r0","chains":[{"tokens":0,"hashes":[]}]}]}`)
	now := time.Date(2026, 1, 1, 0, 0, 1, 0, time.UTC)
	f.Fuzz(func(t *testing.T, data string) {
		fl, err := fleet.New(fleet.Config{Replicas: replicas, Start: now.Add(-time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		var sh fleet.Share
		if decode(data, &sh) != nil {
			return
		}
		fl.Merge(now, []fleet.Share{sh})
		for _, r := range replicas {
			if l := fl.PeerLoad(r.ID); l.InFlight < 0 || l.PrefillTokens < 0 || l.Decoding < 0 || l.DecodeTokens < 0 {
				t.Errorf("negative peer load %+v", l)
			}
		}
		var sc fleet.Scratch
		fl.Decide(&fleet.Request{ID: "x", Session: "s", Tokens: 10}, nil, now, &sc)
	})
}
