// Package edgeconfig is the Edge daemon's configuration file: its fields, their defaults and the
// rules a file must satisfy before edged starts. configs/edge-*.yaml are commented examples.
//
// Parse and Load decode strictly (see yamlconf.Decode), fill defaults for what the file leaves
// out, and validate; every problem is a *yamlconf.Error that names the field and, when the file
// sets that field or its section, the line.
package edgeconfig

import (
	"os"
	"path/filepath"
	"strings"

	"github.com/iop-dev/iop/internal/yamlconf"
)

// Defaults for fields the file leaves out.
const (
	// DefaultQUICAddr is where the Edge accepts Node connections.
	DefaultQUICAddr = "0.0.0.0:7443"
	// DefaultHTTPAddr is where the Edge serves the client APIs (OpenAI and Ollama).
	DefaultHTTPAddr = "127.0.0.1:8080"
)

// Config is the whole edged configuration file.
type Config struct {
	// EdgeID names this Edge to Nodes and in logs and metrics. Default: the host name, with
	// characters outside [A-Za-z0-9._-] replaced by '-'.
	EdgeID   string   `yaml:"edge_id"`
	Listen   Listen   `yaml:"listen"`
	Identity Identity `yaml:"identity"`
	// DataDir is where the Edge keeps what must outlive its process: today its QUIC stateless
	// reset key (see internal/edge/resetkey), with which a restarted Edge tells Nodes at once that their
	// old connections are gone, so they reconnect within seconds. Made (mode 0700) if missing.
	// Empty (the default): in mtls mode the key is derived from identity.key_file, which works
	// as well while that key stays the same; in loopback mode it lives only as long as the
	// process. Load resolves a relative path against the configuration file's directory.
	DataDir string `yaml:"data_dir,omitempty"`
	// API is who may call the client APIs: hashed keys and anonymous access (see access.go).
	API API `yaml:"api"`
	// Limits bound what clients of listen.http may make the Edge hold.
	Limits Limits `yaml:"limits"`
	// Principals are the callers keys map to, each with the routes it may use.
	Principals []Principal `yaml:"principals,omitempty"`
	// Profiles are named sets of per-request timers and queue limits that routes refer to. A
	// profile named DefaultProfileName always exists: the file may redefine it, and otherwise it
	// has the defaults of DefaultProfile.
	Profiles []Profile `yaml:"profiles,omitempty"`
	// Routes map the model names clients ask for to a profile and candidate targets.
	Routes []Route `yaml:"routes,omitempty"`
	// Credentials are the secrets some model servers need, by reference (an environment
	// variable or a file); profiles name them, and the Edge leases them to Nodes per dispatch
	// (see credentials.go). Only in mtls (managed) mode may a profile use one.
	Credentials []Credential `yaml:"credentials,omitempty"`
	Log         Log          `yaml:"log"`

	// Enrollment lets the Edge issue Node identities itself (see enrollment.go).
	Enrollment Enrollment `yaml:"enrollment"`

	// Cluster joins this Edge to others in front of the same Nodes (see cluster.go).
	Cluster Cluster `yaml:"cluster"`
	// ShutdownGrace is how long a stopping Edge (SIGTERM, SIGINT) waits for the streams it
	// carries: it refuses new work at once, tells its Nodes, and closes when its streams are
	// done or the grace is over. Default 10m (LLM streams last minutes); 0 stops at once.
	ShutdownGrace *yamlconf.Duration `yaml:"shutdown_grace,omitempty"`
	// Scheduling holds what placing work needs beyond the profiles (scheduling.go).
	Scheduling Scheduling `yaml:"scheduling"`
}

// Listen is the `listen` section: the Edge's two listening addresses, as host:port.
type Listen struct {
	QUIC string `yaml:"quic"` // Node connections (UDP); default DefaultQUICAddr
	HTTP string `yaml:"http"` // client APIs (TCP); default DefaultHTTPAddr
}

