package frontend

import "time"

// A stopping Edge (issue 22: planned stops drain) takes no new work: every
// request that arrives after StopAccepting is answered 503 edge_stopping
// with Retry-After, in its API's own shape, so that a client retries and
// its retry lands on another Edge of the cluster (behind a load balancer
// or DNS round robin), while the work already in flight runs to its end.

// StopRetryAfter is the Retry-After of a request refused by a stopping
// Edge: another Edge can take it at once.
const StopRetryAfter = time.Second

// StopAccepting makes the front end refuse every new request from now on.
// Requests already past authentication go on.
func (f *Front) StopAccepting() { f.stopping.Store(true) }

// Stopping reports whether StopAccepting was called.
func (f *Front) Stopping() bool { return f.stopping.Load() }

// refuseWhileStopping is the failure of a request that arrives while the
// Edge is stopping, nil otherwise.
func (f *Front) refuseWhileStopping() *Failure {
	if !f.stopping.Load() {
		return nil
	}
	fl := fail("edge_stopping", "this Edge is stopping and takes no new work; retry, and another Edge of the cluster will answer")
	fl.RetryAfter = StopRetryAfter
	return fl
}
