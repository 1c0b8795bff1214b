package health

import (
	"time"

	"kvrouter/poll"
)

// offset is the delay before a replica's first probe.
func offset(id string, interval time.Duration) time.Duration { return poll.Offset(id, interval) }
