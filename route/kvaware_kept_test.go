package route

import (
	"testing"
)

// TestKVAwareStickyBatchDoesNotDrain: a replica whose requests keep
// returning to it (its conversations' turns follow their cached context)
// does not shed its batch the way one the router steers away from does.
// Two replicas of the same batch, 60 sequences against a fleet mean of
// 35: on the one that drew 90% of the router's recent requests, the
// batch a new request decodes beside stays near what that share keeps
// (kept), so its Decode is dearer than on the one that drew 50%; and a
// short session continuation leaves the sticky replica for a light one
// rather than join it, where its 4,096-token context keeps it when the
// same replica's share is the fleet's even one.
func TestKVAwareStickyBatchDoesNotDrain(t *testing.T) {
	price := func(share float64) Decision {
		hot, light := decoding(60), decoding(10)
		hot.Share, light.Share = share, 1-share
		r := rq(4096)
		r.MaxTokens = 512
		r.Match = []int{256, 0} // the whole prompt, on the hot replica
		r.Pinned = 0
		r.Session = 7
		r.Costs = make([]Cost, 0, 2)
		return KVAware{}.Pick(r, &Snapshot{Replicas: []Replica{hot, light}, Seqs: 70})
	}
	sticky, even := price(0.9), price(0.5)
	if sticky.Costs[0].Decode <= even.Costs[0].Decode {
		t.Errorf("Decode on the hot replica at 90%% of arrivals %v, at 50%% %v: want it dearer", sticky.Costs[0].Decode, even.Costs[0].Decode)
	}
	if sticky.Replica != 1 {
		t.Errorf("at 90%% of arrivals: got replica %d, want 1 (hot %v, light %v)", sticky.Replica, sticky.Costs[0].Total, sticky.Costs[1].Total)
	}
	if even.Replica != 0 {
		t.Errorf("at an even share: got replica %d, want 0, its cached context (hot %v, light %v)", even.Replica, even.Costs[0].Total, even.Costs[1].Total)
	}
}

// TestKVAwareRecomputeDelaysTheQueueBehind: a prefill starting behind a
// queue delays every request that queues behind it while it waits, not
// only those arriving while it runs (behind). The same recompute priced on
// a replica with 8,000 tokens queued costs the others more than on an
// idle-queued one, by λ × prefill × the wait, doubled as Total counts a
// first token.
func TestKVAwareRecomputeDelaysTheQueueBehind(t *testing.T) {
	queued, free := decoding(20), decoding(20)
	queued.PrefillTokens = 8000
	r := rq(4000)
	r.MaxTokens = 256
	r.Costs = make([]Cost, 0, 2)
	d := KVAware{}.Pick(r, &Snapshot{Replicas: []Replica{queued, free}})
	q, f := d.Costs[0], d.Costs[1]
	if q.Wait <= f.Wait {
		t.Fatalf("setup: wait %v behind the queue, %v without", q.Wait, f.Wait)
	}
	if q.Others <= f.Others {
		t.Errorf("Others behind a queue %v, without %v: want more (the queue behind it waits for its prefill)", q.Others, f.Others)
	}
	if d.Replica != 1 {
		t.Errorf("got %d, want 1", d.Replica)
	}
}
