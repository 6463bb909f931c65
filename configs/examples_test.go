package configs_test

import (
	"path/filepath"
	"strings"
	"testing"

	edge "github.com/iop-dev/iop/internal/edge/edgeconfig"
	node "github.com/iop-dev/iop/internal/node/nodeconfig"
)

// TestExamplesAreValid loads every example with its daemon's loader: edge*.yaml with edged's,
// node*.yaml with noded's. An example that drifts from the config structs fails here.
func TestExamplesAreValid(t *testing.T) {
	files, err := filepath.Glob("*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 4 {
		t.Fatalf("found %d examples (%q), want at least the dev and managed ones for each daemon", len(files), files)
	}
	for _, file := range files {
		t.Run(file, func(t *testing.T) {
			switch {
			case strings.HasPrefix(file, "edge"):
				if _, err := edge.Load(file); err != nil {
					t.Error(err)
				}
			case strings.HasPrefix(file, "node"):
				if _, err := node.Load(file); err != nil {
					t.Error(err)
				}
			default:
				t.Errorf("%s: name it edge*.yaml or node*.yaml so this test knows its daemon", file)
			}
		})
	}
}

// TestDevExamplesMatchTheQuickstart pins what the dev pair promises: both on loopback, the Node
// dialling the Edge's QUIC address, one simulator provider serving sim-small.
func TestDevExamplesMatchTheQuickstart(t *testing.T) {
	e, err := edge.Load("edge-dev.yaml")
	if err != nil {
		t.Fatal(err)
	}
	n, err := node.Load("node-dev.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if e.Identity.Mode != "loopback" || n.Identity.Mode != "loopback" {
		t.Errorf("modes %q and %q, want loopback", e.Identity.Mode, n.Identity.Mode)
	}
	if n.Edge.Address != e.Listen.QUIC {
		t.Errorf("node dials %q, edge listens on %q", n.Edge.Address, e.Listen.QUIC)
	}
	if len(n.Providers) != 1 {
		t.Fatalf("providers = %+v, want one", n.Providers)
	}
	p := n.Providers[0]
	if p.Adapter != node.AdapterSimulator || len(p.Targets) != 1 || p.Targets[0] != "sim-small" || p.Capacity != 4 {
		t.Errorf("provider %+v, want a simulator serving sim-small with capacity 4", p)
	}
}

// TestManagedExamplesUseMTLS pins the managed pair: mtls on both sides, in the same trust domain,
// and an ollama provider whose base_url reaches the adapter untouched.
func TestManagedExamplesUseMTLS(t *testing.T) {
	e, err := edge.Load("edge-managed.yaml")
	if err != nil {
		t.Fatal(err)
	}
	n, err := node.Load("node-managed.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if e.Identity.Mode != "mtls" || n.Identity.Mode != "mtls" || e.Identity.TrustDomain != n.Identity.TrustDomain {
		t.Errorf("identities %+v and %+v, want mtls in one trust domain", e.Identity, n.Identity)
	}
	if n.Identity.EdgeID != e.EdgeID {
		t.Errorf("node expects edge %q, edge is %q", n.Identity.EdgeID, e.EdgeID)
	}
	if len(n.Providers) == 0 || n.Providers[0].Adapter != node.AdapterOllama || n.Providers[0].Config["base_url"] == nil {
		t.Errorf("providers %+v, want an ollama provider with config.base_url", n.Providers)
	}
}
