package proxy

import (
	"context"
	"fmt"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvrouter/kvrouter/peers"
)

// newShared returns the syncer that shares the fleet's view with the other
// routers through Config.Peers (package peers), or nil without a Redis URL.
func (rt *Router) newShared(reg prometheus.Registerer) (*peers.Syncer, error) {
	if rt.cfg.Peers.URL == "" {
		return nil, nil
	}
	s, err := peers.New(peers.Config{Settings: rt.cfg.Peers, Logger: rt.log, Registry: reg, Now: rt.now,
		ApplyMembers: rt.applyMembers}, rt.st.fleet)
	if err != nil {
		return nil, fmt.Errorf("shared state: %w", err)
	}
	return s, nil
}

// runShared runs the shared-state syncer, when there is one, beside run,
// until ctx is done.
func (rt *Router) runShared(ctx context.Context, run func(context.Context) error) error {
	if rt.shared == nil {
		return run(ctx)
	}
	var wg sync.WaitGroup
	wg.Go(func() { rt.shared.Run(ctx) })
	err := run(ctx)
	wg.Wait()
	return err
}

// Shared returns the shared-state syncer, nil without Config.Peers.URL.
func (rt *Router) Shared() *peers.Syncer { return rt.shared }
