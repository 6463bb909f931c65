package nodeconfig

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/iop-dev/iop/internal/yamlconf"
)

// loopbackFile is a small valid file that tests append lines to.
const loopbackFile = `node_id: node-test
edge:
  address: 127.0.0.1:7443
identity:
  mode: loopback
providers:
  - name: sim
    adapter: simulator
    targets: [sim-small]
  - name: llm
    adapter: ollama
`

// mtlsConfig is a valid managed configuration for Validate tests.
func mtlsConfig() *Config {
	c := Default()
	c.NodeID = "gpu-01"
	c.Edge.Address = "edge.example.com:7443"
	c.Identity.CAFile = "/etc/iop/ca.pem"
	c.Identity.CertFile = "/etc/iop/node.pem"
	c.Identity.KeyFile = "/etc/iop/node-key.pem"
	c.Providers = []Provider{
		{Name: "ollama", Adapter: AdapterOllama, Targets: []string{"llama3.1:8b"}, Capacity: 2},
		{Name: "custom", Adapter: AdapterExternal, Binary: "/opt/iop/adapter", SHA256: strings.Repeat("ab", 32), Capacity: 1},
	}
	c.SetDefaults() // as Parse leaves it: every default filled
	return c
}

func TestParseFillsDefaults(t *testing.T) {
	c, err := Parse([]byte(loopbackFile))
	if err != nil {
		t.Fatal(err)
	}
	want := &Config{
		NodeID:       "node-test",
		Edge:         Edge{Address: "127.0.0.1:7443"},
		Identity:     Identity{Identity: yamlconf.Identity{Mode: "loopback", TrustDomain: "iop.local"}},
		DrainTimeout: yamlconf.Duration(30 * time.Second),
		Reconnect:    Reconnect{InitialBackoff: yamlconf.Duration(500 * time.Millisecond), MaxBackoff: yamlconf.Duration(5 * time.Second)},
		Stall:        Stall{CloseGrace: yamlconf.Duration(5 * time.Second), ProbeTimeout: yamlconf.Duration(5 * time.Second)},
		Limits:       Limits{MaxRequestMiB: 64},
		Providers: []Provider{
			{Name: "sim", Adapter: "simulator", Targets: []string{"sim-small"}, Capacity: 4, RelistInterval: yamlconf.Duration(30 * time.Second), IdleStop: yamlconf.Duration(time.Minute)},
			{Name: "llm", Adapter: "ollama", Capacity: 4, RelistInterval: yamlconf.Duration(30 * time.Second), IdleStop: yamlconf.Duration(time.Minute)},
		},
		Log: Log{Level: "info", Format: "text"},
	}
	if !reflect.DeepEqual(c, want) {
		t.Errorf("Parse:\n got %+v\nwant %+v", c, want)
	}
}

func TestDefaultNeedsNodeEdgeAndCertificates(t *testing.T) {
	got := paths(Default().Validate())
	want := []string{"node_id", "edge.address", "identity.ca_file", "identity.cert_file", "identity.key_file"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Default().Validate() paths %q, want %q", got, want)
	}
}

func TestParsePassesAdapterConfigThrough(t *testing.T) {
	c, err := Parse([]byte(loopbackFile + `    config:
      base_url: http://127.0.0.1:11434
      keep_alive: 5m
      options: {num_ctx: 8192, stop: ["</s>"], temperature: 0.2, stream: true}
`))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"base_url":   "http://127.0.0.1:11434",
		"keep_alive": "5m",
		"options":    map[string]any{"num_ctx": 8192, "stop": []any{"</s>"}, "temperature": 0.2, "stream": true},
	}
	if got := c.Providers[1].Config; !reflect.DeepEqual(got, want) {
		t.Errorf("config = %#v\nwant %#v", got, want)
	}
}

