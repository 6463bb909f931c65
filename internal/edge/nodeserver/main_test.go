package nodeserver_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if any goroutine outlives its tests: every
// goroutine of an Edge connection (nodeConn) and of a Node client is owned
// by something the harness stops. No goroutine is ignored: quic-go starts
// none at package level (a Transport's and a Conn's goroutines end when
// they are closed), and a synctest bubble's goroutines must end with the
// bubble anyway.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
