package fleet

import (
	"time"

	"github.com/kvrouter/kvrouter/route"
)

// KV transfers (route.Decision.Transfer) are on when the fleet's rates can
// transfer (Config.Rates.TransferPerMTokens > 0: the operator enabled
// them). The fleet then books each transfer it orders on both replicas'
// links, so that the next decisions see them busy (route.Replica.LinkWait)
// for as long as the transfer was predicted to take: the router's own
// account, as for its in-flight requests, since engines report no link
// use.

// transfers reports whether the fleet orders KV transfers.
func (f *Fleet) transfers() bool { return f.preset.TransferPerMTokens > 0 }

// bookLinks books decision d's transfer, if any, on the links of its
// replica and its source until now + its predicted time; the prediction
// already waited for what either link carried.
func (f *Fleet) bookLinks(d route.Decision, now time.Time) {
	t := d.Transfer
	if t.Blocks <= 0 || t.From < 0 {
		return
	}
	until := now.Add(t.Time).UnixNano()
	f.mu.RLock()
	defer f.mu.RUnlock()
	for _, i := range [2]int{d.Replica, t.From} {
		if i < len(f.reps) {
			r := f.reps[i]
			for old := r.linkUntil.Load(); old < until && !r.linkUntil.CompareAndSwap(old, until); old = r.linkUntil.Load() {
			}
		}
	}
}

// linkWaits sets each entry's LinkWait at now, when the fleet transfers;
// f.mu is held.
func (f *Fleet) linkWaits(dst *route.Snapshot, now time.Time) {
	if !f.transfers() {
		return
	}
	ns := now.UnixNano()
	for i, r := range f.reps {
		dst.Replicas[i].LinkWait = time.Duration(max(r.linkUntil.Load()-ns, 0))
	}
}
