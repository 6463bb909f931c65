package edgeconfig

import (
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/iop-dev/iop/internal/yamlconf"
)

// Cluster is the `cluster` section: several Edges in front of the same Nodes, sharing their
// durable state (enrollment, the usage ledger, the audit log, the cluster's membership) in one
// PostgreSQL database (issue 22). Left out, the Edge is alone: its enrollment store is the bbolt
// file in data_dir, as before.
//
// API keys, principals, routes and profiles stay in each Edge's own file: the cluster view shows
// an Edge whose file differs from the others'.
type Cluster struct {
	// DatabaseURL is the PostgreSQL connection string (postgres://user@host:5432/iop?sslmode=
	// verify-full), or a key=value DSN. It may hold a password: prefer DatabaseURLFile.
	DatabaseURL string `yaml:"database_url,omitempty"`
	// DatabaseURLFile is a file holding the connection string (a mounted secret); one of
	// database_url and database_url_file. Load resolves a relative path against the
	// configuration file's directory.
	DatabaseURLFile string `yaml:"database_url_file,omitempty"`
	// AdvertiseQUIC is the host:port Nodes dial to reach this Edge, told to every Node by
	// every Edge of the cluster. Default: listen.quic, when its host is not unspecified
	// (0.0.0.0 or ::); then it must be set.
	AdvertiseQUIC string `yaml:"advertise_quic,omitempty"`
	// AdvertiseHTTP is this Edge's client API address as operators reach it, shown in the
	// cluster view. Default: listen.http.
	AdvertiseHTTP string `yaml:"advertise_http,omitempty"`
}

// Enabled reports whether the section configures a cluster.
func (c Cluster) Enabled() bool { return c.DatabaseURL != "" || c.DatabaseURLFile != "" }

// DSN returns the connection string: database_url, or the trimmed contents of
// database_url_file.
func (c Cluster) DSN() (string, error) {
	if c.DatabaseURLFile == "" {
		return c.DatabaseURL, nil
	}
	b, err := os.ReadFile(c.DatabaseURLFile)
	if err != nil {
		return "", fmt.Errorf("cluster.database_url_file: %w", err)
	}
	dsn := strings.TrimSpace(string(b))
	if dsn == "" {
		return "", fmt.Errorf("cluster.database_url_file: %s is empty", c.DatabaseURLFile)
	}
	return dsn, nil
}

// Advertised returns the QUIC address Nodes are told to dial for this Edge: advertise_quic,
// or listen.quic.
func (c *Config) Advertised() string {
	if c.Cluster.AdvertiseQUIC != "" {
		return c.Cluster.AdvertiseQUIC
	}
	return c.Listen.QUIC
}

// AdvertisedHTTP returns advertise_http, or listen.http.
func (c *Config) AdvertisedHTTP() string {
	if c.Cluster.AdvertiseHTTP != "" {
		return c.Cluster.AdvertiseHTTP
	}
	return c.Listen.HTTP
}

// Shutdown grace bounds (shutdown_grace).
const (
	// DefaultShutdownGrace is how long a stopping Edge waits for its streams: LLM streams last
	// minutes.
	DefaultShutdownGrace = 10 * time.Minute
	MaxShutdownGrace     = 24 * time.Hour
)

// Grace is shutdown_grace, or its default.
func (c *Config) Grace() time.Duration {
	if c.ShutdownGrace == nil {
		return DefaultShutdownGrace
	}
	return time.Duration(*c.ShutdownGrace)
}

func (c *Config) validateCluster() yamlconf.Errors {
	var es yamlconf.Errors
	cl := c.Cluster
	if g := c.ShutdownGrace; g != nil && (*g < 0 || time.Duration(*g) > MaxShutdownGrace) {
		es.Add("shutdown_grace", "must be from 0 (stop at once) to %v, got %v", MaxShutdownGrace, time.Duration(*g))
	}
	if cl.DatabaseURL != "" && cl.DatabaseURLFile != "" {
		es.Add("cluster.database_url_file", "set database_url or database_url_file, not both")
	}
	if cl.DatabaseURL != "" {
		if err := checkDSN(cl.DatabaseURL); err != nil {
			es.Add("cluster.database_url", "%v", err)
		}
	}
	if cl.AdvertiseQUIC != "" {
		_, _, err := yamlconf.CheckHostPort("cluster.advertise_quic", cl.AdvertiseQUIC)
		es.Append(err)
	}
	if cl.AdvertiseHTTP != "" {
		_, _, err := yamlconf.CheckHostPort("cluster.advertise_http", cl.AdvertiseHTTP)
		es.Append(err)
	}
	if cl.Enabled() && cl.AdvertiseQUIC == "" {
		if host, _, err := yamlconf.CheckHostPort("listen.quic", c.Listen.QUIC); err == nil && (host == "" || host == "0.0.0.0" || host == "::") {
			es.Add("cluster.advertise_quic", "required in a cluster when listen.quic (%q) listens on every address: Nodes are told where to dial this Edge", c.Listen.QUIC)
		}
	}
	return es
}

// checkDSN checks the shape of a connection string without connecting: a postgres:// or
// postgresql:// URL, or a key=value DSN. The error never repeats the string (it may hold a
// password).
func checkDSN(dsn string) error {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return fmt.Errorf("not a valid postgres:// URL (the value is not repeated here: it may hold a password)")
		}
		if u.Host == "" && u.Query().Get("host") == "" {
			return fmt.Errorf("the postgres:// URL names no host")
		}
		return nil
	}
	if strings.Contains(dsn, "=") {
		return nil
	}
	return fmt.Errorf("must be a postgres:// URL or a key=value connection string")
}
