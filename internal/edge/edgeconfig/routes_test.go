package edgeconfig

import (
	"reflect"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/iop-dev/iop/internal/yamlconf"
)

func TestDefaultProfileHasTheDocumentedTimers(t *testing.T) {
	want := Profile{
		Name:                 "default",
		Deadline:             yamlconf.Duration(10 * time.Minute),
		QueueTimeout:         yamlconf.Duration(30 * time.Second),
		MaxQueueDepth:        64,
		IdleTimeout:          yamlconf.Duration(6 * time.Minute), // the stall timeout + 1m (issue 11)
		KeepAliveInterval:    yamlconf.Duration(15 * time.Second),
		ResponseStallTimeout: yamlconf.Duration(5 * time.Minute),
	}
	if got := DefaultProfile(); got != want {
		t.Errorf("DefaultProfile() = %+v\nwant %+v", got, want)
	}
	if got := DefaultProfile().ResponseStallTimeoutMS(); got != 300_000 {
		t.Errorf("ResponseStallTimeoutMS = %d, want 300000 (what a Node reads 0 as)", got)
	}
}

// Issue 11: a profile that sets a longer stall timeout but no idle
// timeout gets an idle timeout longer than its stall timeout, so a silent
// prefill is the stall watchdog's to end; one that sets its idle timeout
// keeps it.
func TestTheIdleTimeoutDefaultsAboveTheStallTimeout(t *testing.T) {
	c, err := Parse([]byte(`identity: {mode: loopback}
listen: {quic: '127.0.0.1:7443'}
profiles:
  - {name: slow, response_stall_timeout: 20m}
  - {name: set, idle_timeout: 30s}
`))
	if err != nil {
		t.Fatal(err)
	}
	if got := time.Duration(c.Profile("slow").IdleTimeout); got != 21*time.Minute {
		t.Errorf("slow: idle timeout %v, want the stall timeout + 1m (21m)", got)
	}
	if got := time.Duration(c.Profile("set").IdleTimeout); got != 30*time.Second {
		t.Errorf("set: idle timeout %v, want the file's 30s", got)
	}
	if got := time.Duration(c.Profile("default").IdleTimeout); got <= time.Duration(c.Profile("default").ResponseStallTimeout) {
		t.Errorf("default: idle timeout %v, not above the stall timeout", got)
	}
}

func TestProfileFindsNamedAndDefaultProfiles(t *testing.T) {
	fast := Profile{Name: "fast", Deadline: yamlconf.Duration(time.Minute), IdleTimeout: yamlconf.Duration(time.Second),
		ResponseStallTimeout: yamlconf.Duration(1500 * time.Millisecond)}
	myDefault := DefaultProfile()
	myDefault.Deadline = yamlconf.Duration(time.Hour)

	tests := []struct {
		name     string
		profiles []Profile
		ask      string
		want     Profile
	}{
		{"default when the file has none", nil, "default", DefaultProfile()},
		{"default beside other profiles", []Profile{fast}, "default", DefaultProfile()},
		{"a named profile", []Profile{fast}, "fast", fast},
		{"the file's default", []Profile{fast, myDefault}, "default", myDefault},
		{"an unknown name falls back to the file's default", []Profile{myDefault}, "slow", myDefault},
		{"an unknown name falls back to the built-in default", []Profile{fast}, "slow", DefaultProfile()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &Config{Profiles: tt.profiles}
			if got := c.Profile(tt.ask); got != tt.want {
				t.Errorf("Profile(%q) = %+v\nwant %+v", tt.ask, got, tt.want)
			}
		})
	}
	if got := fast.ResponseStallTimeoutMS(); got != 1500 {
		t.Errorf("ResponseStallTimeoutMS = %d, want 1500", got)
	}
}

