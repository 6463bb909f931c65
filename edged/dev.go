package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/quic-go/quic-go"
	"go.uber.org/fx"

	"github.com/iop-dev/iop/configs"
	"github.com/iop-dev/iop/edged/config"
	"github.com/iop-dev/iop/noded/agent"
	nodeconfig "github.com/iop-dev/iop/noded/config"
)

// devFlags are the flags of `edged dev`.
type devFlags struct {
	httpAddr  string
	quicAddr  string
	logLevel  string
	ollamaURL string
}

// devNodeID names the Node that `edged dev` runs.
const devNodeID = "dev-node"

// runDev runs an Edge in loopback mode and a Node connected to it over
// loopback QUIC, in one process: the single-machine setup.
func runDev(flags devFlags) error {
	cfg := config.Default()
	cfg.EdgeID = "edge-dev"
	cfg.Listen.QUIC = flags.quicAddr
	cfg.Listen.HTTP = flags.httpAddr
	cfg.Identity.Mode = configs.ModeLoopback
	cfg.Log.Level = flags.logLevel
	if err := cfg.Validate(); err != nil {
		return err
	}
	return runApp(
		edgeModule(cfg),
		fx.Supply(flags),
		fx.Provide(newDevAgent),
		fx.Invoke(startDevAgent, printDevBanner),
	)
}

// newDevAgent is a Node that dials the Edge's bound QUIC address.
// Its provider is the simulator, plus a local Ollama when --ollama is given.
func newDevAgent(ln *quic.Listener, cfg *config.Config, flags devFlags) (*agent.Agent, error) {
	nc := nodeconfig.Default()
	nc.NodeID = devNodeID
	nc.Edge.Address = ln.Addr().String()
	nc.Identity.Mode = configs.ModeLoopback
	nc.DrainTimeout = configs.Duration(5 * time.Second)
	nc.Providers = []nodeconfig.Provider{{Name: "sim", Adapter: "simulator", Capacity: 8}}
	if flags.ollamaURL != "" {
		nc.Providers = append(nc.Providers, nodeconfig.Provider{Name: "ollama", Adapter: "ollama", Capacity: 4,
			Config: map[string]any{"base_url": flags.ollamaURL}})
	}
	for i := range nc.Providers {
		nc.Providers[i].SetDefaults() // relist_interval and the rest, as a file would get them
	}
	if err := nc.Validate(); err != nil {
		return nil, fmt.Errorf("dev node: %w", err)
	}
	return agent.New(nc, agent.Options{Version: version, Logger: cfg.Log.NewLogger(os.Stderr).With("node", devNodeID)})
}

func startDevAgent(lc fx.Lifecycle, a *agent.Agent) {
	lc.Append(fx.Hook{OnStart: a.Start, OnStop: a.Stop})
}

// printDevBanner tells the user what runs and what to do next.
func printDevBanner(lc fx.Lifecycle, h *httpServer, ln *quic.Listener, flags devFlags) {
	lc.Append(fx.StartHook(func(context.Context) {
		base := "http://" + h.bound.String()
		fmt.Fprintf(os.Stdout, `
IOP dev is running on this machine.
  Edge HTTP API  %[1]s
  Edge QUIC      %[2]s  (loopback mode: no certificates, this machine only)
  Node           %[3]s, connected to the Edge over loopback QUIC
  Providers      sim (the simulator adapter, model sim-small)%[4]s

Try:
  curl -s %[1]s/v1/chat/completions -d '{"model":"sim-small","messages":[{"role":"user","content":"hi"}]}'
  curl -s %[1]s/v1/models
  curl -s %[1]s/admin/v1/nodes     # the Node, its generation, state and heartbeat
  OLLAMA_HOST=%[1]s ollama run sim-small hello
  OpenAI clients: base URL %[1]s/v1 (any API key; this setup is loopback-only)
  Ollama clients: host %[1]s

Connect another Node on this machine:
  go run ./noded run --config configs/node-dev.yaml   # after setting edge.address: %[2]s

Stop with Ctrl-C.
`, base, ln.Addr(), devNodeID, ollamaLine(flags))
	}))
}

func ollamaLine(flags devFlags) string {
	if flags.ollamaURL == "" {
		return "\n                 (add --ollama http://127.0.0.1:11434 to serve a local Ollama too)"
	}
	return ", and ollama at " + flags.ollamaURL
}
