package kvevents

// Stop stops following replica r (the router removed it): its connection
// and its goroutines end, Status reports it unknown (so Healthy is false)
// and nothing more of it reaches the index. In bind mode its engine's
// messages are still read by the bind socket and dropped at its full
// queue. Unknown or stopped replicas are ignored; the Subscriber keeps
// following the others.
func (s *Subscriber) Stop(r int) {
	g, ok := s.byID[r]
	if !ok || g.stopped.Swap(true) {
		return
	}
	g.cancel()
}