func TestRouteForModel(t *testing.T) {
	c := &Config{Routes: []Route{
		{Name: "llama", Model: "llama3.2"},
		{Name: "qwen", Model: "qwen2.5:latest"},
		{Name: "qwen-7b", Model: "qwen2.5:7b"},
	}}
	tests := []struct {
		model string
		want  string // route name; "" for none
	}{
		{"llama3.2", "llama"},
		{"llama3.2:latest", "llama"},
		{"qwen2.5:latest", "qwen"},
		{"qwen2.5", "qwen"},
		{"qwen2.5:7b", "qwen-7b"},
		{"qwen2.5:14b", ""},
		{"Llama3.2", ""}, // names compare exactly
		{"llama", ""},    // a route's name is not a model
		{"", ""},
	}
	for _, tt := range tests {
		r, ok := c.RouteForModel(tt.model)
		if ok != (tt.want != "") || r.Name != tt.want {
			t.Errorf("RouteForModel(%q) = %q, %v; want %q", tt.model, r.Name, ok, tt.want)
		}
	}
}

func TestRouteAndProfileDefaultsWhenParsed(t *testing.T) {
	c := mustParse(t, loopbackFile+"profiles:\n  - name: quick\n    queue_timeout: 0s\n    max_queue_depth: 0\nroutes:\n  - {name: r, model: m}\n")
	if got := c.Routes[0].Profile; got != DefaultProfileName {
		t.Errorf("route profile = %q, want %q", got, DefaultProfileName)
	}
	want := DefaultProfile()
	want.Name, want.QueueTimeout, want.MaxQueueDepth = "quick", 0, 0 // set to 0 in the file: never queue
	if got := c.Profile("quick"); got != want {
		t.Errorf("Profile(quick) = %+v\nwant %+v", got, want)
	}
}

func TestSetDefaultsFillsProfilesAndRoutesBuiltInCode(t *testing.T) {
	c := &Config{Profiles: []Profile{{Name: "p"}}, Routes: []Route{{Name: "r", Model: "m"}}}
	c.SetDefaults()
	want := DefaultProfile()
	want.Name = "p"
	if c.Profiles[0] != want || c.Routes[0].Profile != DefaultProfileName {
		t.Errorf("after SetDefaults: %+v, %+v", c.Profiles[0], c.Routes[0])
	}
}

func TestAccessConfigMarshalsAndParsesBack(t *testing.T) {
	yes := true
	for _, c := range []*Config{accessConfig(), mustParse(t, accessFile)} {
		c.API.AllowAnonymous = &yes
		c.Listen.HTTP = "127.0.0.1:8080"
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

// TestExamplesDeclareAccessAndRoutes pins what configs/edge-*.yaml promise about the client API:
// the dev Edge is open to anonymous callers on loopback and routes sim-small; the managed Edge
// needs keys and routes through profiles.
func TestExamplesDeclareAccessAndRoutes(t *testing.T) {
	dev, err := Load("../../../configs/edge-dev.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !dev.AnonymousAllowed() || len(dev.API.Keys) != 0 {
		t.Errorf("dev: anonymous %v with %d keys, want anonymous and no keys", dev.AnonymousAllowed(), len(dev.API.Keys))
	}
	if r, ok := dev.RouteForModel("sim-small"); !ok || dev.Profile(r.Profile).Name != r.Profile {
		t.Errorf("dev: route for sim-small = %+v, %v", r, ok)
	}

	managed, err := Load("../../../configs/edge-managed.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if managed.AnonymousAllowed() || len(managed.API.Keys) == 0 || len(managed.Principals) == 0 {
		t.Errorf("managed: anonymous %v, %d keys, %d principals; want keys and no anonymous access",
			managed.AnonymousAllowed(), len(managed.API.Keys), len(managed.Principals))
	}
	if len(managed.Routes) == 0 || len(managed.Profiles) == 0 {
		t.Errorf("managed: %d routes, %d profiles; want both", len(managed.Routes), len(managed.Profiles))
	}
	for _, r := range managed.Routes {
		if p := managed.Profile(r.Profile); p.Name != r.Profile {
			t.Errorf("managed: route %s names profile %q, found %q", r.Name, r.Profile, p.Name)
		}
	}
}
