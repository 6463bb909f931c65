package edgeclient

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if any goroutine outlives its tests. No
// goroutine is ignored: quic-go starts none at package level. The Client's
// connection goroutines are leak-checked against a real Edge in
// internal/edge/nodeserver, whose harness runs this package's Client.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
