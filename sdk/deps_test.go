package sdk_test

import (
	"os/exec"
	"strings"
	"testing"
)

// The SDK stays host-neutral and small for adapter authors: neither it, the
// plugin host nor the conformance kit pulls in the transport (quic-go, or
// quicwire, which wraps it; quicwire/wirepb holds only generated protobuf
// types and is fine), the daemons' wiring or CLI libraries, or the daemons
// themselves.
func TestSDKImportsNoTransportWiringOrDaemon(t *testing.T) {
	forbidden := []string{
		"github.com/quic-go/quic-go",
		"go.uber.org/fx",
		"go.uber.org/dig",
		"github.com/alecthomas/kingpin",
		"github.com/iop-dev/iop/edged",
		"github.com/iop-dev/iop/noded",
		"github.com/iop-dev/iop/internal/edge",
		"github.com/iop-dev/iop/internal/node",
		"github.com/iop-dev/iop/plugins",
	}
	for _, pkg := range []string{"github.com/iop-dev/iop/sdk", "github.com/iop-dev/iop/internal/pluginhost", "github.com/iop-dev/iop/sdk/sdktest"} {
		out, err := exec.Command("go", "list", "-deps", pkg).Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", pkg, err)
		}
		for _, dep := range strings.Fields(string(out)) {
			for _, f := range forbidden {
				if dep == f || strings.HasPrefix(dep, f+"/") {
					t.Errorf("%s depends on %s", pkg, dep)
				}
			}
			quicwire := "github.com/iop-dev/iop/quicwire"
			if (dep == quicwire || strings.HasPrefix(dep, quicwire+"/")) && dep != quicwire+"/wirepb" {
				t.Errorf("%s depends on %s (only quicwire/wirepb is allowed)", pkg, dep)
			}
		}
	}
}
