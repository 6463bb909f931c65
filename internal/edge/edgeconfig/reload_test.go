package edgeconfig

import (
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/iop-dev/iop/internal/yamlconf"
)

// A reload applies keys, principals, trusted networks, routes, profiles and credentials, and
// keeps everything else as it runs, naming what differs.
func TestForReloadAppliesWhatMayChangeAndNamesTheRest(t *testing.T) {
	running := credentialConfig()
	next := credentialConfig()
	next.API.Keys = append(next.API.Keys, APIKey{Principal: "bob", SHA256: hashOf("bob-2")})
	next.Routes[1].Profile = "default"
	next.Profiles[1].QueueTimeout = yamlconf.Duration(time.Second)
	next.Listen.HTTP = "0.0.0.0:9090"
	next.Identity.TrustDomain = "other.test"
	next.Limits.MaxConnections = 10
	next.DataDir = "/var/lib/iop"
	next.API.TLS = TLS{CertFile: "/a.crt", KeyFile: "/a.key"}

	merged, restart, err := running.ForReload(next)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"api.tls", "data_dir", "identity", "limits", "listen"}; !slices.Equal(restart, want) {
		t.Errorf("restart required %q, want %q", restart, want)
	}
	if !reflect.DeepEqual(merged.API.Keys, next.API.Keys) || !reflect.DeepEqual(merged.Routes, next.Routes) || !reflect.DeepEqual(merged.Profiles, next.Profiles) {
		t.Error("the reloadable sections were not taken from the new file")
	}
	if merged.Listen != running.Listen || merged.Identity != running.Identity || merged.Limits != running.Limits ||
		merged.DataDir != running.DataDir || merged.API.TLS != running.API.TLS {
		t.Errorf("a field that needs a restart was taken from the new file: %+v", merged)
	}
	if running.Routes[1].Profile != "batch" || len(running.API.Keys) != 2 {
		t.Error("ForReload modified the running configuration")
	}

	changes := running.Changes(merged)
	for _, want := range []string{"api.keys: 2 -> 3", "profiles: ~batch", "routes: ~qwen"} {
		if !slices.Contains(changes, want) {
			t.Errorf("changes %q lack %q", changes, want)
		}
	}
	if len(changes) != 3 {
		t.Errorf("changes %q, want exactly 3", changes)
	}
	if strings.Contains(strings.Join(changes, " "), hashOf("bob-2")) {
		t.Error("the summary shows a key's hash")
	}
}

func TestChangesNamesAddedAndRemovedEntries(t *testing.T) {
	running := accessConfig()
	next := accessConfig()
	next.Routes = append(next.Routes[:1], Route{Name: "code", Model: "qwen-coder", Profile: "default"})
	next.Principals = append(next.Principals, Principal{Name: "lan", Routes: []string{"llama"}})
	next.API.TrustedNetworks = []TrustedNetwork{{CIDR: "192.168.1.0/24", Principal: "lan"}}
	next.API.AllowedHosts = []string{"llm.home.arpa"}
	next.API.AllowedOrigins = []string{"https://chat.home.arpa"}
	got := running.Changes(next)
	want := []string{"api.allowed_hosts: +llm.home.arpa", "api.allowed_origins: +https://chat.home.arpa",
		"api.trusted_networks: +192.168.1.0/24", "principals: +lan", "routes: +code -qwen"}
	if !slices.Equal(got, want) {
		t.Errorf("Changes = %q, want %q", got, want)
	}
	if c := running.Changes(accessConfig()); len(c) != 0 {
		t.Errorf("Changes of an identical file = %q, want none", c)
	}
}

