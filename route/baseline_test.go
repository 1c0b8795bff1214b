package route

import "testing"

func TestRoundRobin(t *testing.T) {
	snap := Snapshot{Replicas: []Replica{up("a", 0), {ID: "b"}, up("c", 0)}}
	for seq, want := range []int{0, 2, 0, 2} {
		r := rq(10)
		r.Seq = uint64(seq)
		if d := (RoundRobin{}).Pick(r, &snap); d.Replica != want || d.Reason != ReasonRoundRobin {
			t.Errorf("seq %d: got %d %q, want %d %q", seq, d.Replica, d.Reason, want, ReasonRoundRobin)
		}
	}
}

func TestRandomSpreadsDeterministically(t *testing.T) {
	snap := Snapshot{Replicas: []Replica{up("a", 0), up("b", 0), {ID: "c"}, up("d", 0)}}
	count := map[int]int{}
	for h := range uint64(300) {
		r := rq(10)
		r.Hash = h
		d := (Random{}).Pick(r, &snap)
		if again := (Random{}).Pick(r, &snap); again.Replica != d.Replica {
			t.Fatalf("hash %d: got %d then %d, want the same", h, d.Replica, again.Replica)
		}
		count[d.Replica]++
	}
	if count[2] != 0 || count[0] < 60 || count[1] < 60 || count[3] < 60 {
		t.Errorf("got counts %v over 300 hashes, want ~100 each on 0, 1, 3 and none on unhealthy 2", count)
	}
}

func TestLeastLoaded(t *testing.T) {
	runPicks(t, LeastLoaded{}, []pickCase{
		{name: "fewest in flight", snap: Snapshot{Replicas: []Replica{up("a", 3), up("b", 1), up("c", 2)}}, req: rq(10), want: 1, wantReason: ReasonLeastLoaded},
		{name: "unhealthy idle skipped", snap: Snapshot{Replicas: []Replica{up("a", 3), {ID: "b"}, up("c", 2)}}, req: rq(10), want: 2},
		{name: "engine metrics ignored", snap: Snapshot{Replicas: []Replica{{ID: "a", Healthy: true, InFlight: 1, Running: 90, Scraped: true}, up("b", 2)}}, req: rq(10), want: 0},
	})
}

func TestPowerOfTwo(t *testing.T) {
	snap := Snapshot{Replicas: []Replica{up("a", 9), up("b", 0)}}
	for h := range uint64(50) {
		r := rq(10)
		r.Hash = h
		if d := (PowerOfTwo{}).Pick(r, &snap); d.Replica != 1 {
			t.Fatalf("hash %d: got %d, want 1 (both drawn, 1 less loaded)", h, d.Replica)
		}
	}
	// With many replicas, the most loaded one is never chosen when it is
	// drawn against any other.
	many := Snapshot{Replicas: []Replica{up("a", 1), up("b", 1), up("c", 50), up("d", 1)}}
	for h := range uint64(200) {
		r := rq(10)
		r.Hash = h
		if d := (PowerOfTwo{}).Pick(r, &many); d.Replica == 2 {
			t.Fatalf("hash %d: got the most loaded replica 2", h)
		}
	}
}

func TestSessionHash(t *testing.T) {
	snap := Snapshot{Replicas: []Replica{up("a", 5), up("b", 5), up("c", 5), up("d", 0)}}
	r := rq(10)
	r.Session = 0xfeed
	home := (SessionHash{}).Pick(r, &snap)
	if home.Reason != ReasonSession {
		t.Fatalf("got reason %q, want %q", home.Reason, ReasonSession)
	}
	// Another replica going down does not move the session.
	other := (home.Replica + 1) % 4
	snap.Replicas[other].Healthy = false
	if d := (SessionHash{}).Pick(r, &snap); d.Replica != home.Replica {
		t.Errorf("other replica down: got %d, want %d", d.Replica, home.Replica)
	}
	// Its own replica going down moves it.
	snap.Replicas[other].Healthy = true
	snap.Replicas[home.Replica].Healthy = false
	if d := (SessionHash{}).Pick(r, &snap); d.Replica == home.Replica || d.Replica < 0 {
		t.Errorf("home down: got %d, want another healthy replica", d.Replica)
	}
	// No session: least loaded.
	snap.Replicas[home.Replica].Healthy = true
	if d := (SessionHash{}).Pick(rq(10), &snap); d.Replica != 3 || d.Reason != ReasonLeastLoaded {
		t.Errorf("no session: got %d %q, want 3 %q", d.Replica, d.Reason, ReasonLeastLoaded)
	}
}

func TestCHWBL(t *testing.T) {
	r := rq(10)
	r.PrefixKey = 0xabc
	idle := Snapshot{Replicas: []Replica{up("a", 0), up("b", 0), up("c", 0), up("d", 0)}}
	owner := (CHWBL{}).Pick(r, &idle)
	if owner.Reason != ReasonHash {
		t.Fatalf("idle fleet: got reason %q, want %q", owner.Reason, ReasonHash)
	}
	loaded := func(ownerLoad, others int) Snapshot {
		s := Snapshot{Replicas: []Replica{up("a", others), up("b", others), up("c", others), up("d", others)}}
		s.Replicas[owner.Replica].InFlight = ownerLoad
		return s
	}
	// KubeAI's rule is load+1 ≤ (total+1)/N × 1.25.
	// total 15, avg 4, bound 5: the owner at 3 (3+1 ≤ 5) is within it.
	within := loaded(3, 4)
	// total 14, avg 3.75, bound 4.69: the owner at 8 is not.
	over := loaded(8, 2)
	runPicks(t, CHWBL{}, []pickCase{
		{name: "owner within bound", snap: within, req: r, want: owner.Replica, wantReason: ReasonHash},
	})
	if d := (CHWBL{}).Pick(r, &over); d.Replica == owner.Replica || d.Reason != ReasonBounded {
		t.Errorf("owner over bound: got %d %q, want another replica, %q", d.Replica, d.Reason, ReasonBounded)
	}
	// Everyone over the bound (impossible with the +1 rule unless one
	// replica): the owner.
	one := Snapshot{Replicas: []Replica{up("a", 40)}}
	if d := (CHWBL{}).Pick(r, &one); d.Replica != 0 {
		t.Errorf("single replica: got %d, want 0", d.Replica)
	}
}
