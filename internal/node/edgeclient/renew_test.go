package edgeclient

import (
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
