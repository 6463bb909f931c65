package main

import (
	"testing"

	"go.uber.org/fx"

	"github.com/iop-dev/iop/internal/node/nodeconfig"
	"github.com/iop-dev/iop/internal/yamlconf"
)

// The Node's fx graph is complete and acyclic.
func TestNodeGraphIsValid(t *testing.T) {
	cfg := nodeconfig.Default()
	cfg.NodeID = "n1"
	cfg.Edge.Address = "127.0.0.1:7443"
	cfg.Identity.Mode = yamlconf.ModeLoopback
	if err := fx.ValidateApp(nodeModule(cfg, runFlags{healthAddr: "127.0.0.1:0"})); err != nil {
		t.Fatalf("node graph: %v", err)
	}
}