// The merged configuration is validated whole: a file that is valid only with its own
// listen.http (anonymous access, on a loopback address) is refused while the running address,
// which only a restart changes, is public.
func TestForReloadValidatesTheMergedConfiguration(t *testing.T) {
	running := accessConfig()
	running.Listen.HTTP = "0.0.0.0:8080"
	next := accessConfig()
	yes := true
	next.API.AllowAnonymous = &yes
	if err := next.Validate(); err != nil {
		t.Fatalf("the new file alone: %v", err)
	}
	_, restart, err := running.ForReload(next)
	if err == nil || !strings.Contains(err.Error(), "api.allow_anonymous") {
		t.Errorf("ForReload = %v; want api.allow_anonymous refused on the running public address", err)
	}
	if !slices.Equal(restart, []string{"listen"}) {
		t.Errorf("restart required %q, want [listen]", restart)
	}
}

// Every field is either reloadable or needs a restart, and the reloadable ones are named by
// their yaml paths: a renamed field would otherwise silently need a restart.
func TestReloadableNamesRealFields(t *testing.T) {
	var all []string
	walkFields(reflect.TypeFor[Config](), "", func(path string, _ []int) { all = append(all, path) })
	for path := range reloadable {
		if !slices.Contains(all, path) {
			t.Errorf("reloadable %q is not a field of Config", path)
		}
	}
	for _, restart := range []string{"edge_id", "listen", "identity", "data_dir", "limits", "log", "api.tls"} {
		if Reloadable(restart) {
			t.Errorf("%s is reloadable; it sizes or names the process", restart)
		}
		if !slices.Contains(all, restart) {
			t.Errorf("%q is not a field of Config", restart)
		}
	}
}

// P5, issue 24: a reload may not take away the last admin key while the running configuration has
// one (nobody could call the admin endpoints, reload included, afterwards); it may replace it,
// and a configuration that has none may stay without.
func TestKeepsAdminRefusesTheLossOfTheLastAdminKey(t *testing.T) {
	running := credentialConfig() // alice is an admin, with one key
	if n := running.AdminKeys(); n != 1 {
		t.Fatalf("AdminKeys = %d, want 1", n)
	}
	for _, tt := range []struct {
		name string
		edit func(c *Config)
		ok   bool
	}{
		{"unchanged", func(*Config) {}, true},
		{"the admin key rotated", func(c *Config) { c.API.Keys[0].SHA256 = hashOf("alice-2") }, true},
		{"another principal made the admin", func(c *Config) { c.Principals[0].Admin, c.Principals[1].Admin = false, true }, true},
		{"the admin key removed", func(c *Config) { c.API.Keys = c.API.Keys[1:] }, false},
		{"every key removed", func(c *Config) { c.API.Keys = nil }, false},
		{"admin taken from the principal", func(c *Config) { c.Principals[0].Admin = false }, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			next := credentialConfig()
			tt.edit(next)
			err := running.KeepsAdmin(next)
			if (err == nil) != tt.ok {
				t.Fatalf("KeepsAdmin = %v, want ok %t", err, tt.ok)
			}
			if err != nil && (!errors.Is(err, ErrLastAdminKey) || !strings.Contains(err.Error(), "restart")) {
				t.Errorf("error %q: want ErrLastAdminKey, saying a restart applies it", err)
			}
		})
	}
	none := credentialConfig()
	none.Principals[0].Admin = false
	if err := none.KeepsAdmin(none); err != nil {
		t.Errorf("a configuration without an admin key reloaded as it is: %v", err)
	}
}

// The scheduling section is read per request (a request's wake timeout, issue 23, from the
// configuration it was resolved in): a reload applies it.
func TestReloadAppliesTheWakeTimeout(t *testing.T) {
	running := credentialConfig()
	next := credentialConfig()
	off := yamlconf.Duration(0)
	next.Scheduling.WakeTimeout = &off
	merged, restart, err := running.ForReload(next)
	if err != nil {
		t.Fatal(err)
	}
	if len(restart) != 0 || merged.WakeTimeout() != 0 {
		t.Errorf("restart required %q, wake timeout %v; want it applied (0)", restart, merged.WakeTimeout())
	}
}
