// Command dev runs an Edge and a Node connected over loopback QUIC, in one
// process, for trying IOP on one machine:
//
//	go run ./edged/dev [--http-addr 127.0.0.1:8080] [--ollama http://127.0.0.1:11434]
//
// It is the production Edge (the same graph as `edged run`) plus a Node
// with the simulator adapter, and Ollama when asked. It is a separate
// command so that the production edged binary links no Node code.
package main

import (
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/alecthomas/kingpin/v2"
	"github.com/quic-go/quic-go"
	"go.uber.org/fx"

	edgeapp "github.com/iop-dev/iop/internal/edge/app"
	"github.com/iop-dev/iop/internal/edge/edgeconfig"
	"github.com/iop-dev/iop/internal/gctarget"
	"github.com/iop-dev/iop/internal/node/agent"
	"github.com/iop-dev/iop/internal/node/nodeconfig"
	"github.com/iop-dev/iop/internal/yamlconf"
	"github.com/iop-dev/iop/plugins/builtin"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "0.1.0-dev"

// flags are the command's flags.
type flags struct {
	httpAddr  string
	quicAddr  string
	logLevel  string
	ollamaURL string
}

// nodeID names the Node that dev runs.
const nodeID = "dev-node"

func main() {
	app := kingpin.New("dev", "Run an Edge and a Node connected over loopback QUIC, for trying IOP on one machine.")
	app.HelpFlag.Short('h')

	var f flags
	run := app.Command("run", "Run the Edge and its Node.").Default()
	run.Flag("http-addr", "Address of the Edge's HTTP API.").Default("127.0.0.1:8080").StringVar(&f.httpAddr)
	run.Flag("quic-addr", "Address of the Edge's QUIC listener (loopback only; port 0 picks one).").Default("127.0.0.1:0").StringVar(&f.quicAddr)
	run.Flag("log-level", "debug, info, warn or error.").Default("info").EnumVar(&f.logLevel, "debug", "info", "warn", "error")
	run.Flag("ollama", "Also serve the Ollama server at this URL (e.g. http://127.0.0.1:11434).").StringVar(&f.ollamaURL)

	// The Node starts its adapters by re-executing this binary with "plugin".
	plugin := app.Command("plugin", "Serve a built-in adapter as a plugin process (the Node starts these itself).").Hidden()
	pluginName := plugin.Arg("adapter", "Built-in adapter: "+strings.Join(builtin.Names(), ", ")+".").Required().String()
	pluginDescribe := plugin.Flag("describe", "Print the adapter's info and capabilities as JSON and exit.").Bool()

	cmd, err := app.Parse(os.Args[1:])
	if err != nil {
		app.FatalUsage("%v", err)
	}
	switch cmd {
	case run.FullCommand():
		gctarget.Apply()
		err = runDev(f)
	case plugin.FullCommand():
		err = builtin.Serve(*pluginName, *pluginDescribe)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "dev:", err)
		os.Exit(1)
	}
}

// runDev runs a loopback Edge with one Node until SIGINT or SIGTERM.
func runDev(f flags) error {
	cfg := edgeconfig.Default()
	cfg.EdgeID = "edge-dev"
	cfg.Listen.QUIC = f.quicAddr
	cfg.Listen.HTTP = f.httpAddr
	cfg.Identity.Mode = yamlconf.ModeLoopback
	cfg.Log.Level = f.logLevel
	if err := cfg.Validate(); err != nil {
		return err
	}
	e, err := edgeapp.Start(cfg,
		fx.Supply(f),
		fx.Provide(newAgent),
		fx.Invoke(func(lc fx.Lifecycle, a *agent.Agent) {
			lc.Append(fx.Hook{OnStart: a.Start, OnStop: a.Stop})
		}),
	)
	if err != nil {
		return err
	}
	printBanner(e, f)
	<-e.Wait()
	return e.Stop()
}

// newAgent is a Node that dials the Edge's bound QUIC address. Its
// provider is the simulator, plus a local Ollama when --ollama is given.
func newAgent(ln *quic.Listener, cfg *edgeconfig.Config, f flags) (*agent.Agent, error) {
	nc := nodeconfig.Default()
	nc.NodeID = nodeID
	nc.Edge.Address = ln.Addr().String()
	nc.Identity.Mode = yamlconf.ModeLoopback
	nc.DrainTimeout = yamlconf.Duration(5 * time.Second)
	nc.Providers = []nodeconfig.Provider{{Name: "sim", Adapter: "simulator", Capacity: 8}}
	if f.ollamaURL != "" {
		nc.Providers = append(nc.Providers, nodeconfig.Provider{Name: "ollama", Adapter: "ollama", Capacity: 4,
			Config: map[string]any{"base_url": f.ollamaURL}})
	}
	for i := range nc.Providers {
		nc.Providers[i].SetDefaults() // relist_interval and the rest, as a file would get them
	}
	if err := nc.Validate(); err != nil {
		return nil, fmt.Errorf("dev node: %w", err)
	}
	return agent.New(nc, agent.Options{Version: version, Logger: cfg.Log.NewLogger(os.Stderr).With("node", nodeID)})
}

// printBanner tells the user what runs and what to do next.
func printBanner(e *edgeapp.Edge, f flags) {
	base := "http://" + e.HTTPAddr().String()
	fmt.Fprintf(os.Stdout, `
IOP dev is running on this machine.
  Edge HTTP API  %[1]s
  Status page    %[1]s/status  (open it in a browser)
  Edge QUIC      %[2]s  (loopback mode: no certificates, this machine only)
  Node           %[3]s, connected to the Edge over loopback QUIC
  Providers      sim (the simulator adapter, model sim-small)%[4]s

Try:
  curl -s %[1]s/v1/chat/completions -H 'Content-Type: application/json' -d '{"model":"sim-small","messages":[{"role":"user","content":"hi"}]}'
  curl -s %[1]s/v1/models
  curl -s %[1]s/admin/v1/nodes     # the Node, its generation, state and heartbeat
  OLLAMA_HOST=%[1]s ollama run sim-small hello
  OpenAI clients: base URL %[1]s/v1 (any API key; this setup is loopback-only)
  Ollama clients: host %[1]s

Connect another Node on this machine:
  go run ./noded run --config configs/node-dev.yaml   # after setting edge.address: %[2]s

Stop with Ctrl-C.
`, base, e.QUICAddr(), nodeID, ollamaLine(f))
}

func ollamaLine(f flags) string {
	if f.ollamaURL == "" {
		return "\n                 (add --ollama http://127.0.0.1:11434 to serve a local Ollama too)"
	}
	return ", and ollama at " + f.ollamaURL
}
