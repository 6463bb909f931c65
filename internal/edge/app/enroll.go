package app

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/fx"

	"github.com/iop-dev/iop/internal/edge/datadir"
	"github.com/iop-dev/iop/internal/edge/edgeconfig"
	"github.com/iop-dev/iop/internal/edge/fleet"
	"github.com/iop-dev/iop/internal/edge/frontdoor"
	"github.com/iop-dev/iop/internal/edge/registrar"
	"github.com/iop-dev/iop/internal/edge/resetkey"
	"github.com/iop-dev/iop/internal/edge/served"
	"github.com/iop-dev/iop/internal/yamlconf"
	"github.com/iop-dev/iop/quicwire"
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
func newEnrollment(lc fx.Lifecycle, cfg *edgeconfig.Config, reg *fleet.Registry, refused *frontdoor.Refusals, db *clusterDB, log *slog.Logger) (*registrar.Service, error) {
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
	if err := prepareDataDir(cfg.DataDir); err != nil {
		return nil, err
	}
	store, err := openEnrollmentStore(cfg, db, log)
	if err != nil {
		return nil, err
	}
	lc.Append(fx.StopHook(store.Close))
	lifetime := time.Duration(cfg.Enrollment.NodeCertLifetime)
	if d := testNodeCertLifetime.Load(); d != 0 {
		lifetime = time.Duration(d)
	}
	svc := registrar.New(store, registrar.Options{
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

// enrollmentStore is an enrollment store the Edge closes when it stops.
type enrollmentStore interface {
	registrar.Backend
	Close() error
}

// openEnrollmentStore opens the enrollment store: the cluster's PostgreSQL
// when one is configured (every Edge of the cluster shares tokens, serials
// and revocations, and hears of a removal within about a second), the bbolt
// file in data_dir otherwise.
func openEnrollmentStore(cfg *edgeconfig.Config, db *clusterDB, log *slog.Logger) (enrollmentStore, error) {
	if db.pool == nil {
		return registrar.OpenStore(cfg.DataDir, time.Second, time.Now())
	}
	ctx, cancel := context.WithTimeout(context.Background(), connectWait)
	defer cancel()
	pg, err := registrar.OpenPG(ctx, db.pool, registrar.PGOptions{EdgeID: cfg.EdgeID, Logger: log})
	if err != nil {
		return nil, err
	}
	log.Info("node enrollment kept in the cluster's database")
	return pg, nil
}

// managedEdgeTLS builds the Node-facing TLS configuration of managed mode:
// the Edge's certificate from identity.cert_file and key_file, or, when the
// Edge holds the CA key and names no files, one it issues itself; join
// connections too when the Edge has an enrollment store.
func managedEdgeTLS(cfg *edgeconfig.Config, log *slog.Logger, refused *frontdoor.Refusals, enrolled *registrar.Service) (*tls.Config, error) {
	id := cfg.Identity
	onReject := func(remote string, err error) {
		refused.Refuse("tls_handshake", "refused node connection", "remote", remote, "err", err)
	}
	if !cfg.SelfIssued() {
		pool, cert, err := pki.LoadIdentity(id.CAFile, id.CertFile, id.KeyFile, quicwire.EdgeIdentity(id.TrustDomain, cfg.EdgeID))
		if err != nil {
			return nil, err
		}
		base := quicwire.EdgeTLSConfig(pool, cert, id.TrustDomain, nil, onReject)
		if enrolled == nil {
			return base, nil
		}
		return wireenroll.WithJoin(base, wireenroll.EdgeJoinTLSConfig(cert, enrolled.CACert())), nil
	}
	ca, err := pki.LoadCA(id.CAFile, cfg.Enrollment.CAKeyFile)
	if err != nil {
		return nil, fmt.Errorf("enrollment.ca_key_file: %w", err)
	}
	if ca.TrustDomain != id.TrustDomain {
		return nil, fmt.Errorf("identity.ca_file %s is a CA for trust domain %q, identity.trust_domain is %q", id.CAFile, ca.TrustDomain, id.TrustDomain)
	}
	own := &selfIssued{ca: ca, id: quicwire.EdgeIdentity(id.TrustDomain, cfg.EdgeID), lifetime: selfIssuedLifetime, log: log}
	cert, err := own.get()
	if err != nil {
		return nil, err
	}
	// Both configurations read the certificate at each handshake, so a
	// re-issued one is presented without a restart.
	base := quicwire.EdgeTLSConfig(ca.Pool(), *cert, id.TrustDomain, nil, onReject)
	base.Certificates, base.GetCertificate = nil, func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return own.get() }
	if enrolled == nil {
		return base, nil
	}
	join := wireenroll.EdgeJoinTLSConfig(*cert, ca.Cert)
	join.Certificates, join.GetCertificate = nil, func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
		c, err := own.get()
		if err != nil {
			return nil, err
		}
		return &tls.Certificate{Certificate: [][]byte{c.Certificate[0], ca.Cert.Raw}, PrivateKey: c.PrivateKey, Leaf: c.Leaf}, nil
	}
	return wireenroll.WithJoin(base, join), nil
}

// selfIssuedLifetime is the validity of the certificate an Edge issues
// itself; it issues a new one at two thirds of it.
const selfIssuedLifetime = 30 * 24 * time.Hour

// selfIssued is the certificate of an Edge that holds the CA key and names
// no certificate files: issued in memory at start, and again once two
// thirds of its lifetime have passed. Safe for concurrent use.
type selfIssued struct {
	ca       *pki.CA
	id       quicwire.Identity
	lifetime time.Duration
	log      *slog.Logger

	mu  sync.Mutex
	cur *tls.Certificate
	due time.Time
}

// get returns the certificate to present now, issuing a new one when due. A
// failed re-issue keeps the current certificate (it is still valid).
func (s *selfIssued) get() (*tls.Certificate, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	if s.cur != nil && now.Before(s.due) {
		return s.cur, nil
	}
	c, err := s.ca.IssueTLS(s.id, pki.Options{NotBefore: now.Add(-time.Minute), Validity: s.lifetime + time.Minute})
	if err != nil {
		if s.cur != nil {
			s.log.Error("could not issue the edge certificate again; keeping the current one", "err", err)
			return s.cur, nil
		}
		return nil, fmt.Errorf("issue the edge certificate: %w", err)
	}
	s.cur, s.due = &c, now.Add(s.lifetime*2/3)
	s.log.Info("edge certificate issued from the CA", "identity", s.id.String(), "not_after", c.Leaf.NotAfter.UTC().Format(time.RFC3339))
	return s.cur, nil
}

// dataDirFiles are the files the Edge keeps in data_dir: like data_dir
// itself, each must be changeable by the Edge's user (or root) alone.
var dataDirFiles = []string{registrar.StoreFile, registrar.StoreIDFile, registrar.SocketFile, resetkey.FileName, served.FileName}

// prepareDataDir makes data_dir (0700) if it is missing, and refuses it
// when anyone but the Edge's user or root can change it or a file the Edge
// keeps there: whoever can holds the Node enrollment (issue 24).
func prepareDataDir(dir string) error { return datadir.Prepare(dir, dataDirFiles...) }

// serveAdminSocket serves `edged node` commands on data_dir/admin.sock from
// start to stop. Callers of another user than the Edge's and root are
// refused, and counted as refusals of kind admin_socket.
func serveAdminSocket(lc fx.Lifecycle, cfg *edgeconfig.Config, svc *registrar.Service, refused *frontdoor.Refusals, log *slog.Logger) {
	if svc == nil {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	lc.Append(fx.Hook{
		OnStart: func(context.Context) error {
			ln, err := registrar.ListenSocket(cfg.DataDir)
			if err != nil {
				return err
			}
			ln.Refused = func(uid int) {
				refused.Refuse("admin_socket", "refused a caller of another user on the admin socket", "uid", uid)
			}
			go func() { defer close(done); svc.ServeSocket(ctx, ln, log) }()
			return nil
		},
		OnStop: func(context.Context) error { cancel(); <-done; return nil },
	})
}
