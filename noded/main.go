// Command noded is the IOP Node: it runs next to the model servers, dials
// the Edge over QUIC, registers its providers and executes the work the Edge
// dispatches.
//
//	noded run --config node.yaml       run the Node
//	noded config check node.yaml       validate a configuration file
//	noded version                      print the version
package main

import (
	"fmt"
	"os"

	"github.com/alecthomas/kingpin/v2"
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

	check := app.Command("config", "Configuration tools.").Command("check", "Validate a configuration file and exit.")
	checkPath := check.Arg("file", "Node configuration file.").Required().String()

	versionCmd := app.Command("version", "Print the version.")

	switch kingpin.MustParse(app.Parse(os.Args[1:])) {
	case run.FullCommand():
		if err := runNode(runFlags); err != nil {
			fmt.Fprintln(os.Stderr, "noded:", err)
			os.Exit(1)
		}
	case check.FullCommand():
		if err := checkConfig(*checkPath); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Printf("%s: ok\n", *checkPath)
	case versionCmd.FullCommand():
		fmt.Println("noded", version)
	}
}
