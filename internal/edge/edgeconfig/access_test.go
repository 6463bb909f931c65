package edgeconfig

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/iop-dev/iop/internal/yamlconf"
)

// hashOf is auth.HashKey, which this package cannot import.
func hashOf(key string) string {
	d := sha256.Sum256([]byte(key))
	return hex.EncodeToString(d[:])
}

// accessFile is the api, principals, profiles and routes of the brief, on a loopback Edge; the
// tests that give lines count on its layout.
var accessFile = `edge_id: edge-test
listen: {quic: '127.0.0.1:7443', http: '127.0.0.1:8080'}
identity: {mode: loopback}
api:
  keys:
    - {principal: alice, sha256: "` + hashOf("alice-key") + `"}
    - principal: bob
      sha256: "` + strings.ToUpper(hashOf("bob-key")) + `"
  allow_anonymous: true
principals:
  - {name: alice, routes: ["*"]}
  - name: bob
    routes: [llama]
profiles:
  - name: default
    deadline: 10m
    queue_timeout: 30s
    max_queue_depth: 64
    idle_timeout: 2m
    response_stall_timeout: 5m
  - name: batch
    deadline: 1h
    queue_timeout: 0s
routes:
  - name: llama
    model: llama3.2
    profile: default
    targets:
      - {target: "llama3.2:latest", adapter: ollama, nodes: [gpu-1, gpu-2]}
  - name: qwen
    model: qwen2.5:7b
    profile: batch
`

// accessConfig is a valid managed configuration with every access and routing section set.
func accessConfig() *Config {
	c := mtlsConfig()
	c.API.Keys = []APIKey{{Principal: "alice", SHA256: hashOf("alice-key")}, {Principal: "bob", SHA256: hashOf("bob-key")}}
	c.Principals = []Principal{{Name: "alice", Routes: []string{"*"}}, {Name: "bob", Routes: []string{"llama"}}}
	c.Profiles = []Profile{DefaultProfile(), {Name: "batch", Deadline: yamlconf.Duration(time.Hour),
		IdleTimeout: yamlconf.Duration(time.Minute), ResponseStallTimeout: yamlconf.Duration(time.Minute)}}
	c.Routes = []Route{
		{Name: "llama", Model: "llama3.2", Profile: "default", Targets: []Target{{Target: "llama3.2:latest", Adapter: "ollama", Nodes: []string{"gpu-1"}}}},
		{Name: "qwen", Model: "qwen2.5:7b", Profile: "batch"},
	}
	return c
}

func TestParseReadsAccessAndRoutes(t *testing.T) {
	c := mustParse(t, accessFile)
	allow := true
	want := API{Keys: []APIKey{{"alice", hashOf("alice-key")}, {"bob", strings.ToUpper(hashOf("bob-key"))}}, AllowAnonymous: &allow}
	if !reflect.DeepEqual(c.API, want) {
		t.Errorf("api %+v\nwant %+v", c.API, want)
	}
	if want := []Principal{{Name: "alice", Routes: []string{"*"}}, {Name: "bob", Routes: []string{"llama"}}}; !reflect.DeepEqual(c.Principals, want) {
		t.Errorf("principals %+v\nwant %+v", c.Principals, want)
	}
	batch := Profile{Name: "batch", Deadline: yamlconf.Duration(time.Hour), QueueTimeout: 0, MaxQueueDepth: DefaultMaxQueueDepth,
		IdleTimeout: yamlconf.Duration(DefaultIdleTimeout), KeepAliveInterval: yamlconf.Duration(DefaultKeepAliveInterval),
		ResponseStallTimeout: yamlconf.Duration(DefaultResponseStallTimeout)}
	def := DefaultProfile()
	def.IdleTimeout = yamlconf.Duration(2 * time.Minute) // the file sets it
	if want := []Profile{def, batch}; !reflect.DeepEqual(c.Profiles, want) {
		t.Errorf("profiles %+v\nwant %+v", c.Profiles, want)
	}
	want2 := []Route{
		{Name: "llama", Model: "llama3.2", Profile: "default", Targets: []Target{{Target: "llama3.2:latest", Adapter: "ollama", Nodes: []string{"gpu-1", "gpu-2"}}}},
		{Name: "qwen", Model: "qwen2.5:7b", Profile: "batch"},
	}
	if !reflect.DeepEqual(c.Routes, want2) {
		t.Errorf("routes %+v\nwant %+v", c.Routes, want2)
	}
	if !c.AnonymousAllowed() {
		t.Error("AnonymousAllowed = false with allow_anonymous: true")
	}
}

