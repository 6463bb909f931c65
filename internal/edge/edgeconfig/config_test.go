package edgeconfig

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/iop-dev/iop/internal/yamlconf"
)

// loopbackFile is a small valid file that tests change one line of.
const loopbackFile = `
edge_id: edge-test
listen:
  quic: 127.0.0.1:7443
identity:
  mode: loopback
`

// mtlsConfig is a valid managed configuration for Validate tests.
func mtlsConfig() *Config {
	c := Default()
	c.EdgeID = "edge-1"
	c.Identity.CAFile = "/etc/iop/ca.pem"
	c.Identity.CertFile = "/etc/iop/edge.pem"
	c.Identity.KeyFile = "/etc/iop/edge-key.pem"
	return c
}

func TestParseFillsDefaults(t *testing.T) {
	c, err := Parse([]byte("identity: {mode: loopback}\nlisten: {quic: 'localhost:7443'}\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := &Config{
		EdgeID:     hostnameID(),
		Listen:     Listen{QUIC: "localhost:7443", HTTP: DefaultHTTPAddr},
		Identity:   Identity{Mode: "loopback", TrustDomain: "iop.local"},
		Limits:     Limits{MaxConnections: DefaultMaxConnections, BodyMemoryMiB: DefaultBodyMemoryMiB, MinBodyRateKiB: DefaultMinBodyRateKiB},
		Log:        Log{Level: "info", Format: "text"},
		Enrollment: Enrollment{NodeCertLifetime: yamlconf.Duration(DefaultNodeCertLifetime)},
	}
	if !reflect.DeepEqual(c, want) {
		t.Errorf("Parse:\n got %+v\nwant %+v", c, want)
	}
	if c.Log.SlogLevel() != slog.LevelInfo {
		t.Errorf("SlogLevel = %v", c.Log.SlogLevel())
	}
}

func TestDefaultIsManagedAndNeedsCertificates(t *testing.T) {
	c := Default()
	if c.Identity.Mode != "mtls" || c.Listen.QUIC != DefaultQUICAddr || c.Listen.HTTP != DefaultHTTPAddr {
		t.Errorf("Default() = %+v", c)
	}
	if yamlconf.CheckID("edge_id", c.EdgeID) != nil {
		t.Errorf("default edge id %q is not a valid id", c.EdgeID)
	}
	got := paths(c.Validate())
	if want := []string{"identity.ca_file", "identity.cert_file", "identity.key_file"}; !reflect.DeepEqual(got, want) {
		t.Errorf("Default().Validate() paths %q, want %q", got, want)
	}
}

func TestHostnameIDIsAlwaysValid(t *testing.T) {
	if err := yamlconf.CheckID("edge_id", hostnameID()); err != nil {
		t.Error(err)
	}
}

func TestValidateReportsFieldAndReason(t *testing.T) {
	tests := []struct {
		name   string
		change func(c *Config)
		path   string
		reason string
	}{
		{"edge id required", func(c *Config) { c.EdgeID = "" }, "edge_id", "required"},
		{"edge id charset", func(c *Config) { c.EdgeID = "edge 1" }, "edge_id", `must be 1 to 128 characters of letters, digits, '.', '_' or '-'; got "edge 1"`},
		{"edge id length", func(c *Config) { c.EdgeID = strings.Repeat("e", 129) }, "edge_id", "must be 1 to 128"},
		{"quic without port", func(c *Config) { c.Listen.QUIC = "0.0.0.0" }, "listen.quic", "must be host:port"},
		{"quic port out of range", func(c *Config) { c.Listen.QUIC = "0.0.0.0:70000" }, "listen.quic", `port must be a number from 0 to 65535, got "70000"`},
		{"http named port", func(c *Config) { c.Listen.HTTP = "127.0.0.1:http" }, "listen.http", "port must be a number"},
		{"http empty", func(c *Config) { c.Listen.HTTP = "" }, "listen.http", "required, as host:port"},
		{"unknown mode", func(c *Config) { c.Identity.Mode = "x" }, "identity.mode", `must be "mtls" or "loopback", got "x"`},
		{"trust domain uppercase", func(c *Config) { c.Identity.TrustDomain = "IOP" }, "identity.trust_domain", "lowercase"},
		{"mtls needs ca", func(c *Config) { c.Identity.CAFile = "" }, "identity.ca_file", "required in mtls mode"},
		{"mtls needs cert", func(c *Config) { c.Identity.CertFile = "" }, "identity.cert_file", "required in mtls mode"},
		{"mtls needs key", func(c *Config) { c.Identity.KeyFile = "" }, "identity.key_file", "required in mtls mode"},
		{"loopback refuses certificate files", func(c *Config) {
			c.Identity.Mode = "loopback"
			c.Listen.QUIC = "127.0.0.1:7443"
			c.Identity.CAFile, c.Identity.KeyFile = "", ""
		}, "identity.cert_file", "not used in loopback mode"},
		{"loopback on every interface", func(c *Config) { toLoopback(c); c.Listen.QUIC = "0.0.0.0:7443" }, "listen.quic",
			"loopback mode accepts unauthenticated Nodes, so it may only listen on a loopback address"},
		{"loopback on an empty host", func(c *Config) { toLoopback(c); c.Listen.QUIC = ":7443" }, "listen.quic", "only listen on a loopback address"},
		{"loopback on a host name", func(c *Config) { toLoopback(c); c.Listen.QUIC = "edge.example.com:7443" }, "listen.quic", "only listen on a loopback address"},
		{"log level", func(c *Config) { c.Log.Level = "trace" }, "log.level", `must be one of debug, info, warn, error; got "trace"`},
		{"log format", func(c *Config) { c.Log.Format = "xml" }, "log.format", `must be text or json, got "xml"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := mtlsConfig()
			tt.change(c)
			wantOneProblem(t, c.Validate(), tt.path, tt.reason)
		})
	}
}

// wantOneProblem checks that err reports exactly one problem, at path, with
// a reason containing reason.
func wantOneProblem(t *testing.T, err error, path, reason string) {
	t.Helper()
	var es yamlconf.Errors
	if !errors.As(err, &es) || len(es) != 1 {
		t.Fatalf("Validate() = %v, want exactly one problem", err)
	}
	if es[0].Path != path || !strings.Contains(es[0].Reason, reason) {
		t.Errorf("got %q: %q\nwant %q: containing %q", es[0].Path, es[0].Reason, path, reason)
	}
}

func toLoopback(c *Config) {
	c.Identity = Identity{Mode: "loopback", TrustDomain: "iop.local"}
}

func TestValidateAcceptsLoopbackAddresses(t *testing.T) {
	for _, addr := range []string{"127.0.0.1:7443", "127.0.0.2:0", "[::1]:7443", "localhost:7443"} {
		c := mtlsConfig()
		toLoopback(c)
		c.Listen.QUIC = addr
		if err := c.Validate(); err != nil {
			t.Errorf("loopback on %s: %v", addr, err)
		}
	}
}

func TestValidateReportsEveryProblem(t *testing.T) {
	c := &Config{Identity: Identity{Mode: "mtls"}}
	want := []string{"edge_id", "listen.quic", "listen.http", "identity.trust_domain", "identity.ca_file",
		"identity.cert_file", "identity.key_file", "limits.max_connections", "limits.body_memory_mib", "log.level", "log.format"}
	if got := paths(c.Validate()); !reflect.DeepEqual(got, want) {
		t.Errorf("paths %q\nwant  %q", got, want)
	}
}

func TestParseReportsDecodeProblemsWithLines(t *testing.T) {
	tests := []struct {
		name   string
		src    string
		path   string
		line   int
		reason string
	}{
		{"unknown field", loopbackFile + "  ca_fil: x\n", "identity.ca_fil", 7, `unknown field; did you mean "ca_file"?`},
		{"unknown section", loopbackFile + "metrics: {}\n", "metrics", 7, "unknown field"},
		{"duplicate key", loopbackFile + "  mode: mtls\n", "identity.mode", 7, "duplicate key (first set on line 6)"},
		{"listen as a string", "listen: 127.0.0.1:7443\n", "listen", 1, "must be a mapping of fields"},
		{"edge id as a list", "edge_id: [a]\n", "edge_id", 1, "must be a string, got a list"},
		{"second document", loopbackFile + "---\nedge_id: other\n", "", 8, "second YAML document"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.src))
			var e *yamlconf.Error
			if !errors.As(err, &e) {
				t.Fatalf("Parse error %v is not a *yamlconf.Error", err)
			}
			if e.Path != tt.path || e.Line != tt.line || !strings.Contains(e.Reason, tt.reason) {
				t.Errorf("got %v\nwant path %q line %d reason containing %q", e, tt.path, tt.line, tt.reason)
			}
		})
	}
}

func TestParseReportsValidationProblemsWithLines(t *testing.T) {
	type problem struct {
		path string
		line int
	}
	tests := []struct {
		name  string
		src   string
		want  []problem
		first string // the first problem as printed, when checked
	}{
		{"bad value in a block section", "identity:\n  mode: plaintext\n", []problem{{"identity.mode", 2}},
			`identity.mode (line 2): must be "mtls" or "loopback", got "plaintext"`},
		{"bad value in a flow section", "identity: {mode: loopback}\nlisten: {quic: '0.0.0.0:7443'}\n", []problem{{"listen.quic", 2}},
			`listen.quic (line 2): loopback mode accepts unauthenticated Nodes`},
		{"bad top-level value", "identity: {mode: loopback}\nlisten: {quic: '127.0.0.1:1'}\nedge_id: 'edge 1'\n", []problem{{"edge_id", 3}}, ""},
		{"required field missing from its section", "edge_id: e\nidentity:\n  mode: mtls\n  ca_file: ca.pem\n",
			[]problem{{"identity.cert_file", 2}, {"identity.key_file", 2}}, "identity.cert_file (line 2): required in mtls mode"},
		{"section given as null", "identity:\nedge_id: e\n", []problem{{"identity.ca_file", 1}, {"identity.cert_file", 1}, {"identity.key_file", 1}}, ""},
		{"section left out", "edge_id: e\n", []problem{{"identity.ca_file", 0}, {"identity.cert_file", 0}, {"identity.key_file", 0}},
			"identity.ca_file: required in mtls mode"},
		{"field set to an empty value", "identity: {mode: loopback}\nlisten:\n  quic: 127.0.0.1:1\n  http: ''\n", []problem{{"listen.http", 4}},
			"listen.http (line 4): required, as host:port"},
		{"every problem gets its own line", "log:\n  format: xml\n  level: trace\nidentity:\n  mode: loopback\n  key_file: k\nlisten: {quic: '127.0.0.1:1', http: ''}\n",
			[]problem{{"listen.http", 7}, {"identity.key_file", 6}, {"log.level", 3}, {"log.format", 2}}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.src))
			var es yamlconf.Errors
			if !errors.As(err, &es) {
				t.Fatalf("Parse error %v is not a yamlconf.Errors", err)
			}
			var got []problem
			for _, e := range es {
				got = append(got, problem{e.Path, e.Line})
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("problems %v\nwant     %v\n%v", got, tt.want, err)
			}
			if tt.first != "" && !strings.HasPrefix(es[0].Error(), tt.first) {
				t.Errorf("first problem %q, want it to start %q", es[0], tt.first)
			}
		})
	}
}

func TestParseRefusesEmptyFile(t *testing.T) {
	if _, err := Parse(nil); err == nil || !strings.Contains(err.Error(), "configuration is empty") {
		t.Errorf("Parse(nil) = %v", err)
	}
}

func TestLoadErrorNamesTheFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "edge.yaml")
	if err := os.WriteFile(path, []byte("edge_id: e\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Load(path)
	if err == nil || !strings.HasPrefix(err.Error(), path+": identity.ca_file: required in mtls mode") {
		t.Errorf("Load error = %v", err)
	}
	missing := filepath.Join(dir, "nope.yaml")
	if _, err := Load(missing); !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), missing) {
		t.Errorf("Load of a missing file = %v", err)
	}
}

func TestLoadReadsAFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "edge.yaml")
	if err := os.WriteFile(path, []byte(loopbackFile), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if c.EdgeID != "edge-test" || c.Identity.Mode != "loopback" {
		t.Errorf("Load = %+v", c)
	}
}

func TestLoadErrorNamesTheFileAndLine(t *testing.T) {
	path := filepath.Join(t.TempDir(), "edge.yaml")
	if err := os.WriteFile(path, []byte("identity:\n  mode: plaintext\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Load(path)
	if want := path + `: identity.mode (line 2): must be "mtls" or "loopback", got "plaintext"`; err == nil || err.Error() != want {
		t.Errorf("Load error = %v\nwant %s", err, want)
	}
}

func TestLoadResolvesRelativePathsAgainstTheFile(t *testing.T) {
	dir := t.TempDir()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	// The same file, named absolutely and relative to the working directory (the package
	// directory, which is not dir): relative fields resolve against dir either way.
	relDir, err := filepath.Rel(wd, dir)
	if err != nil {
		t.Skipf("temp dir %s not reachable from %s: %v", dir, wd, err)
	}
	tests := []struct {
		name, value, want string
	}{
		{"file next to the config", "iop-ca.pem", filepath.Join(dir, "iop-ca.pem")},
		{"dot prefix", "./iop-ca.pem", filepath.Join(dir, "iop-ca.pem")},
		{"subdirectory", "tls/iop-ca.pem", filepath.Join(dir, "tls", "iop-ca.pem")},
		{"parent directory", "../iop-ca.pem", filepath.Join(filepath.Dir(dir), "iop-ca.pem")},
		{"absolute kept", "/etc/iop/ca.pem", "/etc/iop/ca.pem"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			name := fmt.Sprintf("edge-%d.yaml", i)
			src := fmt.Sprintf("identity:\n  ca_file: %s\n  cert_file: edge.pem\n  key_file: /abs/edge-key.pem\n", tt.value)
			if err := os.WriteFile(filepath.Join(dir, name), []byte(src), 0o600); err != nil {
				t.Fatal(err)
			}
			for _, path := range []string{filepath.Join(dir, name), filepath.Join(relDir, name)} {
				c, err := Load(path)
				if err != nil {
					t.Fatal(err)
				}
				want := Identity{Mode: "mtls", TrustDomain: "iop.local", CAFile: tt.want, CertFile: filepath.Join(dir, "edge.pem"), KeyFile: "/abs/edge-key.pem"}
				if c.Identity != want {
					t.Errorf("Load(%s) identity %+v\nwant %+v", path, c.Identity, want)
				}
			}
		})
	}
}

func TestLoadLeavesEmptyPathsEmpty(t *testing.T) {
	path := filepath.Join(t.TempDir(), "edge.yaml")
	if err := os.WriteFile(path, []byte(loopbackFile), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if id := c.Identity; id.CAFile != "" || id.CertFile != "" || id.KeyFile != "" {
		t.Errorf("loopback identity gained files: %+v", id)
	}
}

func TestParseLeavesRelativePathsAsWritten(t *testing.T) {
	c, err := Parse([]byte("identity: {ca_file: iop-ca.pem, cert_file: ./edge.pem, key_file: ../edge-key.pem}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if id := c.Identity; id.CAFile != "iop-ca.pem" || id.CertFile != "./edge.pem" || id.KeyFile != "../edge-key.pem" {
		t.Errorf("Parse changed the paths: %+v", id)
	}
}

func TestMarshalledConfigParsesBack(t *testing.T) {
	for _, c := range []*Config{mtlsConfig(), mustParse(t, loopbackFile)} {
		out, err := yaml.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		back, err := Parse(out)
		if err != nil {
			t.Fatalf("Parse(Marshal(c)): %v\n%s", err, out)
		}
		if !reflect.DeepEqual(back, c) {
			t.Errorf("round trip:\n got %+v\nwant %+v", back, c)
		}
	}
}

func mustParse(t *testing.T, src string) *Config {
	t.Helper()
	c, err := Parse([]byte(src))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// paths lists the field paths of the problems in err, in order.
func paths(err error) []string {
	var es yamlconf.Errors
	errors.As(err, &es)
	var out []string
	for _, e := range es {
		out = append(out, e.Path)
	}
	return out
}

// Issue 21: one request may be at most limits.max_request_mib, default 32
// MiB and never past the body memory it is read into.
func TestMaxRequestIsWithinTheBodyMemory(t *testing.T) {
	base := "listen: {http: \"127.0.0.1:8080\", quic: \"127.0.0.1:7443\"}\nidentity: {mode: loopback}\n"
	c, err := Parse([]byte(base + "limits: {body_memory_mib: 16}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Limits.MaxRequest() != 16<<20 {
		t.Errorf("body_memory_mib 16 without max_request_mib: max request %d, want 16 MiB", c.Limits.MaxRequest())
	}
	if c := Default(); c.Limits.MaxRequest() != DefaultMaxRequestMiB<<20 {
		t.Errorf("the default max request is %d, want %d MiB", c.Limits.MaxRequest(), DefaultMaxRequestMiB)
	}
	_, err = Parse([]byte(base + "limits: {body_memory_mib: 16, max_request_mib: 17}\n"))
	if err == nil || !strings.Contains(err.Error(), "limits.max_request_mib") || !strings.Contains(err.Error(), "must be from 1 to limits.body_memory_mib (16), got 17") {
		t.Errorf("max_request_mib past body_memory_mib: %v", err)
	}
}

// Issue 24: the shares of the limits section. Left out, one source holds an eighth of the
// connections, one principal half the body memory (never less than one largest request), and
// a body must keep up 64 KiB/s; min_body_rate_kib 0 turns the minimum off; out-of-range values
// name their field and the range.
func TestLimitsSharesHaveDefaultsAndBounds(t *testing.T) {
	base := "listen: {http: \"127.0.0.1:8080\", quic: \"127.0.0.1:7443\"}\nidentity: {mode: loopback}\n"
	c, err := Parse([]byte(base))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Limits.ConnectionsPerSource(); got != DefaultMaxConnections/8 {
		t.Errorf("default connections per source %d, want %d", got, DefaultMaxConnections/8)
	}
	if got := c.Limits.PrincipalBodyMemory(); got != DefaultBodyMemoryMiB<<20/2 {
		t.Errorf("default principal body memory %d, want half of %d MiB", got, DefaultBodyMemoryMiB)
	}
	if got := c.Limits.MinBodyRate(); got != DefaultMinBodyRateKiB<<10 {
		t.Errorf("default min body rate %d B/s, want %d KiB/s", got, DefaultMinBodyRateKiB)
	}

	c, err = Parse([]byte(base + "limits: {max_connections: 4, body_memory_mib: 16, max_request_mib: 12, body_memory_per_principal_percent: 25, min_body_rate_kib: 0}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Limits.ConnectionsPerSource(); got != 1 {
		t.Errorf("max_connections 4: %d per source, want at least 1", got)
	}
	if got := c.Limits.PrincipalBodyMemory(); got != 12<<20 {
		t.Errorf("25%% of 16 MiB with max_request_mib 12: principal body memory %d, want one largest request (12 MiB)", got)
	}
	if got := c.Limits.MinBodyRate(); got >= 0 {
		t.Errorf("min_body_rate_kib 0: rate %d, want none (negative)", got)
	}
	c, err = Parse([]byte(base + "limits: {max_connections: 100, max_connections_per_source: 100, body_memory_per_principal_percent: 100, min_body_rate_kib: 8}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Limits.ConnectionsPerSource() != 100 || c.Limits.PrincipalBodyMemory() != DefaultBodyMemoryMiB<<20 || c.Limits.MinBodyRate() != 8<<10 {
		t.Errorf("set limits: %d per source, %d principal body memory, %d B/s", c.Limits.ConnectionsPerSource(),
			c.Limits.PrincipalBodyMemory(), c.Limits.MinBodyRate())
	}

	for _, tt := range []struct{ limits, path, msg string }{
		{"{max_connections: 10, max_connections_per_source: 11}", "limits.max_connections_per_source", "must be from 1 to limits.max_connections (10), or 0 for max_connections/8; got 11"},
		{"{max_connections_per_source: -1}", "limits.max_connections_per_source", "got -1"},
		{"{body_memory_per_principal_percent: 101}", "limits.body_memory_per_principal_percent", "must be from 1 to 100 (percent of limits.body_memory_mib), or 0 for 50; got 101"},
		{"{body_memory_per_principal_percent: -5}", "limits.body_memory_per_principal_percent", "got -5"},
		{"{min_body_rate_kib: -1}", "limits.min_body_rate_kib", "must be from 0 (no minimum) to 1048576, got -1"},
		{"{min_body_rate_kib: 2000000}", "limits.min_body_rate_kib", "got 2000000"},
	} {
		_, err := Parse([]byte(base + "limits: " + tt.limits + "\n"))
		if err == nil || !strings.Contains(err.Error(), tt.path) || !strings.Contains(err.Error(), tt.msg) {
			t.Errorf("limits %s: %v; want %s: %s", tt.limits, err, tt.path, tt.msg)
		}
	}
}
