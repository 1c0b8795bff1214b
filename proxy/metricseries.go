package proxy

import (
	"github.com/kvrouter/kvrouter/fleet"
	"github.com/kvrouter/kvrouter/route"
)

// seriesOfReplica is what the fleet collector exports for one replica id.
type seriesOfReplica struct {
	id       string
	inflight int  // the router's own requests on the id, in every slot
	healthy  bool // the live slot's route.Replica.Healthy
	blocks   int  // the live slot's residency blocks
}

// replicaSeries folds the fleet's members into one series per replica id.
// A backend removed while requests ran on it and added again has a twin:
// the removed slot, which its requests still hold, beside the live one.
// Both carry the id, and two series with one label set make every scrape
// fail, so the twin's requests count in the id's in-flight gauge while
// they run, health and blocks are the live slot's, and a removed id with
// nothing in flight has no series (fleet.Members leaves it out). reps is
// a snapshot taken just before members; a slot reused between the two is
// read as unknown (not healthy, no blocks) until the next scrape.
func replicaSeries(members []fleet.Member, reps []route.Replica, dst []seriesOfReplica) []seriesOfReplica {
	for _, m := range members {
		j := len(dst)
		for k := range dst {
			if dst[k].id == m.ID {
				j = k
				break
			}
		}
		if j == len(dst) {
			dst = append(dst, seriesOfReplica{id: m.ID})
		}
		x := &dst[j]
		x.inflight += m.InFlight
		if m.State != fleet.StateRemoved && m.Index < len(reps) && reps[m.Index].ID == m.ID {
			x.healthy, x.blocks = reps[m.Index].Healthy, reps[m.Index].IndexBlocks
		}
	}
	return dst
}