// Issue 10 item 7: admin reads follow api.admin_reads: open exactly when
// anonymous access is, unless the file says admins or open; anything else
// is refused with the field's path.
func TestAdminReadsFollowTheSettingOrAnonymousAccess(t *testing.T) {
	no := false
	for _, tt := range []struct {
		name       string
		keys       bool
		allow      *bool
		adminReads string
		want       bool
	}{
		{"single machine: loopback, no keys", false, nil, "", true},
		{"keys configured", true, nil, "", false},
		{"anonymous explicitly off", false, &no, "", false},
		{"admins on the single machine", false, nil, AdminReadsAdmins, false},
		{"open beside keys", true, nil, AdminReadsOpen, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := accessConfig()
			c.API.AllowAnonymous, c.API.AdminReads = tt.allow, tt.adminReads
			if !tt.keys {
				c.API.Keys = nil
			}
			if got := c.AdminReadsOpen(); got != tt.want {
				t.Errorf("AdminReadsOpen = %v, want %v", got, tt.want)
			}
			if err := c.Validate(); err != nil {
				t.Errorf("Validate: %v", err)
			}
		})
	}
	c := accessConfig()
	c.API.AdminReads = "everyone"
	if got := paths(c.Validate()); len(got) != 1 || got[0] != "api.admin_reads" {
		t.Errorf("admin_reads: everyone: problems at %q, want api.admin_reads", got)
	}
}

func TestAnonymousAllowedDefaultsToLoopbackWithoutKeys(t *testing.T) {
	yes, no := true, false
	tests := []struct {
		name  string
		http  string
		keys  bool
		allow *bool
		want  bool
	}{
		{"no keys on loopback", "127.0.0.1:8080", false, nil, true},
		{"no keys on localhost", "localhost:8080", false, nil, true},
		{"no keys on ::1", "[::1]:8080", false, nil, true},
		{"keys on loopback", "127.0.0.1:8080", true, nil, false},
		{"no keys on every interface", "0.0.0.0:8080", false, nil, false},
		{"no keys on an empty host", ":8080", false, nil, false},
		{"explicitly off", "127.0.0.1:8080", false, &no, false},
		{"explicitly on beside keys", "127.0.0.1:8080", true, &yes, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := accessConfig()
			c.Listen.HTTP, c.API.AllowAnonymous = tt.http, tt.allow
			if !tt.keys {
				c.API.Keys = nil
			}
			if got := c.AnonymousAllowed(); got != tt.want {
				t.Errorf("AnonymousAllowed = %v, want %v", got, tt.want)
			}
			if err := c.Validate(); err != nil {
				t.Errorf("Validate: %v", err)
			}
		})
	}
}

