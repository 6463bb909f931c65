package edgeclient

import (
	"math/rand/v2"
	"time"
)

// Backoff is the reconnect policy: exponential from Initial up to Max, with
// jitter so a fleet of Nodes that lost the same Edge does not come back in
// lockstep.
type Backoff struct {
	Initial time.Duration
	Max     time.Duration
}

// DefaultBackoff is used when Options.Backoff is zero.
var DefaultBackoff = Backoff{Initial: 500 * time.Millisecond, Max: 30 * time.Second}

// Delay is the wait before reconnect attempt n (0-based): a uniformly
// random duration in [d/2, d], where d = min(Max, Initial·2ⁿ).
func (b Backoff) Delay(n int) time.Duration {
	d := b.Initial
	for i := 0; i < n && d < b.Max; i++ {
		d *= 2
	}
	d = min(d, b.Max)
	half := d / 2
	return half + rand.N(d-half+1)
}
