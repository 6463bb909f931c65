package main

import (
	"testing"

	"go.uber.org/fx"

	"github.com/iop-dev/iop/configs"
	"github.com/iop-dev/iop/edged/config"
)

// The Edge's fx graph is complete and acyclic, in both run and dev shapes.
func TestEdgeGraphIsValid(t *testing.T) {
	cfg := config.Default()
	cfg.Identity.Mode = configs.ModeLoopback
	cfg.Listen.QUIC = "127.0.0.1:0"
	if err := fx.ValidateApp(edgeModule(cfg)); err != nil {
		t.Fatalf("edge graph: %v", err)
	}
	if err := fx.ValidateApp(edgeModule(cfg), fx.Supply(devFlags{}), fx.Provide(newDevAgent), fx.Invoke(startDevAgent, printDevBanner)); err != nil {
		t.Fatalf("dev graph: %v", err)
	}
}