func TestValidateAccessAndRoutes(t *testing.T) {
	yes := true
	tests := []struct {
		name   string
		change func(c *Config)
		path   string
		reason string
	}{
		{"anonymous on every interface", func(c *Config) { c.Listen.HTTP = "0.0.0.0:8080"; c.API.AllowAnonymous = &yes }, "api.allow_anonymous",
			`anonymous access is only allowed on a loopback listen.http; got "0.0.0.0:8080"`},
		{"anonymous on a host name", func(c *Config) { c.Listen.HTTP = "edge.example.com:80"; c.API.AllowAnonymous = &yes }, "api.allow_anonymous",
			"only allowed on a loopback listen.http"},
		{"key of an unknown principal", func(c *Config) { c.API.Keys[1].Principal = "carol" }, "api.keys[1].principal",
			`unknown principal "carol"; add it under principals`},
		{"key without principal", func(c *Config) { c.API.Keys[0].Principal = "" }, "api.keys[0].principal", "required"},
		{"key hash not hex", func(c *Config) { c.API.Keys[0].SHA256 = strings.Repeat("g", 64) }, "api.keys[0].sha256",
			"must be 64 hexadecimal digits (the SHA-256 of the key, not the key), got 64 characters"},
		{"key hash too short", func(c *Config) { c.API.Keys[0].SHA256 = "abcd" }, "api.keys[0].sha256", "got 4 characters"},
		{"key hash missing", func(c *Config) { c.API.Keys[0].SHA256 = "" }, "api.keys[0].sha256", "required"},
		{"hash of the empty key", func(c *Config) { c.API.Keys[0].SHA256 = hashOf("") }, "api.keys[0].sha256", "SHA-256 of an empty key"},
		{"same key twice", func(c *Config) { c.API.Keys[1].SHA256 = strings.ToUpper(c.API.Keys[0].SHA256) }, "api.keys[1].sha256",
			"the same key as api.keys[0]"},
		{"principal name", func(c *Config) { c.Principals[0].Name = "al ice"; c.API.Keys = nil }, "principals[0].name", "must be 1 to 128 characters"},
		{"principal named anonymous", func(c *Config) { c.Principals[0].Name = "anonymous"; c.API.Keys = nil }, "principals[0].name",
			`"anonymous" is reserved for requests without a key`},
		{"duplicate principal", func(c *Config) { c.Principals[1].Name = "alice"; c.API.Keys = c.API.Keys[:1] }, "principals[1].name",
			`duplicate principal "alice" (first at principals[0])`},
		{"principal of an unknown route", func(c *Config) { c.Principals[1].Routes = []string{"llama", "mistral"} }, "principals[1].routes[1]",
			`unknown route "mistral"; name a route under routes, or "*" for all`},
		{"principal routes a model", func(c *Config) { c.Principals[1].Routes = []string{"llama3.2"} }, "principals[1].routes[0]", `unknown route "llama3.2"`},
		{"principal without routes", func(c *Config) { c.Principals[1].Routes = nil }, "principals[1].routes", "required"},
		{"principal route twice", func(c *Config) { c.Principals[1].Routes = []string{"llama", "llama"} }, "principals[1].routes[1]", `duplicate route "llama"`},
		{"profile name", func(c *Config) { c.Profiles[1].Name = ""; c.Routes[1].Profile = "default" }, "profiles[1].name", "required"},
		{"duplicate profile", func(c *Config) { c.Profiles[1].Name = "default"; c.Routes[1].Profile = "default" }, "profiles[1].name",
			`duplicate profile "default" (first at profiles[0])`},
		{"deadline zero", func(c *Config) { c.Profiles[0].Deadline = 0 }, "profiles[0].deadline", "must be more than 0 and at most 24h0m0s, got 0s"},
		{"deadline too long", func(c *Config) { c.Profiles[0].Deadline = yamlconf.Duration(25 * time.Hour) }, "profiles[0].deadline", "got 25h0m0s"},
		{"queue timeout negative", func(c *Config) { c.Profiles[0].QueueTimeout = -1 }, "profiles[0].queue_timeout", "must be from 0 (never queue) to 1h0m0s"},
		{"queue timeout too long", func(c *Config) { c.Profiles[0].QueueTimeout = yamlconf.Duration(2 * time.Hour) }, "profiles[0].queue_timeout", "got 2h0m0s"},
		{"queue depth negative", func(c *Config) { c.Profiles[1].MaxQueueDepth = -1 }, "profiles[1].max_queue_depth", "must be from 0 to 100000, got -1"},
		{"queue depth too large", func(c *Config) { c.Profiles[1].MaxQueueDepth = 100_001 }, "profiles[1].max_queue_depth", "got 100001"},
		{"idle timeout zero", func(c *Config) { c.Profiles[1].IdleTimeout = 0 }, "profiles[1].idle_timeout", "must be more than 0"},
		{"stall timeout zero", func(c *Config) { c.Profiles[1].ResponseStallTimeout = 0 }, "profiles[1].response_stall_timeout", "must be from 1ms to 1h0m0s, got 0s"},
		{"stall timeout too long", func(c *Config) { c.Profiles[1].ResponseStallTimeout = yamlconf.Duration(time.Hour + time.Millisecond) },
			"profiles[1].response_stall_timeout", "got 1h0m0.001s"},
		{"stall timeout below a millisecond", func(c *Config) { c.Profiles[1].ResponseStallTimeout = yamlconf.Duration(500 * time.Microsecond) },
			"profiles[1].response_stall_timeout", "must be from 1ms"},
		{"stall timeout in fractions of a millisecond", func(c *Config) { c.Profiles[1].ResponseStallTimeout = yamlconf.Duration(1500 * time.Microsecond) },
			"profiles[1].response_stall_timeout", "must be a whole number of milliseconds (it travels as response_stall_timeout_ms), got 1.5ms"},
		{"route name", func(c *Config) { c.Routes[0].Name = "llama 3"; c.Principals[1].Routes = []string{"*"} }, "routes[0].name", "must be 1 to 128"},
		{"duplicate route", func(c *Config) { c.Routes[1].Name = "llama" }, "routes[1].name", `duplicate route "llama" (first at routes[0])`},
		{"route without model", func(c *Config) { c.Routes[1].Model = "" }, "routes[1].model", "required"},
		{"model with a space", func(c *Config) { c.Routes[1].Model = "qwen 2" }, "routes[1].model", "must not contain spaces or control characters"},
		{"model too long", func(c *Config) { c.Routes[1].Model = strings.Repeat("m", 257) }, "routes[1].model", "must be at most 256 bytes, got 257"},
		{"model not UTF-8", func(c *Config) { c.Routes[1].Model = "q\xff" }, "routes[1].model", "must be valid UTF-8"},
		{"duplicate model", func(c *Config) { c.Routes[1].Model = "llama3.2" }, "routes[1].model", `model "llama3.2" is already routed by routes[0].model`},
		{"duplicate model by its latest tag", func(c *Config) { c.Routes[1].Model = "llama3.2:latest" }, "routes[1].model", "already routed by routes[0].model"},
		{"unknown profile", func(c *Config) { c.Routes[1].Profile = "fast" }, "routes[1].profile", `unknown profile "fast"; define it under profiles, or use "default"`},
		{"target without name", func(c *Config) { c.Routes[0].Targets[0].Target = "" }, "routes[0].targets[0].target", "required"},
		{"target adapter", func(c *Config) { c.Routes[0].Targets[0].Adapter = "o llama" }, "routes[0].targets[0].adapter", "must be 1 to 128"},
		{"target node", func(c *Config) { c.Routes[0].Targets[0].Nodes = []string{"gpu/1"} }, "routes[0].targets[0].nodes[0]", "must be 1 to 128"},
		{"target node twice", func(c *Config) { c.Routes[0].Targets[0].Nodes = []string{"gpu-1", "gpu-1"} }, "routes[0].targets[0].nodes[1]", `duplicate node "gpu-1"`},
		{"target twice", func(c *Config) {
			c.Routes[0].Targets = append(c.Routes[0].Targets, Target{Target: "llama3.2:latest", Adapter: "ollama"})
		},
			"routes[0].targets[1]", "the same target and adapter as routes[0].targets[0]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := accessConfig()
			tt.change(c)
			wantOneProblem(t, c.Validate(), tt.path, tt.reason)
		})
	}
}

