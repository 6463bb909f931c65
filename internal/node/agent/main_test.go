package agent

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if any goroutine outlives its tests: a
// stopped agent leaves no connection, provider supervisor or plugin
// goroutine behind.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
