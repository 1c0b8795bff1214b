package proxy

import (
	"time"

	"github.com/kvrouter/kvrouter/view"
)

// View returns a copy of the router's state at now: the fleet's view plus
// what only the data plane knows (the policy, the hashing mode, scrape
// errors, KV-event streams).
func (rt *Router) View(now time.Time) view.Fleet {
	v := rt.st.fleet.View(now)
	v.Policy, v.Hash = rt.policyName, rt.st.hasher.Mode()
	v.Decisions = rt.decisions.count()
	v.Requests, v.RequestsFailed = rt.requests.Load(), rt.requestsFailed.Load()
	for i := range v.Replicas {
		r := &v.Replicas[i]
		if s, ok := rt.st.scraper.Status(r.ID); ok {
			r.ScrapeErrors = s.Errors
			r.Engine = rt.st.engineOf(r.ID)
			if s.Err != nil {
				r.ScrapeError = s.Err.Error()
			}
		}
		if p := rt.st.feed; p != nil {
			r.Events = p.view(rt.st.fleet.At(r.ID), now)
		}
	}
	return v
}

// dashSource is the dashboard's view of the router (dashboard.Source).
type dashSource struct{ rt *Router }

// Fleet implements dashboard.Source.
func (s dashSource) Fleet(now time.Time) view.Fleet { return s.rt.View(now) }

// Decisions implements dashboard.Source.
func (s dashSource) Decisions(n int) []view.Decision { return s.rt.Decisions(n) }
