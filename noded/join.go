package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/iop-dev/iop/internal/node/nodejoin"
	"github.com/iop-dev/iop/quicwire"
)

// joinFlags are the command-line flags of `noded join`.
type joinFlags struct {
	nodejoin.Options
	start      bool
	healthAddr string
	// retryFor is how long to keep trying while the Edge is busy or
	// unreachable (retry.go); 0 tries once.
	retryFor time.Duration
}

// join runs `noded join`: redeem the token (trying again while the Edge is
// busy or unreachable, for up to --retry-for), write the files, and with
// --start run the Node from them.
func join(out io.Writer, flags joinFlags) error {
	flags.Version = version
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := retrying(ctx, out, joinRetry(flags.retryFor), func(ctx context.Context) (*nodejoin.Result, error) {
		return nodejoin.Join(ctx, flags.Options)
	})
	if err != nil {
		return fmt.Errorf("join %s: %w", flags.EdgeAddr, err)
	}
	j := res.Joined
	fmt.Fprintf(out, "==> Joined Edge %s as %s\n", j.EdgeID, quicwire.NodeIdentity(j.TrustDomain, j.NodeID))
	fmt.Fprintf(out, "==> Certificate valid until %s; the Node renews it over its connection before then\n", j.Cert.NotAfter.UTC().Format(time.RFC3339))
	fmt.Fprintf(out, "==> Wrote %s (and %s, %s made here, mode 0600, %s)\n", res.ConfigPath, nodejoin.CertFile, nodejoin.KeyFile, nodejoin.CAFile)
	if !flags.start {
		fmt.Fprintf(out, "Start it with: noded run --config %s\n", res.ConfigPath)
		return nil
	}
	stop()
	return runNode(runFlags{configPath: res.ConfigPath, healthAddr: flags.healthAddr})
}
