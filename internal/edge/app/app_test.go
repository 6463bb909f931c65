package app

import (
	"testing"

	"go.uber.org/fx"

	"github.com/iop-dev/iop/internal/edge/edgeconfig"
	"github.com/iop-dev/iop/internal/yamlconf"
)

// The Edge's fx graph is complete and acyclic.
func TestEdgeGraphIsValid(t *testing.T) {
	cfg := edgeconfig.Default()
	cfg.Identity.Mode = yamlconf.ModeLoopback
	cfg.Listen.QUIC = "127.0.0.1:0"
	if err := fx.ValidateApp(Module(cfg)); err != nil {
		t.Fatalf("edge graph: %v", err)
	}
}
