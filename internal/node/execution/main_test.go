package execution

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if any goroutine outlives its tests: a
// provider call's goroutine, its watchdog's timer and probe, a run's cancel
// watcher and a tunnel's body reader all end with the call or its stream.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
