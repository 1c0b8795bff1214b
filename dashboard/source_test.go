package dashboard

import (
	"github.com/kvrouter/kvrouter/view"

	"sync"
	"time"
)

// literal is a Source over literal data that a test may change while a
// server reads it. mu guards fleet and decisions.
type literal struct {
	mu        sync.Mutex
	fleet     view.Fleet
	decisions []view.Decision
}

func (s *literal) Fleet(now time.Time) view.Fleet {
	s.mu.Lock()
	defer s.mu.Unlock()
	f := s.fleet
	f.Replicas = append([]view.Replica(nil), f.Replicas...)
	return f
}

func (s *literal) Decisions(n int) []view.Decision {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]view.Decision(nil), s.decisions[:min(n, len(s.decisions))]...)
}

// update changes the data under the lock.
func (s *literal) update(fn func(f *view.Fleet, ds *[]view.Decision)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fn(&s.fleet, &s.decisions)
}

var t0 = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)

// sample returns a three-replica fleet: a precise-mode replica with a live
// event stream, one falling back to approximate, and one down and never
// scraped; and two decisions, one finished and one in flight.
func sample() *literal {
	return &literal{
		fleet: view.Fleet{
			At: t0, Policy: "kv-aware", Index: "precise", Sessions: 5, Decisions: 2, Requests: 52, RequestsFailed: 1,
			Replicas: []view.Replica{
				{
					ID: "http://10.0.0.1:8000", Healthy: true,
					InFlight: 3, PrefillTokens: 1200, Decoding: 2, DecodeBlocks: 90,
					Running: 3, Waiting: 1, KVUsage: 0.42, Scraped: true, LoadAge: 250 * time.Millisecond,
					CacheBlocks: 4096, IndexBlocks: 1700, Sessions: 3,
					Completed: 40, Failed: 1, PredictedCached: 30000, ActualCached: 28000, PromptTokens: 40000,
					Scale: 1.1, DecodeScale: 1.3, Spread: 0.22, DecodeSpread: 0.25, Horizon: 90 * time.Second,
					Events: &view.Events{Connected: true, LastEvent: 20 * time.Millisecond, Gaps: 1, Replays: 1},
				},
				{
					ID: "http://10.0.0.2:8000", Healthy: true, Draining: true,
					InFlight: 1, Decoding: 1, DecodeBlocks: 30,
					Running: 1, KVUsage: 0.91, Scraped: true, LoadAge: 1500 * time.Millisecond,
					CacheBlocks: 4096, IndexBlocks: 3900, Sessions: 2,
					Completed: 12, PredictedCached: 2000, ActualCached: 2500, PromptTokens: 10000,
					Scale: 0.9, DecodeScale: 0.8,
					Events: &view.Events{Connected: true, LastEvent: 8 * time.Second, Gaps: 4, Replays: 2, Resets: 1, Fallback: true},
				},
				{
					ID:     "http://10.0.0.3:8000",
					Events: &view.Events{LastEvent: -1},
				},
			},
		},
		decisions: []view.Decision{
			{
				ID: "kvr-1-2", At: t0.Add(-time.Second), Session: "alice", Policy: "kv-aware", Model: "m",
				Tokens: 2100, Blocks: 131, Replica: "http://10.0.0.1:8000", Reason: "prefix", TTFTWeight: 2,
				Candidates: []view.Candidate{
					{Replica: "http://10.0.0.1:8000", Matched: 2000, WaitMS: 3.5, PrefillMS: 4.25, DecodeMS: 1, TotalMS: 16.5},
					{Replica: "http://10.0.0.2:8000", Matched: 0, WaitMS: 0.5, PrefillMS: 80, DecodeMS: 0.5, MemoryMS: 12, TotalMS: 173.5},
				},
				PredictedCached: 2000, ActualCached: -1, PromptTokens: -1, PredictedTTFTMS: 8.75, DecideMS: 0.05,
				Outcome: "in-flight",
			},
			{
				ID: "kvr-1-1", At: t0.Add(-2 * time.Second), Session: "bob", Policy: "kv-aware", Model: "m",
				Tokens: 900, Blocks: 56, Replica: "http://10.0.0.2:8000", Reason: "least-cost",
				Failed:          []string{"http://10.0.0.3:8000"},
				PredictedCached: 0, ActualCached: 0, PromptTokens: 910,
				TTFTMS: 41.5, E2EMS: 300.25, Status: 200, Outcome: "ok",
			},
		},
	}
}
