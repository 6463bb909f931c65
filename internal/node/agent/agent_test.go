package agent

import (
	"encoding/json"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/iop-dev/iop/internal/node/execution"
	"github.com/iop-dev/iop/internal/node/nodeconfig"
	"github.com/iop-dev/iop/internal/yamlconf"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

func loopbackConfig() *nodeconfig.Config {
	cfg := nodeconfig.Default()
	cfg.NodeID = "n1"
	cfg.Edge.Address = "127.0.0.1:7443"
	cfg.Identity.Mode = yamlconf.ModeLoopback
	return cfg
}

// Configured providers are reported starting until their plugin is up.
func TestProvidersAreReportedFromTheConfig(t *testing.T) {
	cfg := loopbackConfig()
	cfg.Providers = []nodeconfig.Provider{{Name: "sim", Adapter: "simulator", Targets: []string{"sim-small"}, Capacity: 2}}
	a, err := New(cfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	ps := a.Providers().Snapshot()
	if len(ps) != 1 || ps[0].GetName() != "sim" || ps[0].GetCapacity() != 2 || ps[0].GetState() != wirepb.ProviderState_PROVIDER_STATE_STARTING {
		t.Errorf("providers = %v", ps)
	}
}

// An adapter that is neither built in nor external is refused at start.
func TestUnknownBuiltinAdapterIsRefused(t *testing.T) {
	cfg := loopbackConfig()
	cfg.Providers = []nodeconfig.Provider{{Name: "x", Adapter: "nope", Capacity: 1}}
	if _, err := New(cfg, Options{}); err == nil || !strings.Contains(err.Error(), `no built-in adapter "nope"`) {
		t.Errorf("New = %v", err)
	}
}

// A managed Node fails at start when its identity files are missing.
func TestManagedNodeChecksItsIdentityFiles(t *testing.T) {
	cfg := nodeconfig.Default()
	cfg.NodeID = "n1"
	cfg.Edge.Address = "edge.example:7443"
	cfg.Identity.CAFile = "/nonexistent/ca.pem"
	cfg.Identity.CertFile, cfg.Identity.KeyFile = "/nonexistent/c.pem", "/nonexistent/k.pem"
	if _, err := New(cfg, Options{}); err == nil || !strings.Contains(err.Error(), "/nonexistent/ca.pem") {
		t.Errorf("New with missing identity files: %v", err)
	}
}

// P1: a provider built in code with no relist interval (edged/dev's Node)
// gets the runtime's default, which must be the one a file gets.
func TestRelistIntervalDefaultsAgree(t *testing.T) {
	if nodeconfig.DefaultRelistInterval != execution.DefaultRelistInterval {
		t.Errorf("nodeconfig.DefaultRelistInterval %v, execution.DefaultRelistInterval %v", nodeconfig.DefaultRelistInterval, execution.DefaultRelistInterval)
	}
}

// The health listener serves the Node's metrics: its providers from the
// config, with their counters at zero before any work.
func TestHealthHandlerServesTheNodesMetrics(t *testing.T) {
	cfg := loopbackConfig()
	cfg.Providers = []nodeconfig.Provider{{Name: "sim", Adapter: "simulator", Targets: []string{"sim-small"}, Capacity: 2}}
	a, err := New(cfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	a.HealthHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Code != 200 {
		t.Fatalf("GET /metrics: %d", rec.Code)
	}
	for _, want := range []string{
		`iop_node_provider_capacity{provider="sim"} 2`,
		`iop_node_provider_online{provider="sim"} 0`,
		`iop_node_provider_slots_in_use{provider="sim"} 0`,
		`iop_node_plugin_circuit{provider="sim",state="closed"} 1`,
		`iop_node_calls_total{kind="run",outcome="completed",provider="sim"} 0`,
		`iop_node_edge_connections_total 0`,
		`go_goroutines`,
	} {
		if !strings.Contains(rec.Body.String(), want) {
			t.Errorf("/metrics lacks %s:\n%s", want, rec.Body)
		}
	}
}

// Issue 22: a Node given several Edge addresses keeps a connection to
// each; /edges lists them all, and /readyz says where each one is while
// none is ready.
func TestEveryEdgeAddressIsAConnection(t *testing.T) {
	cfg := loopbackConfig()
	cfg.Edge.Addresses = []string{"127.0.0.1:7444", "localhost:7445"}
	a, err := New(cfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	a.HealthHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/edges", nil))
	var edges []struct {
		Addr  string `json:"addr"`
		Seed  bool   `json:"seed"`
		State string `json:"state"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &edges); err != nil {
		t.Fatalf("GET /edges: %v: %s", err, rec.Body)
	}
	var addrs []string
	for _, e := range edges {
		if !e.Seed || e.State != "connecting" {
			t.Errorf("edge %+v: want a seed, connecting", e)
		}
		addrs = append(addrs, e.Addr)
	}
	if want := []string{"127.0.0.1:7443", "127.0.0.1:7444", "localhost:7445"}; !slices.Equal(addrs, want) {
		t.Errorf("edges %q, want %q", addrs, want)
	}
	err = a.Ready()
	if err == nil || !strings.Contains(err.Error(), "127.0.0.1:7444: connecting") {
		t.Errorf("Ready before any connection: %v", err)
	}
}

// Loopback mode authenticates no Edge: it dials loopback addresses only,
// every seed included.
func TestLoopbackRefusesARemoteEdgeAddress(t *testing.T) {
	cfg := loopbackConfig()
	cfg.Edge.Addresses = []string{"10.0.0.2:7443"}
	if _, err := New(cfg, Options{}); err == nil || !strings.Contains(err.Error(), `not "10.0.0.2:7443"`) {
		t.Errorf("New with a remote edge in loopback mode: %v", err)
	}
}
