package proxy

import (
	"sync"
	"time"

	"kvrouter/prefix"
)

// index is the router's approximate residency index: block hash → when
// each replica was last sent it (unix ns, 0 = never). It is fed only by
// routing decisions. Memory is bounded by max entries: past it the index
// starts over (a crude bound; package residency's per-replica LRU sized
// from the engines' cache_config_info replaces it).
type index struct {
	n   int
	max int

	mu sync.RWMutex // guards m
	m  map[prefix.Hash][]int64
}

// match fills match[r] with the leading blocks of hashes resident on r and
// age[r] with how long ago the deepest of them was touched, in one walk.
func (x *index) match(hashes []prefix.Hash, now time.Time, match []int, age []time.Duration) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	ns := now.UnixNano()
	for i, h := range hashes {
		e := x.m[h]
		if e == nil {
			return
		}
		any := false
		for r := range x.n {
			if match[r] == i && e[r] != 0 {
				match[r] = i + 1
				age[r] = time.Duration(max(ns-e[r], 0))
				any = true
			}
		}
		if !any {
			return
		}
	}
}

// touch records that replica r was sent hashes at now.
func (x *index) touch(r int, hashes []prefix.Hash, now time.Time) {
	ns := now.UnixNano()
	x.mu.Lock()
	defer x.mu.Unlock()
	if len(x.m)+len(hashes) > x.max {
		clear(x.m)
	}
	for _, h := range hashes {
		e := x.m[h]
		if e == nil {
			e = make([]int64, x.n)
			x.m[h] = e
		}
		e[r] = ns
	}
}
