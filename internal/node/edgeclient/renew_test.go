package edgeclient

import (
	"errors"
	"testing"
	"time"
)

func TestRenewalIsDueAtTwoThirdsOfTheLifetime(t *testing.T) {
	nb := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	if got, want := renewAt(nb, nb.Add(24*time.Hour)), nb.Add(16*time.Hour); !got.Equal(want) {
		t.Errorf("renewAt = %s, want %s", got, want)
	}
	for _, tc := range []struct {
		left, want time.Duration
	}{
		{8 * time.Hour, maxRenewRetry}, // a tenth of 8h is more than the cap
		{10 * time.Minute, time.Minute},
		{3 * time.Second, minRenewRetry}, // never a busy loop
		{-time.Hour, minRenewRetry},      // expired: keep trying on this connection
	} {
		if got := renewRetry(nb.Add(tc.left), nb); got != tc.want {
			t.Errorf("renewRetry with %s left = %s, want %s", tc.left, got, tc.want)
		}
	}
}

// A renewal the Edge defers (its per-Node rate limit, issue 24 gap 7) is
// asked again when the Edge says, never past the certificate's expiry;
// any other failure follows the Node's own rule.
func TestADeferredRenewalWaitsAsTheEdgeSays(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	na := now.Add(8 * time.Hour)
	if got, deferred := retryWait(renewErr{reason: "too soon", retryAfter: 10 * time.Minute}, na, now); got != 10*time.Minute || !deferred {
		t.Errorf("deferred 10m: wait %s (deferred %t)", got, deferred)
	}
	if got, _ := retryWait(renewErr{reason: "too soon", retryAfter: 10 * time.Hour}, na, now); got != 8*time.Hour {
		t.Errorf("deferred past the expiry: wait %s, want 8h", got)
	}
	if got, deferred := retryWait(renewErr{reason: "refused"}, na, now); got != maxRenewRetry || deferred {
		t.Errorf("plain refusal: wait %s (deferred %t), want the Node's rule", got, deferred)
	}
	if got, _ := retryWait(errors.New("stream reset"), na, now); got != maxRenewRetry {
		t.Errorf("network error: wait %s", got)
	}
}
