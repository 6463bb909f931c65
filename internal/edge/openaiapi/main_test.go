package openaiapi

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if a test leaves a goroutine behind: a
// handler that outlives its request, or a run nobody ended.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