// Limits is the `limits` section: what the clients of listen.http may make the Edge hold, all
// of them together and each source and key (SPEC P3). Past max_connections (or
// max_connections_per_source for one source) a new connection takes the place of the connection
// idle longest, if one has been idle a few seconds, and is otherwise closed as it is accepted.
// Request bodies are charged to body_memory_mib as their bytes arrive; a body that finds it (or
// its key's share of it) taken waits briefly, then is refused with 503 and Retry-After; a body
// slower than min_body_rate_kib is ended with 408. One request's body, and the run it becomes,
// may be at most max_request_mib.
type Limits struct {
	// MaxConnections is how many client connections may be open at once; default 4096, from 1
	// to 1000000. Mind the process's file descriptor limit.
	MaxConnections int `yaml:"max_connections"`
	// MaxConnectionsPerSource is how many of them one source may hold: one IPv4 address, or one
	// IPv6 /64 (what one host is given). Loopback clients are not counted: a reverse proxy on
	// the Edge's host brings every client from 127.0.0.1 (put such a proxy's own limits in
	// front). 0 (the default): max_connections/8 (512 of 4096), at least 1; else from 1 to
	// max_connections. Behind a proxy on another host, set it to max_connections.
	MaxConnectionsPerSource int `yaml:"max_connections_per_source"`
	// BodyMemoryMiB is how many MiB of request bodies the Edge holds at once; default 64, from
	// 1 to 65536.
	BodyMemoryMiB int `yaml:"body_memory_mib"`
	// BodyMemoryPerPrincipalPercent is how much of body_memory_mib the requests of one principal
	// (one key's, or all anonymous or one trusted network's callers together) may hold at once,
	// in percent, so that one key cannot take the memory every other key needs; never less
	// than max_request_mib. 0 (the default): 50; else from 1 to 100 (100: no share).
	BodyMemoryPerPrincipalPercent int `yaml:"body_memory_per_principal_percent"`
	// MaxRequestMiB is the largest request body a client may send, and the largest run it may
	// become on its way to a Node (a coding session's context with its images); past it, 413.
	// 0 (the default): 32, or body_memory_mib if less; else from 1 to body_memory_mib. A Node takes at most its own limits.max_request_mib
	// (default 64): a request larger than every candidate Node takes is 413 as well.
	MaxRequestMiB int `yaml:"max_request_mib"`
	// MinBodyRateKiB is the slowest a request body may arrive, in KiB per second on average
	// from its start, after a grace of 5 s; a slower one is ended with 408, so a trickle cannot
	// hold memory for the whole minute a body may take. Default 64 (a slow mobile uplink); 0
	// turns it off; at most 1048576.
	MinBodyRateKiB int `yaml:"min_body_rate_kib"`
}

// Defaults and bounds of the limits section.
const (
	DefaultMaxConnections                = 4096
	MaxMaxConnections                    = 1_000_000
	DefaultBodyMemoryMiB                 = 64
	MaxBodyMemoryMiB                     = 65536
	DefaultMaxRequestMiB                 = 32
	DefaultBodyMemoryPerPrincipalPercent = 50
	DefaultMinBodyRateKiB                = 64
	MaxMinBodyRateKiB                    = 1 << 20
)

// SetDefaults fills unset limits. yamlconf.Decode calls it before reading the file, so
// `min_body_rate_kib: 0` stays 0 (no minimum).
func (l *Limits) SetDefaults() {
	if l.MaxConnections == 0 {
		l.MaxConnections = DefaultMaxConnections
	}
	if l.BodyMemoryMiB == 0 {
		l.BodyMemoryMiB = DefaultBodyMemoryMiB
	}
	if l.MinBodyRateKiB == 0 {
		l.MinBodyRateKiB = DefaultMinBodyRateKiB
	}
}

// MaxRequest is the largest request in bytes: max_request_mib, or its
// default.
func (l Limits) MaxRequest() int64 {
	if l.MaxRequestMiB == 0 {
		return int64(min(DefaultMaxRequestMiB, l.BodyMemoryMiB)) << 20
	}
	return int64(l.MaxRequestMiB) << 20
}