func TestValidateReportsFieldAndReason(t *testing.T) {
	tests := []struct {
		name   string
		change func(c *Config)
		path   string
		reason string
	}{
		{"node id required", func(c *Config) { c.NodeID = "" }, "node_id", "required"},
		{"node id charset", func(c *Config) { c.NodeID = "gpu/01" }, "node_id", `got "gpu/01"`},
		{"edge address required", func(c *Config) { c.Edge.Address = "" }, "edge.address", "required, as host:port"},
		{"edge address without port", func(c *Config) { c.Edge.Address = "edge.example.com" }, "edge.address", "must be host:port"},
		{"edge address without host", func(c *Config) { c.Edge.Address = ":7443" }, "edge.address", `needs a host to dial, got ":7443"`},
		{"edge address port zero", func(c *Config) { c.Edge.Address = "edge:0" }, "edge.address", "needs a port from 1 to 65535"},
		{"edge address port too big", func(c *Config) { c.Edge.Address = "edge:65536" }, "edge.address", "port must be a number from 0 to 65535"},
		{"a listed edge address without port", func(c *Config) { c.Edge.Addresses = []string{"edge-2.example.com:7443", "edge-3"} }, "edge.addresses[1]", "must be host:port"},
		{"an edge address twice", func(c *Config) { c.Edge.Addresses = []string{c.Edge.Address} }, "edge.addresses[0]", "duplicate edge address"},
		{"edge_id pins one of several edges", func(c *Config) { c.Identity.EdgeID = "e1"; c.Edge.Addresses = []string{"edge-2.example.com:7443"} },
			"identity.edge_id", "accepts one Edge at the edge address, but edge lists 2 addresses"},
		{"loopback dials a listed remote edge", func(c *Config) {
			toLoopback(c)
			c.Edge.Address = "127.0.0.1:7443"
			c.Edge.Addresses = []string{"10.0.0.2:7443"}
		}, "edge.addresses[0]",
			"loopback mode does not authenticate the Edge"},
		{"loopback dials a remote edge", func(c *Config) { toLoopback(c) }, "edge.address",
			"loopback mode does not authenticate the Edge, so the Node may only dial a loopback address"},
		{"unknown mode", func(c *Config) { c.Identity.Mode = "none" }, "identity.mode", `must be "mtls" or "loopback", got "none"`},
		{"mtls needs ca", func(c *Config) { c.Identity.CAFile = "" }, "identity.ca_file", "required in mtls mode"},
		{"mtls needs cert", func(c *Config) { c.Identity.CertFile = "" }, "identity.cert_file", "required in mtls mode"},
		{"mtls needs key", func(c *Config) { c.Identity.KeyFile = "" }, "identity.key_file", "required in mtls mode"},
		{"expected edge id charset", func(c *Config) { c.Identity.EdgeID = "edge one" }, "identity.edge_id", "must be 1 to 128"},
		{"trust domain", func(c *Config) { c.Identity.TrustDomain = "Iop" }, "identity.trust_domain", "lowercase"},
		{"max request zero", func(c *Config) { c.Limits.MaxRequestMiB = 0 }, "limits.max_request_mib", "must be from 1 to 1024, got 0"},
		{"max request too large", func(c *Config) { c.Limits.MaxRequestMiB = 4096 }, "limits.max_request_mib", "must be from 1 to 1024, got 4096"},
		{"drain timeout zero", func(c *Config) { c.DrainTimeout = 0 }, "drain_timeout", "must be more than 0s and at most 1h0m0s, got 0s"},
		{"drain timeout over an hour", func(c *Config) { c.DrainTimeout = yamlconf.Duration(61 * time.Minute) }, "drain_timeout", "got 1h1m0s"},
		{"initial backoff zero", func(c *Config) { c.Reconnect.InitialBackoff = 0 }, "reconnect.initial_backoff", "must be more than 0s, got 0s"},
		{"max backoff negative", func(c *Config) { c.Reconnect.MaxBackoff = yamlconf.Duration(-time.Second) }, "reconnect.max_backoff", "must be more than 0s, got -1s"},
		{"initial above max", func(c *Config) { c.Reconnect.InitialBackoff = yamlconf.Duration(time.Minute) }, "reconnect.initial_backoff",
			"must not exceed reconnect.max_backoff (5s), got 1m0s"},
		{"provider name required", func(c *Config) { c.Providers[1].Name = "" }, "providers[1].name", "required"},
		{"provider name charset", func(c *Config) { c.Providers[1].Name = "my model" }, "providers[1].name", "must be 1 to 128"},
		{"provider name unique", func(c *Config) { c.Providers[1].Name = "ollama" }, "providers[1].name", `duplicate provider name "ollama" (also providers[0])`},
		{"adapter required", func(c *Config) { c.Providers[0].Adapter = "" }, "providers[0].adapter", `required: one of "ollama", "openai", "simulator", "external"`},
		{"adapter unknown", func(c *Config) { c.Providers[0].Adapter = "vllm" }, "providers[0].adapter", `must be one of "ollama", "openai", "simulator", "external"; got "vllm"`},
		{"external needs binary", func(c *Config) { c.Providers[1].Binary = "" }, "providers[1].binary", `required when adapter is "external"`},
		{"external needs sha256", func(c *Config) { c.Providers[1].SHA256 = "" }, "providers[1].sha256", `required when adapter is "external"`},
		{"sha256 is hex", func(c *Config) { c.Providers[1].SHA256 = strings.Repeat("z", 64) }, "providers[1].sha256", "must be 64 hexadecimal digits"},
		{"sha256 length", func(c *Config) { c.Providers[1].SHA256 = "abcd" }, "providers[1].sha256", "must be 64 hexadecimal digits"},
		{"binary only for external", func(c *Config) { c.Providers[0].Binary = "/bin/x" }, "providers[0].binary", `only used when adapter is "external"`},
		{"sha256 only for external", func(c *Config) { c.Providers[0].SHA256 = strings.Repeat("0", 64) }, "providers[0].sha256", `only used when adapter is "external"`},
		{"empty target", func(c *Config) { c.Providers[0].Targets = []string{"a", ""} }, "providers[0].targets[1]", "must not be empty"},
		{"duplicate target", func(c *Config) { c.Providers[0].Targets = []string{"a", "a"} }, "providers[0].targets[1]", `duplicate target "a"`},
		{"capacity zero", func(c *Config) { c.Providers[0].Capacity = 0 }, "providers[0].capacity", "must be from 1 to 4096, got 0"},
		{"capacity too big", func(c *Config) { c.Providers[1].Capacity = 4097 }, "providers[1].capacity", "got 4097"},
		{"relist interval under a second", func(c *Config) { c.Providers[0].RelistInterval = yamlconf.Duration(500 * time.Millisecond) },
			"providers[0].relist_interval", "must be from 1s to 1h0m0s, got 500ms"},
		{"relist interval over an hour", func(c *Config) { c.Providers[0].RelistInterval = yamlconf.Duration(61 * time.Minute) },
			"providers[0].relist_interval", "got 1h1m0s"},
		{"relist interval negative", func(c *Config) { c.Providers[1].RelistInterval = yamlconf.Duration(-time.Second) },
			"providers[1].relist_interval", "got -1s"},
		{"idle stop under a second", func(c *Config) { c.Providers[0].IdleStop = yamlconf.Duration(500 * time.Millisecond) },
			"providers[0].idle_stop", "must be 0 (keep the plugin running) or from 1s to 24h0m0s, got 500ms"},
		{"idle stop over a day", func(c *Config) { c.Providers[1].IdleStop = yamlconf.Duration(25 * time.Hour) },
			"providers[1].idle_stop", "got 25h0m0s"},
		{"idle stop negative", func(c *Config) { c.Providers[1].IdleStop = yamlconf.Duration(-time.Second) },
			"providers[1].idle_stop", "got -1s"},
		// Issue 23: max_loaded_models, 0 for not known.
		{"max loaded models negative", func(c *Config) { c.Providers[0].MaxLoadedModels = -1 },
			"providers[0].max_loaded_models", "must be from 0 (not known) to 1024, got -1"},
		{"max loaded models too many", func(c *Config) { c.Providers[1].MaxLoadedModels = 1025 },
			"providers[1].max_loaded_models", "got 1025"},
		// Issue 10 item 4: a Node may not offer more slots than it can accept streams for.
		{"total capacity above the stream limit", func(c *Config) {
			c.Providers = nil
			for i := range 5 {
				c.Providers = append(c.Providers, Provider{Name: fmt.Sprintf("p%d", i), Adapter: AdapterSimulator, Capacity: MaxCapacity})
			}
		}, "providers", "the capacities add up to 20480; a Node offers at most 16320"},
		{"label name", func(c *Config) { c.Labels = map[string]string{"ok": "1", "a b": "2"} }, `labels["a b"]`, "a label name must be"},
		{"log level", func(c *Config) { c.Log.Level = "INFO" }, "log.level", `got "INFO"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := mtlsConfig()
			tt.change(c)
			err := c.Validate()
			var es yamlconf.Errors
			if !errors.As(err, &es) || len(es) != 1 {
				t.Fatalf("Validate() = %v, want exactly one problem", err)
			}
			if es[0].Path != tt.path || !strings.Contains(es[0].Reason, tt.reason) {
				t.Errorf("got %q: %q\nwant %q: containing %q", es[0].Path, es[0].Reason, tt.path, tt.reason)
			}
		})
	}
}

func toLoopback(c *Config) {
	c.Identity.Identity = yamlconf.Identity{Mode: "loopback", TrustDomain: "iop.local"}
}

func TestValidateAcceptsValidConfigs(t *testing.T) {
	tests := []struct {
		name   string
		change func(c *Config)
	}{
		{"managed", func(*Config) {}},
		{"no providers yet", func(c *Config) { c.Providers = nil }},
		{"targets discovered later", func(c *Config) { c.Providers[0].Targets = nil }},
		{"uppercase sha256", func(c *Config) { c.Providers[1].SHA256 = strings.Repeat("AB", 32) }},
		{"loopback on localhost", func(c *Config) { toLoopback(c); c.Edge.Address = "localhost:7443" }},
		{"loopback on ::1", func(c *Config) { toLoopback(c); c.Edge.Address = "[::1]:7443" }},
		{"equal backoffs", func(c *Config) { c.Reconnect.InitialBackoff = c.Reconnect.MaxBackoff }},
		{"drain timeout of an hour", func(c *Config) { c.DrainTimeout = yamlconf.Duration(time.Hour) }},
		{"capacity bounds", func(c *Config) { c.Providers[0].Capacity, c.Providers[1].Capacity = 1, MaxCapacity }},
		{"relist interval bounds", func(c *Config) {
			c.Providers[0].RelistInterval, c.Providers[1].RelistInterval = yamlconf.Duration(MinRelistInterval), yamlconf.Duration(MaxRelistInterval)
		}},
		// A Provider built in code (edged/dev's Node) may leave it to the runtime's default.
		{"relist interval left zero in code", func(c *Config) { c.Providers[0].RelistInterval = 0 }},
		{"idle stop bounds", func(c *Config) {
			c.Providers[0].IdleStop, c.Providers[1].IdleStop = yamlconf.Duration(MinIdleStop), yamlconf.Duration(MaxIdleStop)
		}},
		{"plugin kept running", func(c *Config) { c.Providers[0].IdleStop = 0 }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := mtlsConfig()
			tt.change(c)
			if err := c.Validate(); err != nil {
				t.Error(err)
			}
		})
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
		{"unknown provider field", loopbackFile + "    capcity: 3\n", "providers[1].capcity", 12, `unknown field; did you mean "capacity"?`},
		{"unknown top-level field", loopbackFile + "drain: 1s\n", "drain", 12, "unknown field"},
		{"duplicate provider key", loopbackFile + "    adapter: openai\n", "providers[1].adapter", 12, "duplicate key (first set on line 11)"},
		{"duplicate top-level key", loopbackFile + "node_id: again\n", "node_id", 12, "duplicate key (first set on line 1)"},
		{"capacity as text", loopbackFile + "    capacity: lots\n", "providers[1].capacity", 12, `must be an integer, got "lots"`},
		{"targets as a string", loopbackFile + "    targets: sim-small\n", "providers[1].targets", 12, `must be a list, got "sim-small"`},
		{"providers as a mapping", "providers: {name: a}\n", "providers", 1, "must be a list, got a mapping"},
		{"labels as a list", "labels: [a]\n", "labels", 1, "must be a mapping, got a list"},
		{"label value as a mapping", "labels: {zone: {a: 1}}\n", "labels.zone", 1, "must be a string, got a mapping"},
		{"bare number drain timeout", loopbackFile + "drain_timeout: 30\n", "drain_timeout", 12, `must be a duration with a unit, such as "30s" or "1m30s"; got the bare number 30`},
		{"bad drain timeout", loopbackFile + "drain_timeout: 30 seconds\n", "drain_timeout", 12, `got "30 seconds"`},
		{"bad backoff", loopbackFile + "reconnect: {max_backoff: 1.5}\n", "reconnect.max_backoff", 12, "bare number 1.5"},
		{"unknown identity field inline", "identity: {edgeid: x}\n", "identity.edgeid", 1, `did you mean "edge_id"?`},
		{"duplicate key in adapter config", loopbackFile + "    config: {a: 1, a: 2}\n", "providers[1].config.a", 12, "duplicate key"},
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
		{"bad mode", "node_id: n\nedge: {address: 'e:1'}\nidentity:\n  mode: plaintext\n", []problem{{"identity.mode", 4}},
			`identity.mode (line 4): must be "mtls" or "loopback", got "plaintext"`},
		{"explicit zero capacity", loopbackFile + "    capacity: 0\n", []problem{{"providers[1].capacity", 12}},
			"providers[1].capacity (line 12): must be from 1 to 4096, got 0"},
		{"adapter left out of a list item", loopbackFile + "  - name: third\n", []problem{{"providers[2].adapter", 12}}, ""},
		{"list item written from the next line", loopbackFile + "  -\n    name: third\n", []problem{{"providers[2].adapter", 13}}, ""},
		{"duplicate provider name", loopbackFile + "  - name: sim\n    adapter: openai\n", []problem{{"providers[2].name", 12}},
			`providers[2].name (line 12): duplicate provider name "sim" (also providers[0])`},
		{"bad target", loopbackFile + "    targets:\n      - a\n      - ''\n", []problem{{"providers[1].targets[1]", 14}}, ""},
		{"external without its binary", loopbackFile + "  - name: ext\n    adapter: external\n    sha256: " + strings.Repeat("0", 64) + "\n",
			[]problem{{"providers[2].binary", 12}}, ""},
		{"bad label name", loopbackFile + "labels:\n  zone: eu\n  \"a b\": x\n", []problem{{`labels["a b"]`, 14}}, ""},
		{"backoffs in the wrong order", loopbackFile + "reconnect:\n  max_backoff: 1s\n  initial_backoff: 2s\n",
			[]problem{{"reconnect.initial_backoff", 14}}, "reconnect.initial_backoff (line 14): must not exceed"},
		{"drain timeout too long", loopbackFile + "drain_timeout: 2h\n", []problem{{"drain_timeout", 12}}, ""},
		{"relist interval too short", loopbackFile + "    relist_interval: 100ms\n", []problem{{"providers[1].relist_interval", 12}},
			"providers[1].relist_interval (line 12): must be from 1s to 1h0m0s, got 100ms"},
		{"edge address missing from its section", "node_id: n\nidentity: {mode: loopback}\nedge:\n  server_name: e\n", []problem{{"edge.address", 3}}, ""},
		{"remote edge in loopback mode", "node_id: n\nidentity: {mode: loopback}\nedge:\n  address: edge.example.com:7443\n",
			[]problem{{"edge.address", 4}}, ""},
		{"top-level fields left out", "edge: {address: '127.0.0.1:1'}\nidentity: {mode: loopback, edge_id: 'a b'}\n",
			[]problem{{"node_id", 0}, {"identity.edge_id", 2}}, "node_id: required"},
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

func TestExplicitZeroIsRefusedNotDefaulted(t *testing.T) {
	tests := []struct{ src, path string }{
		{loopbackFile + "    capacity: 0\n", "providers[1].capacity"},
		{loopbackFile + "drain_timeout: 0s\n", "drain_timeout"},
		{loopbackFile + "reconnect: {initial_backoff: 0s}\n", "reconnect.initial_backoff"},
		{loopbackFile + "    relist_interval: 0s\n", "providers[1].relist_interval"},
	}
	for _, tt := range tests {
		if got := paths(func() error { _, err := Parse([]byte(tt.src)); return err }()); !reflect.DeepEqual(got, []string{tt.path}) {
			t.Errorf("Parse(... %s: 0) problems %q, want [%q]", tt.path, got, tt.path)
		}
	}
}

func TestLoadErrorNamesTheFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "node.yaml")
	if err := os.WriteFile(path, []byte(loopbackFile+"    capcity: 3\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Load(path)
	if want := path + `: providers[1].capcity (line 12): unknown field; did you mean "capacity"?`; err == nil || err.Error() != want {
		t.Errorf("Load error = %v\nwant %s", err, want)
	}
	if err := os.WriteFile(path, []byte("edge: {address: 'e:1'}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = Load(path)
	if err == nil || !strings.HasPrefix(err.Error(), path+": node_id: required\n") {
		t.Errorf("Load error = %v", err)
	}
	if _, err := Load(filepath.Join(dir, "nope.yaml")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Load of a missing file = %v", err)
	}
}

func TestLoadErrorNamesTheFileAndLine(t *testing.T) {
	path := filepath.Join(t.TempDir(), "node.yaml")
	if err := os.WriteFile(path, []byte(loopbackFile+"    capacity: 0\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Load(path)
	if want := path + ": providers[1].capacity (line 12): must be from 1 to 4096, got 0"; err == nil || err.Error() != want {
		t.Errorf("Load error = %v\nwant %s", err, want)
	}
}

func TestLoadResolvesRelativePathsAgainstTheFile(t *testing.T) {
	dir := t.TempDir()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	relDir, err := filepath.Rel(wd, dir)
	if err != nil {
		t.Skipf("temp dir %s not reachable from %s: %v", dir, wd, err)
	}
	const src = `node_id: n1
edge: {address: "edge.example.com:7443"}
identity:
  ca_file: iop-ca.pem
  cert_file: tls/node.pem
  key_file: /etc/iop/node-key.pem
lease_key_file: ../state/lease.key
providers:
  - {name: a, adapter: external, binary: plugins/iop-adapter-a, sha256: %[1]s}
  - {name: b, adapter: external, binary: /opt/iop/iop-adapter-b, sha256: %[1]s}
  - {name: c, adapter: external, binary: ./iop-adapter-c, sha256: %[1]s}
  - {name: d, adapter: ollama}
`
	path := filepath.Join(dir, "node.yaml")
	if err := os.WriteFile(path, []byte(fmt.Sprintf(src, strings.Repeat("ab", 32))), 0o600); err != nil {
		t.Fatal(err)
	}
	// The file is named absolutely and relative to the working directory (the package directory,
	// which is not dir): relative fields resolve against dir either way.
	for _, name := range []string{path, filepath.Join(relDir, "node.yaml")} {
		c, err := Load(name)
		if err != nil {
			t.Fatal(err)
		}
		tests := []struct{ field, got, want string }{
			{"identity.ca_file", c.Identity.CAFile, filepath.Join(dir, "iop-ca.pem")},
			{"identity.cert_file", c.Identity.CertFile, filepath.Join(dir, "tls", "node.pem")},
			{"identity.key_file", c.Identity.KeyFile, "/etc/iop/node-key.pem"},
			{"lease_key_file", c.LeaseKeyFile, filepath.Join(filepath.Dir(dir), "state", "lease.key")},
			{"providers[0].binary", c.Providers[0].Binary, filepath.Join(dir, "plugins", "iop-adapter-a")},
			{"providers[1].binary", c.Providers[1].Binary, "/opt/iop/iop-adapter-b"},
			{"providers[2].binary", c.Providers[2].Binary, filepath.Join(dir, "iop-adapter-c")},
			{"providers[3].binary", c.Providers[3].Binary, ""},
		}
		for _, tt := range tests {
			if tt.got != tt.want {
				t.Errorf("Load(%s): %s = %q, want %q", name, tt.field, tt.got, tt.want)
			}
		}
	}
}

func TestLoadLeavesEmptyPathsEmpty(t *testing.T) {
	path := filepath.Join(t.TempDir(), "node.yaml")
	if err := os.WriteFile(path, []byte(loopbackFile), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if id := c.Identity; id.CAFile != "" || id.CertFile != "" || id.KeyFile != "" || c.LeaseKeyFile != "" {
		t.Errorf("unset paths gained a directory: %+v, lease_key_file %q", id, c.LeaseKeyFile)
	}
	for i, p := range c.Providers {
		if p.Binary != "" {
			t.Errorf("providers[%d].binary = %q, want empty", i, p.Binary)
		}
	}
}

func TestParseLeavesRelativePathsAsWritten(t *testing.T) {
	c, err := Parse([]byte(loopbackFile + "lease_key_file: lease.key\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.LeaseKeyFile != "lease.key" {
		t.Errorf("lease_key_file = %q, want it as written", c.LeaseKeyFile)
	}
	c, err = Parse([]byte("node_id: n\nedge: {address: 'e:1'}\nidentity: {ca_file: ca.pem, cert_file: n.pem, key_file: k.pem}\n" +
		"providers: [{name: x, adapter: external, binary: ./x, sha256: " + strings.Repeat("0", 64) + "}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if id := c.Identity; id.CAFile != "ca.pem" || id.CertFile != "n.pem" || id.KeyFile != "k.pem" || c.Providers[0].Binary != "./x" {
		t.Errorf("Parse changed the paths: %+v, binary %q", id, c.Providers[0].Binary)
	}
}

func TestMarshalledConfigParsesBack(t *testing.T) {
	c := mtlsConfig()
	c.Labels = map[string]string{"zone": "eu"}
	c.Providers[0].Config = map[string]any{"base_url": "http://x", "opts": map[string]any{"n": 1}}
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

// Issue 22: a Node of a cluster is given several Edge addresses (edge.addresses), alone or beside
// edge.address; its seeds are all of them, in order, once each.
func TestEdgeAddressesAreTheSeeds(t *testing.T) {
	c, err := Parse([]byte(`node_id: n
edge:
  addresses: [edge-1.example.com:7443, edge-2.example.com:7443]
identity: {ca_file: ca.pem, cert_file: node.pem, key_file: node.key}
`))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Edge.Seeds(); !slices.Equal(got, []string{"edge-1.example.com:7443", "edge-2.example.com:7443"}) {
		t.Errorf("seeds %q", got)
	}
	c.Edge.Address = "lb.example.com:7443"
	if got := c.Edge.Seeds(); len(got) != 3 || got[0] != "lb.example.com:7443" {
		t.Errorf("seeds with an address too: %q", got)
	}
	if err := c.Validate(); err != nil {
		t.Errorf("address and addresses together: %v", err)
	}
}

// idle_stop: 0 in a file is the operator's choice to keep the plugin
// running, not a default to fill.
func TestExplicitZeroIdleStopKeepsThePluginRunning(t *testing.T) {
	c, err := Parse([]byte(loopbackFile + "    idle_stop: 0s\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Providers[1].IdleStop; got != 0 {
		t.Errorf("idle_stop: 0s parsed as %v, want 0", got)
	}
	if got := c.Providers[0].IdleStop; got != yamlconf.Duration(DefaultIdleStop) {
		t.Errorf("idle_stop left out: %v, want the default %v", got, DefaultIdleStop)
	}
}
