// Command edged is the IOP Edge: the one reachable address that clients
// talk to and Nodes dial. It registers Nodes, keeps their heartbeats, and
// dispatches work to them over QUIC.
//
//	edged run --config edge.yaml               run the Edge
//	edged dev [--http-addr 127.0.0.1:8080]     an Edge and a Node on this machine, in one command
//	edged tls ca create / tls cert create      make a CA and certificates for managed mode
//	edged config check edge.yaml               validate a configuration file
//	edged version                              print the version
package main

import (
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/alecthomas/kingpin/v2"

	"github.com/iop-dev/iop/plugins/builtin"

	"github.com/iop-dev/iop/edged/config"
	"github.com/iop-dev/iop/edged/tlscli"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "0.1.0-dev"

func main() {
	app := kingpin.New("edged", "The IOP Edge: sends LLM work to Nodes next to the model servers.")
	app.HelpFlag.Short('h')

	run := app.Command("run", "Run the Edge.").Default()
	configPath := run.Flag("config", "Edge configuration file (YAML).").Short('c').Required().String()

	dev := app.Command("dev", "Run an Edge and a Node connected over loopback QUIC, for trying IOP on one machine.")
	var devFlags devFlags
	dev.Flag("http-addr", "Address of the Edge's HTTP API.").Default("127.0.0.1:8080").StringVar(&devFlags.httpAddr)
	dev.Flag("quic-addr", "Address of the Edge's QUIC listener (loopback only; port 0 picks one).").Default("127.0.0.1:0").StringVar(&devFlags.quicAddr)
	dev.Flag("log-level", "debug, info, warn or error.").Default("info").EnumVar(&devFlags.logLevel, "debug", "info", "warn", "error")
	dev.Flag("ollama", "Also serve the Ollama server at this URL (e.g. http://127.0.0.1:11434).").StringVar(&devFlags.ollamaURL)

	tlscli.Register(app)

	check := app.Command("config", "Configuration tools.").Command("check", "Validate a configuration file and exit.")
	checkPath := check.Arg("file", "Edge configuration file.").Required().String()

	versionCmd := app.Command("version", "Print the version.")

	plugin := app.Command("plugin", "Serve a built-in adapter as a plugin process (the Node starts these itself).").Hidden()
	pluginName := plugin.Arg("adapter", "Built-in adapter: "+strings.Join(builtin.Names(), ", ")+".").Required().String()
	pluginDescribe := plugin.Flag("describe", "Print the adapter's info and capabilities as JSON and exit.").Bool()

	health := app.Command("healthcheck", "Probe a health endpoint and exit 0 if it answers 2xx (for container health checks; the image has no curl).")
	healthURL := health.Flag("url", "Endpoint to probe.").Default("http://127.0.0.1:8080/readyz").String()

	cmd, err := app.Parse(os.Args[1:])
	if err != nil {
		app.FatalUsage("%v", err)
	}
	switch cmd {
	case run.FullCommand():
		err = runEdge(*configPath)
	case dev.FullCommand():
		err = runDev(devFlags)
	case check.FullCommand():
		if _, err = config.Load(*checkPath); err == nil {
			fmt.Printf("%s: ok\n", *checkPath)
		}
	case health.FullCommand():
		err = healthcheck(*healthURL)
	case plugin.FullCommand():
		err = builtin.Serve(*pluginName, *pluginDescribe)
	case versionCmd.FullCommand():
		fmt.Println("edged", version)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "edged:", err)
		os.Exit(1)
	}
}

// healthcheck GETs url and fails unless it answers 2xx within 5 s.
func healthcheck(url string) error {
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Get(url)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	return nil
}
