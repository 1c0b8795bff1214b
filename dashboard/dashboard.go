// Package dashboard is the router's live web page: an http.Handler that
// serves GET /ui (an embedded HTML page, CSS and a small vanilla script; no
// CDN, works offline) and a small JSON API under /ui/api that the page polls
// once a second. It is a view of what a Source returns and holds no routing
// logic: the handler only converts units and sums replicas into totals, the
// page only draws.
//
// The JSON API is documented field by field in API.md.
package dashboard

import (
	"time"

	"github.com/kvrouter/kvrouter/view"
)

// Source is what the dashboard shows. The router implements it (the
// dashboard does not import the proxy; the proxy imports the dashboard to
// mount it). Both methods are called from HTTP handlers and must be safe
// for concurrent use; they return copies the dashboard may keep.
type Source interface {
	// Fleet returns the fleet as it is at now.
	Fleet(now time.Time) view.Fleet
	// Decisions returns up to n recent routing decisions, newest first.
	Decisions(n int) []view.Decision
}
