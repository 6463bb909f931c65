package edgeclient

import (
	"testing"
	"time"
)

// R9: reconnect waits grow exponentially up to the cap, with jitter in
// [d/2, d] so a fleet does not reconnect in lockstep.
func TestBackoffGrowsExponentiallyWithJitterUpToTheCap(t *testing.T) {
	b := Backoff{Initial: 500 * time.Millisecond, Max: 30 * time.Second}
	for n, full := range []time.Duration{
		500 * time.Millisecond, time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second,
		16 * time.Second, 30 * time.Second, 30 * time.Second, 30 * time.Second,
	} {
		seen := map[time.Duration]bool{}
		for range 200 {
			d := b.Delay(n)
			if d < full/2 || d > full {
				t.Fatalf("attempt %d: delay %v outside [%v, %v]", n, d, full/2, full)
			}
			seen[d] = true
		}
		if len(seen) < 50 {
			t.Errorf("attempt %d: only %d distinct delays in 200: no jitter", n, len(seen))
		}
	}
	if d := b.Delay(1000); d > b.Max {
		t.Errorf("attempt 1000: %v above the cap", d)
	}
}