func TestValidateAcceptsAccessVariants(t *testing.T) {
	tests := []struct {
		name   string
		change func(c *Config)
	}{
		{"the base", func(*Config) {}},
		{"default profile implicit", func(c *Config) { c.Profiles = c.Profiles[1:] }},
		{"no profiles, routes on the default", func(c *Config) { c.Profiles = nil; c.Routes[1].Profile = DefaultProfileName }},
		{"principal without keys", func(c *Config) { c.API.Keys = c.API.Keys[:1] }},
		{"nothing at all", func(c *Config) { c.API, c.Principals, c.Profiles, c.Routes = API{}, nil, nil, nil }},
		{"never queue", func(c *Config) { c.Profiles[0].QueueTimeout, c.Profiles[0].MaxQueueDepth = 0, 0 }},
		{"bounds", func(c *Config) {
			c.Profiles[0].Deadline, c.Profiles[0].QueueTimeout = yamlconf.Duration(MaxDeadline), yamlconf.Duration(MaxQueueTimeout)
			c.Profiles[0].MaxQueueDepth, c.Profiles[0].IdleTimeout = MaxQueueDepth, yamlconf.Duration(MaxIdleTimeout)
			c.Profiles[0].ResponseStallTimeout, c.Profiles[1].ResponseStallTimeout = yamlconf.Duration(MaxResponseStallTimeout), yamlconf.Duration(MinResponseStallTimeout)
		}},
		{"provider model names", func(c *Config) {
			c.Routes[1].Model = "meta-llama/Llama-3.1-8B-Instruct"
			c.Routes[1].Targets = []Target{{Target: "hf.co/x/y:Q4_K_M"}}
		}},
		{"same target through two adapters", func(c *Config) {
			c.Routes[0].Targets = append(c.Routes[0].Targets, Target{Target: "llama3.2:latest", Adapter: "openai"})
		}},
		{"anonymous off in public", func(c *Config) { no := false; c.Listen.HTTP = "0.0.0.0:8080"; c.API.AllowAnonymous = &no }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := accessConfig()
			tt.change(c)
			if err := c.Validate(); err != nil {
				t.Error(err)
			}
		})
	}
}