// ConnectionsPerSource is max_connections_per_source, or its default.
func (l Limits) ConnectionsPerSource() int {
	if l.MaxConnectionsPerSource == 0 {
		return max(l.MaxConnections/8, 1)
	}
	return l.MaxConnectionsPerSource
}

// PrincipalBodyMemory is how many bytes of bodies one principal's requests may hold:
// body_memory_per_principal_percent (or its default) of body_memory_mib, and at least
// MaxRequest.
func (l Limits) PrincipalBodyMemory() int64 {
	pct := l.BodyMemoryPerPrincipalPercent
	if pct == 0 {
		pct = DefaultBodyMemoryPerPrincipalPercent
	}
	return max(int64(l.BodyMemoryMiB)<<20*int64(pct)/100, l.MaxRequest())
}

// MinBodyRate is min_body_rate_kib in bytes per second, or -1 when it is 0 (no minimum).
func (l Limits) MinBodyRate() int64 {
	if l.MinBodyRateKiB == 0 {
		return -1
	}
	return int64(l.MinBodyRateKiB) << 10
}

func (l Limits) validate() yamlconf.Errors {
	var es yamlconf.Errors
	if l.MaxConnections < 1 || l.MaxConnections > MaxMaxConnections {
		es.Add("limits.max_connections", "must be from 1 to %d, got %d", MaxMaxConnections, l.MaxConnections)
	}
	if n := l.MaxConnectionsPerSource; n < 0 || n > max(l.MaxConnections, 1) {
		es.Add("limits.max_connections_per_source", "must be from 1 to limits.max_connections (%d), or 0 for max_connections/8; got %d",
			l.MaxConnections, n)
	}
	if l.BodyMemoryMiB < 1 || l.BodyMemoryMiB > MaxBodyMemoryMiB {
		es.Add("limits.body_memory_mib", "must be from 1 to %d, got %d", MaxBodyMemoryMiB, l.BodyMemoryMiB)
	}
	if p := l.BodyMemoryPerPrincipalPercent; p < 0 || p > 100 {
		es.Add("limits.body_memory_per_principal_percent", "must be from 1 to 100 (percent of limits.body_memory_mib), or 0 for %d; got %d",
			DefaultBodyMemoryPerPrincipalPercent, p)
	}
	if l.MaxRequestMiB < 0 || l.MaxRequestMiB > l.BodyMemoryMiB {
		es.Add("limits.max_request_mib", "must be from 1 to limits.body_memory_mib (%d), got %d", l.BodyMemoryMiB, l.MaxRequestMiB)
	}
	if r := l.MinBodyRateKiB; r < 0 || r > MaxMinBodyRateKiB {
		es.Add("limits.min_body_rate_kib", "must be from 0 (no minimum) to %d, got %d", MaxMinBodyRateKiB, r)
	}
	return es
}

// Identity is the `identity` section: mtls (managed) or loopback (development). In loopback mode
// the Edge accepts unauthenticated Nodes, so listen.quic must be a loopback address. Load
// resolves relative ca_file, cert_file and key_file against the configuration file's directory.
type Identity = yamlconf.Identity

// Log is the `log` section.
type Log = yamlconf.Log

// Default returns the configuration of an empty file: mtls identity (whose files still have to
// be named), default addresses, info-level text logs.
func Default() *Config {
	c := &Config{}
	c.SetDefaults()
	return c
}

// SetDefaults fills every unset field with its default; yamlconf.Decode calls it before reading
// the file, so set fields win.
func (c *Config) SetDefaults() {
	if c.EdgeID == "" {
		c.EdgeID = hostnameID()
	}
	if c.Listen.QUIC == "" {
		c.Listen.QUIC = DefaultQUICAddr
	}
	if c.Listen.HTTP == "" {
		c.Listen.HTTP = DefaultHTTPAddr
	}
	c.Identity.SetDefaults()
	c.Limits.SetDefaults()
	for i := range c.Profiles {
		c.Profiles[i].SetDefaults()
		c.Profiles[i].deriveDefaults()
	}
	for i := range c.Routes {
		c.Routes[i].SetDefaults()
	}
	for i := range c.Credentials {
		c.Credentials[i].SetDefaults()
	}
	c.Enrollment.SetDefaults()
	c.Log.SetDefaults()
}

