// Command noded is the IOP Node: it runs next to the model servers, dials
// the Edge over QUIC, registers its providers and executes the work the Edge
// dispatches.
//
//	noded run --config node.yaml       run the Node
//	noded join EDGE --token T          join an Edge: key made here, certificate from the Edge
//	noded config check node.yaml       validate a configuration file
//	noded adapter verify PATH          run the adapter conformance checks
//	noded version                      print the version
package main

import (
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/alecthomas/kingpin/v2"

	"github.com/iop-dev/iop/internal/gctarget"
	"github.com/iop-dev/iop/internal/node/nodejoin"
	"github.com/iop-dev/iop/plugins/builtin"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "0.1.0-dev"

func main() {
	app := kingpin.New("noded", "The IOP Node: runs LLM work for an Edge, next to the model servers.")
	app.HelpFlag.Short('h')

	run := app.Command("run", "Run the Node.").Default()
	runFlags := runFlags{}
	run.Flag("config", "Node configuration file (YAML).").Short('c').Required().StringVar(&runFlags.configPath)
	run.Flag("health-addr", "Serve /healthz and /readyz on this address (e.g. 127.0.0.1:9090); off when empty.").StringVar(&runFlags.healthAddr)

	joinCmd := app.Command("join", "Join an Edge with a token from `edged node add`: make this Node's key, get its certificate, write its configuration.")
	joinFlags := joinFlags{}
	joinCmd.Arg("edge-addr", "The Edge's QUIC address, HOST:PORT.").Required().StringVar(&joinFlags.EdgeAddr)
	joinCmd.Flag("token", "The join token (iop1....).").Required().StringVar(&joinFlags.Token)
	joinCmd.Flag("dir", "Directory for the key, certificates and node.yaml (made mode 0700).").Default(nodejoin.DefaultDir).StringVar(&joinFlags.Dir)
	joinCmd.Flag("ollama-url", "The Ollama server the written configuration serves.").Default("http://127.0.0.1:11434").StringVar(&joinFlags.OllamaURL)
	joinCmd.Flag("start", "Run the Node right after joining.").BoolVar(&joinFlags.start)
	joinCmd.Flag("health-addr", "With --start: serve /healthz, /readyz and /metrics on this address.").StringVar(&joinFlags.healthAddr)
	joinCmd.Flag("retry-for", "Keep trying this long while the Edge is busy or unreachable, waiting longer each time (1s, 2s, 4s, ... up to 30s); 0 tries once. A refused token is never retried.").
		Default(defaultRetryFor.String()).DurationVar(&joinFlags.retryFor)

	check := app.Command("config", "Configuration tools.").Command("check", "Validate a configuration file and exit.")
	checkPath := check.Arg("file", "Node configuration file.").Required().String()

	verify := app.Command("adapter", "Adapter tools.").Command("verify",
		"Run the adapter conformance checks on an adapter binary (or builtin:NAME) and print one line per check; exit 1 if any failed.")
	verifyFlags := verifyFlags{}
	verify.Arg("path", "Adapter binary, or builtin:NAME for an adapter built into noded ("+strings.Join(builtin.Names(), ", ")+").").Required().StringVar(&verifyFlags.path)
	verify.Flag("config", "The adapter's configuration as JSON, or @FILE holding it.").StringVar(&verifyFlags.config)
	verify.Flag("target", "A target that answers with streamed text (default: the first the adapter lists).").StringVar(&verifyFlags.target)
	verify.Flag("slow-target", "A target slow enough to cancel mid-answer (without it the cancel check is skipped).").StringVar(&verifyFlags.slowTarget)
	verify.Flag("embed-target", "The target the embed check asks for embeddings, if the adapter reports embed (default: --target).").StringVar(&verifyFlags.embedTarget)
	verify.Flag("unknown-target", "A target the server does not have, which must fail as model_not_found.").StringVar(&verifyFlags.unknownTarget)
	verify.Flag("verbose", "Also print the adapter's log lines to stderr.").Short('v').BoolVar(&verifyFlags.verbose)

	versionCmd := app.Command("version", "Print the version.")

	plugin := app.Command("plugin", "Serve a built-in adapter as a plugin process (the Node starts these itself).").Hidden()
	pluginName := plugin.Arg("adapter", "Built-in adapter: "+strings.Join(builtin.Names(), ", ")+".").Required().String()
	pluginDescribe := plugin.Flag("describe", "Print the adapter's info and capabilities as JSON and exit.").Bool()

	health := app.Command("healthcheck", "Probe a health endpoint and exit 0 if it answers 2xx (for container health checks; the image has no curl).")
	healthURL := health.Flag("url", "Endpoint to probe.").Default("http://127.0.0.1:9090/readyz").String()

	cmd, err := app.Parse(os.Args[1:])
	if err != nil {
		app.FatalUsage("%v", err)
	}
	switch cmd {
	case run.FullCommand():
		gctarget.Apply() // the daemon only: a plugin process keeps Go's default
		err = runNode(runFlags)
	case joinCmd.FullCommand():
		err = join(os.Stdout, joinFlags)
	case check.FullCommand():
		if err = checkConfig(*checkPath); err == nil {
			fmt.Printf("%s: ok\n", *checkPath)
		}
	case health.FullCommand():
		err = healthcheck(*healthURL)
	case plugin.FullCommand():
		err = builtin.Serve(*pluginName, *pluginDescribe)
	case verify.FullCommand():
		err = verifyAdapter(os.Stdout, verifyFlags)
	case versionCmd.FullCommand():
		fmt.Println("noded", version)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "noded:", err)
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
