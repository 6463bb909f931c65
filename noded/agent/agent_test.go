package agent

import (
	"strings"
	"testing"
	"time"

	"github.com/iop-dev/iop/configs"
	"github.com/iop-dev/iop/noded/config"
	"github.com/iop-dev/iop/quicwire"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

func testAgent(t *testing.T) *Agent {
	t.Helper()
	cfg := config.Default()
	cfg.NodeID = "n1"
	cfg.Edge.Address = "127.0.0.1:7443"
	cfg.Identity.Mode = configs.ModeLoopback
	cfg.Providers = []config.Provider{{Name: "sim", Adapter: "simulator", Targets: []string{"sim-small"}, Capacity: 2}}
	a, err := New(cfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// R10: commands are a closed set; anything else is a clear error.
func TestCommandsAreAClosedSet(t *testing.T) {
	h := &handler{agent: testAgent(t)}
	sess := quicwire.NewSession("n1", 7, time.Unix(0, 0))
	caps := h.command(sess, &wirepb.CommandRequest{CommandId: "c1", SessionId: "s", Kind: wirepb.CommandKind_COMMAND_KIND_CAPABILITIES})
	if caps.GetCommandId() != "c1" || caps.GetSessionId() != "s" || len(caps.GetProviders()) != 1 || caps.GetFailure() != nil {
		t.Errorf("capabilities = %v", caps)
	}
	st := h.command(sess, &wirepb.CommandRequest{CommandId: "c2", Kind: wirepb.CommandKind_COMMAND_KIND_TRANSPORT_STATUS})
	if ts := st.GetTransportStatus(); ts.GetNodeId() != "n1" || ts.GetGeneration() != 7 {
		t.Errorf("transport status = %v", st)
	}
	bad := h.command(sess, &wirepb.CommandRequest{CommandId: "c3", Kind: wirepb.CommandKind(99)})
	if f := bad.GetFailure(); f.GetKind() != wirepb.FailureKind_FAILURE_KIND_UNSUPPORTED || !strings.Contains(f.GetMessage(), "unknown command kind 99") {
		t.Errorf("unknown command = %v", bad)
	}
}

// Configured providers are reported, but offline until adapters run.
func TestConfiguredProvidersAreReportedOffline(t *testing.T) {
	ps := configuredProviders(testAgent(t).cfg)
	if len(ps) != 1 || ps[0].GetState() != wirepb.ProviderState_PROVIDER_STATE_OFFLINE || ps[0].GetTargets()[0].GetName() != "sim-small" {
		t.Errorf("providers = %v", ps)
	}
}

// A managed Node whose certificate names another node fails at start, not
// at the Edge.
func TestManagedNodeChecksItsOwnCertificate(t *testing.T) {
	cfg := config.Default()
	cfg.NodeID = "n1"
	cfg.Edge.Address = "edge.example:7443"
	cfg.Identity.CAFile = "/nonexistent/ca.pem"
	cfg.Identity.CertFile, cfg.Identity.KeyFile = "/nonexistent/c.pem", "/nonexistent/k.pem"
	if _, err := New(cfg, Options{}); err == nil || !strings.Contains(err.Error(), "/nonexistent/ca.pem") {
		t.Errorf("New with missing identity files: %v", err)
	}
}
