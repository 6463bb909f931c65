package main

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/iop-dev/iop/internal/node/nodeconfig"
	"github.com/iop-dev/iop/internal/yamlconf"
)

// testConfig is a Node with no providers whose Edge is not there: it keeps
// trying to connect until it is stopped.
func testConfig(t *testing.T) *nodeconfig.Config {
	cfg := nodeconfig.Default()
	cfg.NodeID = "n1"
	cfg.Edge.Address = "127.0.0.1:1"
	cfg.Identity.Mode = yamlconf.ModeLoopback
	cfg.DrainTimeout = yamlconf.Duration(time.Second)
	cfg.Log.Level = "error"
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// The Node runs until its context ends, then stops its parts and returns.
func TestRunStopsWhenItsContextEnds(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	stopped := make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- run(ctx, testConfig(t), "127.0.0.1:0", func() { close(stopped) }) }()
	select {
	case err := <-done:
		t.Fatalf("run returned before its context ended: %v", err)
	case <-time.After(100 * time.Millisecond): // still running, as it should
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
	select {
	case <-stopped:
	default:
		t.Fatal("run did not call stopped")
	}
}

// A health address that cannot be bound fails the start, after stopping
// the agent that had started.
func TestRunFailsOnABusyHealthAddress(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	err = run(t.Context(), testConfig(t), busy.Addr().String(), nil)
	if err == nil || !strings.Contains(err.Error(), "health endpoints") {
		t.Fatalf("run = %v, want the health endpoints' bind error", err)
	}
}
