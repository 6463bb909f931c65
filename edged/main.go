// Command edged is the IOP Edge: the one reachable address that clients
// talk to and Nodes dial. It registers Nodes, keeps their heartbeats, and
// dispatches work to them over QUIC.
//
//	edged run --config edge.yaml               run the Edge (SIGHUP reloads the file)
//	edged tls ca create / tls cert create      make a CA and certificates for managed mode
//	edged node add / remove / list             enroll Nodes with join tokens, revoke them
//	edged store migrate --config edge.yaml     copy the enrollment into the cluster's PostgreSQL
//	edged config check edge.yaml               validate a configuration file
//	edged version                              print the version
//
// The all-in-one command that runs an Edge and a Node on one machine is
// edged/dev (go run ./edged/dev): this binary links no Node code.
package main

import (
	"crypto/tls"
	"fmt"
	"net/http"
	"os"
	"time"

	"github.com/alecthomas/kingpin/v2"

	edgeapp "github.com/iop-dev/iop/internal/edge/app"
	"github.com/iop-dev/iop/internal/edge/edgeconfig"
	"github.com/iop-dev/iop/internal/edge/nodecli"
	"github.com/iop-dev/iop/internal/edge/storecli"
	"github.com/iop-dev/iop/internal/edge/tlscli"
	"github.com/iop-dev/iop/internal/gctarget"
)

// certLifetime is the hidden --test-node-cert-lifetime of `edged run`.
var certLifetime = new(time.Duration)

// version is set at build time with -ldflags "-X main.version=...".
var version = "0.1.0-dev"

func main() {
	app := kingpin.New("edged", "The IOP Edge: sends LLM work to Nodes next to the model servers.")
	app.HelpFlag.Short('h')

	run := app.Command("run", "Run the Edge.").Default()
	configPath := run.Flag("config", "Edge configuration file (YAML).").Short('c').Required().String()
	// Tests of the real daemon over real sockets cannot wait a minute for
	// a heartbeat fence; nothing else may shorten the liveness profile (R8).
	livenessDiv := run.Flag("test-liveness-divisor", "Divide the liveness profile by N; for tests only.").Hidden().Default("1").Int()
	// Tests of certificate renewal on the real daemon cannot wait the
	// minimum lifetime of a minute; nothing else may go below it.
	run.Flag("test-node-cert-lifetime", "Lifetime of issued Node certificates, below the minimum; for tests only.").Hidden().
		Action(func(*kingpin.ParseContext) error { return edgeapp.SetTestNodeCertLifetime(*certLifetime) }).DurationVar(certLifetime)

	tlscli.Register(app, os.Stdout)
	nodeCmd := nodecli.Register(app, os.Stdout)
	nodeCmd = storecli.Register(app, os.Stdout, nodeCmd)

	check := app.Command("config", "Configuration tools.").Command("check", "Validate a configuration file and exit.")
	checkPath := check.Arg("file", "Edge configuration file.").Required().String()

	versionCmd := app.Command("version", "Print the version.")

	health := app.Command("healthcheck", "Probe a health endpoint and exit 0 if it answers 2xx (for container health checks; the image has no curl).")
	healthURL := health.Flag("url", "Endpoint to probe.").Default("http://127.0.0.1:8080/readyz").String()
	healthInsecure := health.Flag("insecure", "With an https URL, do not verify the certificate (api.tls is usually for a name, not 127.0.0.1).").Bool()

	cmd, err := app.Parse(os.Args[1:])
	if err != nil {
		app.FatalUsage("%v", err)
	}
	switch cmd {
	case run.FullCommand():
		gctarget.Apply()
		var cfg *edgeconfig.Config
		switch cfg, err = edgeconfig.Load(*configPath); {
		case err != nil:
		case *livenessDiv < 1 || *livenessDiv > 100:
			err = fmt.Errorf("--test-liveness-divisor %d: want 1 to 100", *livenessDiv)
		case *livenessDiv > 1:
			err = edgeapp.Run(cfg, edgeapp.ConfigFile(*configPath), edgeapp.ScaledLiveness(*livenessDiv))
		default:
			err = edgeapp.Run(cfg, edgeapp.ConfigFile(*configPath))
		}
	case check.FullCommand():
		if _, err = edgeconfig.Load(*checkPath); err == nil {
			fmt.Printf("%s: ok\n", *checkPath)
		}
	case health.FullCommand():
		err = healthcheck(*healthURL, *healthInsecure)
	case versionCmd.FullCommand():
		fmt.Println("edged", version)
	default:
		_, err = nodeCmd(cmd)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "edged:", err)
		os.Exit(1)
	}
}

// healthcheck GETs url and fails unless it answers 2xx within 5 s;
// insecure skips the verification of an https URL's certificate, for a
// probe of liveness on the Edge's own host.
func healthcheck(url string, insecure bool) error {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{InsecureSkipVerify: insecure}
	resp, err := (&http.Client{Timeout: 5 * time.Second, Transport: tr}).Get(url)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	return nil
}
