package execution

import (
	"fmt"
	"time"
)

// Response-stall timeout bounds (R4). The Edge carries the selected
// provider's timeout on every run and tunnel as response_stall_timeout_ms.
const (
	// DefaultStallTimeout is what a wire value of 0 means.
	DefaultStallTimeout = 300_000 * time.Millisecond
	// MaxStallTimeoutMillis is the largest valid wire value: one hour.
	MaxStallTimeoutMillis = 3_600_000
)

// StallTimeoutError is a raw response_stall_timeout_ms that is not valid.
// It is reported before any adapter is invoked.
type StallTimeoutError struct{ Millis int64 }

func (e *StallTimeoutError) Error() string {
	return fmt.Sprintf("invalid response_stall_timeout_ms %d: must be 0 (the default, %d) or 1..%d",
		e.Millis, DefaultStallTimeout.Milliseconds(), MaxStallTimeoutMillis)
}

// StallTimeout reads the raw wire value (R4): 0 means DefaultStallTimeout;
// negative or above MaxStallTimeoutMillis is a *StallTimeoutError.
func StallTimeout(millis int64) (time.Duration, error) {
	switch {
	case millis == 0:
		return DefaultStallTimeout, nil
	case millis < 0 || millis > MaxStallTimeoutMillis:
		return 0, &StallTimeoutError{Millis: millis}
	}
	return time.Duration(millis) * time.Millisecond, nil
}
