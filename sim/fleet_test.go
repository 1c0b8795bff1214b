package sim

import (
	"testing"

	"github.com/kvrouter/kvrouter/trace"
)

// TestRemoveDrainsReplica runs the failure workload (a kill, an add, the
// removal of replica 1) and follows the transcript: after the removal no
// request is routed to replica 1, and every request in flight on it then
// finishes normally (a removal drains, unlike a kill).
func TestRemoveDrainsReplica(t *testing.T) {
	w, err := trace.Generate("failure", trace.GenOptions{Seed: 2, Requests: 300})
	if err != nil {
		t.Fatal(err)
	}
	for _, policy := range []string{"round-robin", "kv-aware"} {
		t.Run(policy, func(t *testing.T) {
			removed := false
			inFlight := map[string]bool{} // on replica 1
			drained, failed, after, added := 0, 0, 0, 0
			cfg := Config{Requests: w.Requests, Fleet: w.Events, Replicas: 4, Load: 0.8, Policies: []string{policy},
				Trace: func(_ string, s Step) {
					switch s.Kind {
					case StepAdd:
						added++
					case StepRemove:
						if s.Replica != 1 {
							t.Errorf("removed replica %d, want 1", s.Replica)
						}
						removed = true
					case StepArrival:
						if s.Decision.Replica != 1 {
							return
						}
						if removed {
							after++
						}
						inFlight[s.ReqID] = true
					case StepDone:
						if !inFlight[s.ReqID] {
							return
						}
						delete(inFlight, s.ReqID)
						if removed {
							drained++
							if s.Failed {
								failed++
							}
						}
					}
				}}
			if _, err := Run(cfg); err != nil {
				t.Fatal(err)
			}
			if !removed || added != 1 {
				t.Fatalf("removed %v, added %d: want the workload's removal and one add", removed, added)
			}
			if after != 0 {
				t.Errorf("%d requests routed to replica 1 after its removal, want 0", after)
			}
			// Round-robin sends replica 1 every fourth request, so some are
			// in flight when it is removed; kv-aware may have left it idle
			// by then (the drain is the fleet's, whatever the policy).
			if drained == 0 && policy == "round-robin" || failed != 0 || len(inFlight) != 0 {
				t.Errorf("requests in flight at the removal: %d finished, %d failed, %d never ended; want some, 0, 0", drained, failed, len(inFlight))
			}
		})
	}
}
