package app

import (
	"context"
	"time"
)

// drainPoll is how often a draining Edge looks at the work it still
// carries.
const drainPoll = 100 * time.Millisecond

// Drain is a planned stop's first half (issue 22): the Edge takes no new
// work (new requests are answered 503 edge_stopping with Retry-After in
// their API's shape, and /readyz answers 503 so that a load balancer takes
// the Edge out), tells its Nodes and the cluster's other Edges it is
// stopping, and waits for the work
// it carries to end, until ctx is done (edgeconfig's shutdown_grace, or a
// second signal). Stop then closes what is left: streams still running
// end with an error in their API's form. LLM streams last minutes, so the
// default grace is ten minutes, not the thirty seconds of a web server.
func (e *Edge) Drain(ctx context.Context) {
	e.http.stopping.Store(true)
	e.front.StopAccepting()
	e.nodes.Stopping("edge stopping")
	e.clust.MarkStopping()
	n := e.runs.Live()
	deadline, _ := ctx.Deadline()
	e.log.Info("stopping: no new work; waiting for the work in flight", "in_flight", n, "until", deadline)
	t := time.NewTicker(drainPoll)
	defer t.Stop()
	for n > 0 {
		select {
		case <-ctx.Done():
			e.log.Warn("stopping: the grace is over; ending the work still in flight", "in_flight", n)
			return
		case <-t.C:
		}
		n = e.runs.Live()
	}
	e.log.Info("stopping: the work in flight is done")
}
