package app

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"go.uber.org/fx"

	"github.com/iop-dev/iop/internal/edge/edgeconfig"
	"github.com/iop-dev/iop/internal/edge/enroll"
	"github.com/iop-dev/iop/internal/edge/frontdoor"
	"github.com/iop-dev/iop/internal/edge/nodes"
	"github.com/iop-dev/iop/internal/yamlconf"
	wireenroll "github.com/iop-dev/iop/quicwire/enroll"
	"github.com/iop-dev/iop/quicwire/pki"
)

// enrollment is the Node enrollment part of the graph: the store and
// service (nil without a data_dir in mtls mode) and the admin socket.
var enrollment = fx.Options(fx.Provide(newEnrollment), fx.Invoke(serveAdminSocket))

// testNodeCertLifetime, when not zero, overrides
// enrollment.node_cert_lifetime, below its minimum too.
var testNodeCertLifetime atomic.Int64

// SetTestNodeCertLifetime makes the Edges started after it issue Node
// certificates valid for d, for tests of renewal on the real daemon, which
// cannot wait a minute (`edged run` has it as a hidden flag). Never for
// production.
func SetTestNodeCertLifetime(d time.Duration) error {
	if d < time.Second {
		return fmt.Errorf("--test-node-cert-lifetime %s: want at least 1s", d)
	}
	testNodeCertLifetime.Store(int64(d))
	return nil
}

// newEnrollment opens the enrollment store when the Edge is managed and has
// a data_dir: then every Node connection is checked against its
// revocations, and, with enrollment.ca_key_file, the Edge issues and renews
// Node identities. Otherwise it returns nil: no store, no joins.
func newEnrollment(lc fx.Lifecycle, cfg *edgeconfig.Config, reg *nodes.Registry, refused *frontdoor.Refusals, log *slog.Logger) (*enroll.Service, error) {
	if cfg.Identity.Mode != yamlconf.ModeMTLS || cfg.DataDir == "" {
		if cfg.Identity.Mode == yamlconf.ModeMTLS {
			log.Info("node enrollment off: no data_dir (edged node add/remove need one)")
		}
		return nil, nil
	}
	caCert, err := pki.LoadCACert(cfg.Identity.CAFile)
	if err != nil {
		return nil, err
	}
	var ca *pki.CA
	if cfg.Enrollment.CAKeyFile != "" {
		if ca, err = pki.LoadCA(cfg.Identity.CAFile, cfg.Enrollment.CAKeyFile); err != nil {
			return nil, fmt.Errorf("enrollment.ca_key_file: %w", err)
		}
		if ca.TrustDomain != cfg.Identity.TrustDomain {
			return nil, fmt.Errorf("enrollment: the CA %s is for trust domain %q, identity.trust_domain is %q", cfg.Identity.CAFile, ca.TrustDomain, cfg.Identity.TrustDomain)
		}
	}
	store, err := enroll.OpenStore(cfg.DataDir, time.Second, time.Now())
	if err != nil {
		return nil, err
	}
	lc.Append(fx.StopHook(store.Close))
	lifetime := time.Duration(cfg.Enrollment.NodeCertLifetime)
	if d := testNodeCertLifetime.Load(); d != 0 {
		lifetime = time.Duration(d)
	}
	svc := enroll.New(store, enroll.Options{
		EdgeID: cfg.EdgeID, TrustDomain: cfg.Identity.TrustDomain, CACert: caCert, CA: ca,
		Lifetime: lifetime, Registry: reg, Refused: refused, Logger: log,
	})
	if ca == nil {
		log.Info("node enrollment: revocations checked; joins and renewals off (no enrollment.ca_key_file)")
	} else {
		log.Info("node enrollment on", "ca_hash", wireenroll.FormatCAHash(wireenroll.CAHash(caCert)),
			"node_cert_lifetime", lifetime.String())
	}
	return svc, nil
}

// withJoin lets the Node-facing listener take join connections too, when
// the Edge has an enrollment store.
func withJoin(base *tls.Config, cert tls.Certificate, svc *enroll.Service) *tls.Config {
	if svc == nil {
		return base
	}
	return wireenroll.WithJoin(base, wireenroll.EdgeJoinTLSConfig(cert, svc.CACert()))
}

// serveAdminSocket serves `edged node` commands on data_dir/admin.sock from
// start to stop.
func serveAdminSocket(lc fx.Lifecycle, cfg *edgeconfig.Config, svc *enroll.Service, log *slog.Logger) {
	if svc == nil {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	lc.Append(fx.Hook{
		OnStart: func(context.Context) error {
			ln, err := enroll.ListenSocket(cfg.DataDir)
			if err != nil {
				return err
			}
			go func() { defer close(done); svc.ServeSocket(ctx, ln, log) }()
			return nil
		},
		OnStop: func(context.Context) error { cancel(); <-done; return nil },
	})
}