func TestValidateDoesNotEchoAKeyPastedAsItsHash(t *testing.T) {
	c := accessConfig()
	c.API.Keys[0].SHA256 = "sk-live-secret-key"
	err := c.Validate()
	if err == nil || strings.Contains(err.Error(), "secret") {
		t.Errorf("Validate = %v; want a problem that does not repeat the value", err)
	}
}

func TestParseReportsAccessProblemsWithLines(t *testing.T) {
	type problem struct {
		path string
		line int
	}
	tests := []struct {
		name  string
		src   string
		want  []problem
		first string
	}{
		{"unknown profile", strings.Replace(accessFile, "profile: batch", "profile: fast", 1), []problem{{"routes[1].profile", 32}},
			`routes[1].profile (line 32): unknown profile "fast"`},
		{"duplicate model", strings.Replace(accessFile, "model: qwen2.5:7b", "model: llama3.2:latest", 1), []problem{{"routes[1].model", 31}},
			`routes[1].model (line 31): model "llama3.2:latest" is already routed by routes[0].model`},
		{"principal naming an unknown route", strings.Replace(accessFile, "routes: [llama]", "routes: [llama, mistral]", 1),
			[]problem{{"principals[1].routes[1]", 13}}, `principals[1].routes[1] (line 13): unknown route "mistral"`},
		{"key of an unknown principal", strings.Replace(accessFile, "principal: bob", "principal: carol", 1), []problem{{"api.keys[1].principal", 7}},
			`api.keys[1].principal (line 7): unknown principal "carol"`},
		{"bad hex", strings.Replace(accessFile, strings.ToUpper(hashOf("bob-key")), "xyz", 1), []problem{{"api.keys[1].sha256", 8}},
			"api.keys[1].sha256 (line 8): must be 64 hexadecimal digits"},
		{"duration out of range", strings.Replace(accessFile, "deadline: 1h", "deadline: 48h", 1), []problem{{"profiles[1].deadline", 22}},
			"profiles[1].deadline (line 22): must be more than 0 and at most 24h0m0s, got 48h0m0s"},
		{"stall timeout out of range", strings.Replace(accessFile, "response_stall_timeout: 5m", "response_stall_timeout: 2h", 1),
			[]problem{{"profiles[0].response_stall_timeout", 20}}, "profiles[0].response_stall_timeout (line 20): must be from 1ms to 1h0m0s"},
		{"anonymous in public", strings.Replace(accessFile, "http: '127.0.0.1:8080'", "http: '0.0.0.0:8080'", 1), []problem{{"api.allow_anonymous", 9}},
			`api.allow_anonymous (line 9): anonymous access is only allowed on a loopback listen.http; got "0.0.0.0:8080"`},
		{"duplicate profile", strings.Replace(accessFile, "name: batch", "name: default", 1), []problem{{"profiles[1].name", 21}, {"routes[1].profile", 32}},
			`profiles[1].name (line 21): duplicate profile "default" (first at profiles[0])`},
		{"bad target node", strings.Replace(accessFile, "gpu-2", "'gpu 2'", 1), []problem{{"routes[0].targets[0].nodes[1]", 29}}, ""},
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

func TestParseReportsAFieldLeftOutAtItsListItem(t *testing.T) {
	src := strings.Replace(accessFile, "  - name: batch\n    deadline: 1h\n", "  - deadline: 1h\n", 1)
	_, err := Parse([]byte(src))
	var e *yamlconf.Error // the first problem; routes[1] then names a profile that is not there
	if !errors.As(err, &e) || e.Path != "profiles[1].name" || e.Line != 21 || e.Reason != "required" {
		t.Errorf("Parse = %v, want profiles[1].name (line 21): required", err)
	}
}

// Issue 24, gap 1: api.allowed_hosts and api.allowed_origins are read from the file and
// applied by a reload, like the rest of who may call.
func TestParseReadsAllowedHostsAndOrigins(t *testing.T) {
	c := mustParse(t, strings.Replace(accessFile, "  allow_anonymous: true\n",
		"  allow_anonymous: true\n  allowed_hosts: [edge.lan, GPU-Box.local]\n  allowed_origins: ['https://chat.example', 'http://127.0.0.1:3000']\n", 1))
	if want := []string{"edge.lan", "GPU-Box.local"}; !reflect.DeepEqual(c.API.AllowedHosts, want) {
		t.Errorf("allowed_hosts = %q, want %q", c.API.AllowedHosts, want)
	}
	if want := []string{"https://chat.example", "http://127.0.0.1:3000"}; !reflect.DeepEqual(c.API.AllowedOrigins, want) {
		t.Errorf("allowed_origins = %q, want %q", c.API.AllowedOrigins, want)
	}
	if d := Default(); len(d.API.AllowedHosts) != 0 || len(d.API.AllowedOrigins) != 0 {
		t.Error("hosts or origins allowed by default")
	}
	for _, path := range []string{"api.allowed_hosts", "api.allowed_origins"} {
		if !Reloadable(path) {
			t.Errorf("%s is not reloadable", path)
		}
	}
}

func TestValidateAllowedHostsAndOrigins(t *testing.T) {
	tests := []struct {
		name   string
		hosts  []string
		origs  []string
		path   string
		reason string
	}{
		{"empty host", []string{""}, nil, "api.allowed_hosts[0]", "required"},
		{"wildcard host", []string{"*"}, nil, "api.allowed_hosts[0]", "wildcards are not supported"},
		{"wildcard subdomain", []string{"*.example.lan"}, nil, "api.allowed_hosts[0]", "wildcards are not supported"},
		{"host with a port", []string{"edge.lan:8080"}, nil, "api.allowed_hosts[0]", "without a port"},
		{"host as a URL", []string{"http://edge.lan"}, nil, "api.allowed_hosts[0]", "without a port"},
		{"host with a trailing dot", []string{"edge.lan."}, nil, "api.allowed_hosts[0]", `write it as "edge.lan"`},
		{"IP address", []string{"192.168.1.5"}, nil, "api.allowed_hosts[0]", "always accepted"},
		{"IPv6 address", []string{"[fd00::1]"}, nil, "api.allowed_hosts[0]", "always accepted"},
		{"localhost", []string{"localhost"}, nil, "api.allowed_hosts[0]", "always accepted"},
		{"under localhost", []string{"app.localhost"}, nil, "api.allowed_hosts[0]", "always accepted"},
		{"not a name", []string{"edge lan"}, nil, "api.allowed_hosts[0]", "must be a DNS name"},
		{"unicode name", []string{"bücher.lan"}, nil, "api.allowed_hosts[0]", "xn--"},
		{"label too long", []string{strings.Repeat("a", 64) + ".lan"}, nil, "api.allowed_hosts[0]", "must be a DNS name"},
		{"empty label", []string{"edge..lan"}, nil, "api.allowed_hosts[0]", "must be a DNS name"},
		{"host twice", []string{"edge.lan", "EDGE.lan"}, nil, "api.allowed_hosts[1]", "the same name as api.allowed_hosts[0]"},
		{"empty origin", nil, []string{""}, "api.allowed_origins[0]", "required"},
		{"wildcard origin", nil, []string{"*"}, "api.allowed_origins[0]", "would let every web page"},
		{"wildcard in an origin", nil, []string{"https://*.example"}, "api.allowed_origins[0]", "would let every web page"},
		{"null origin", nil, []string{"null"}, "api.allowed_origins[0]", "sandboxed"},
		{"origin without scheme", nil, []string{"chat.example"}, "api.allowed_origins[0]", "scheme://host[:port]"},
		{"origin with a path", nil, []string{"https://chat.example/app"}, "api.allowed_origins[0]", `write "https://chat.example"`},
		{"origin with a slash", nil, []string{"https://chat.example/"}, "api.allowed_origins[0]", `write "https://chat.example"`},
		{"origin with a query", nil, []string{"https://chat.example?x=1"}, "api.allowed_origins[0]", `write "https://chat.example"`},
		{"origin with credentials", nil, []string{"https://u:p@chat.example"}, "api.allowed_origins[0]", `write "https://chat.example"`},
		{"origin with the default port", nil, []string{"https://chat.example:443"}, "api.allowed_origins[0]", `leave the default port out: write "https://chat.example"`},
		{"origin with a bad port", nil, []string{"http://chat.example:70000"}, "api.allowed_origins[0]", "port"},
		{"origin with a bad host", nil, []string{"https://chat example"}, "api.allowed_origins[0]", "scheme://host[:port]"},
		{"origin twice", nil, []string{"https://chat.example", "HTTPS://Chat.Example"}, "api.allowed_origins[1]", "the same origin as api.allowed_origins[0]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := accessConfig()
			c.API.AllowedHosts, c.API.AllowedOrigins = tt.hosts, tt.origs
			wantOneProblem(t, c.Validate(), tt.path, tt.reason)
		})
	}
}

func TestValidateAcceptsAllowedHostsAndOrigins(t *testing.T) {
	c := accessConfig()
	c.API.AllowedHosts = []string{"edge.lan", "GPU-Box.local", "edge_1.internal", "xn--bcher-kva.lan", "ollama", "edge.tail1234.ts.net"}
	c.API.AllowedOrigins = []string{"https://chat.example", "http://localhost:3000", "http://127.0.0.1:8080", "http://[::1]:5173",
		"chrome-extension://abcdefghijklmnopabcdefghijklmnop", "app://open-webui"}
	if err := c.Validate(); err != nil {
		t.Error(err)
	}
}