// hostnameID turns the host name into a valid id, or "edge" when there is none.
func hostnameID() string {
	name, err := os.Hostname()
	if err != nil {
		return "edge"
	}
	id := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-' {
			return r
		}
		return '-'
	}, name)
	if len(id) > 128 {
		id = id[:128]
	}
	if id == "" {
		return "edge"
	}
	return id
}

// Parse decodes an edged configuration file, fills defaults and validates it. The error, when
// not nil, is a yamlconf.Errors listing every problem, each with the line of its field or, for a
// field the file leaves out, of the section it belongs in (`identity.mode (line 2): ...`).
//
// Parse has no file to resolve paths against, so it leaves relative paths as written; Load
// resolves them.
func Parse(data []byte) (*Config, error) {
	c := &Config{}
	lines, err := yamlconf.DecodeWithLines(data, c)
	if err != nil {
		return nil, err
	}
	for i := range c.Profiles {
		c.Profiles[i].deriveDefaults()
	}
	if err := c.Validate(); err != nil {
		return nil, lines.Annotate(err)
	}
	return c, nil
}

// Load reads and parses the file at path; every error names the file
// ("edge.yaml: identity.ca_file (line 4): required in mtls mode").
//
// Relative identity.ca_file, cert_file, key_file, credentials[].file, api.tls files and data_dir are resolved against the
// directory of path, not the working directory, and made absolute: `ca_file: iop-ca.pem` is the
// iop-ca.pem next to the configuration file. Absolute paths and empty fields are kept as they are.
func Load(path string) (*Config, error) {
	c, err := yamlconf.Load(path, Parse)
	if err != nil {
		return nil, err
	}
	c.Identity.ResolvePaths(filepath.Dir(path))
	c.resolveCredentialPaths(filepath.Dir(path))
	c.resolveTLSPaths(filepath.Dir(path))
	c.DataDir = yamlconf.ResolvePath(filepath.Dir(path), c.DataDir)
	c.Enrollment.CAKeyFile = yamlconf.ResolvePath(filepath.Dir(path), c.Enrollment.CAKeyFile)
	c.Cluster.DatabaseURLFile = yamlconf.ResolvePath(filepath.Dir(path), c.Cluster.DatabaseURLFile)
	return c, nil
}

// Validate reports every problem with c, as a yamlconf.Errors of *yamlconf.Error, or nil. It checks
// values only; it does not open the certificate files or the listening addresses. Besides each
// field's own rules it checks that names refer to things that exist: a route's profile, a
// principal's routes, a key's principal, a profile's credential; and that no profile uses a
// credential in loopback mode (SPEC S3).
func (c *Config) Validate() error {
	var es yamlconf.Errors
	es.Append(yamlconf.CheckID("edge_id", c.EdgeID))
	quicHost, _, quicErr := yamlconf.CheckHostPort("listen.quic", c.Listen.QUIC)
	_, _, httpErr := yamlconf.CheckHostPort("listen.http", c.Listen.HTTP)
	es.Append(quicErr, httpErr)
	es.Append(c.validateIdentity()...)
	if c.Identity.Mode == yamlconf.ModeLoopback && quicErr == nil && !yamlconf.IsLoopbackHost(quicHost) {
		es.Add("listen.quic", "loopback mode accepts unauthenticated Nodes, so it may only listen on a loopback address; got %q", c.Listen.QUIC)
	}
	es.Append(c.validateAccess(httpErr == nil)...)
	es.Append(c.Limits.validate()...)
	es.Append(c.validateRoutes()...)
	es.Append(c.validateCredentials()...)
	es.Append(c.Log.Validate("log")...)
	es.Append(c.validateEnrollment()...)
	es.Append(c.validateCluster()...)
	es.Append(c.validateScheduling()...)
	return es.Err()
}
