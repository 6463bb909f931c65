package auth

import (
	"errors"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"github.com/iop-dev/iop/internal/edge/edgeconfig"
)

const (
	aliceKey = "sk-alice-0123456789"
	bobKey   = "sk-bob-9876543210"
)

// keyedConfig is an Edge config with two keyed principals: alice may use every route, bob only
// "llama". listen.http is loopback; anonymous says whether requests without a key are allowed.
func keyedConfig(anonymous bool) *edgeconfig.Config {
	c := edgeconfig.Default()
	c.Principals = []edgeconfig.Principal{
		{Name: "alice", Routes: []string{edgeconfig.AllRoutes}},
		{Name: "bob", Routes: []string{"llama"}},
	}
	c.Routes = []edgeconfig.Route{{Name: "llama", Model: "llama3.2", Profile: edgeconfig.DefaultProfileName}}
	c.API.Keys = []edgeconfig.APIKey{
		{Principal: "alice", SHA256: HashKey(aliceKey)},
		{Principal: "bob", SHA256: strings.ToUpper(HashKey(bobKey))}, // either case is accepted
	}
	c.API.AllowAnonymous = &anonymous
	return c
}

func mustNew(t *testing.T, c *edgeconfig.Config) *Authenticator {
	t.Helper()
	a, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func TestAuthenticate(t *testing.T) {
	alice := Principal{Name: "alice", Routes: []string{"*"}}
	bob := Principal{Name: "bob", Routes: []string{"llama"}}
	anon := Principal{Name: edgeconfig.AnonymousPrincipal, Routes: []string{"*"}}
	noKeysAnonymous := edgeconfig.Default() // no keys, loopback listen.http: anonymous by default
	noKeysClosed := edgeconfig.Default()
	noKeysClosed.Listen.HTTP = "0.0.0.0:8080"

	tests := []struct {
		name    string
		cfg     *edgeconfig.Config
		headers map[string][]string
		want    Principal
		err     error
	}{
		{"bearer", keyedConfig(false), map[string][]string{"Authorization": {"Bearer " + aliceKey}}, alice, nil},
		{"bearer scheme in any case", keyedConfig(false), map[string][]string{"Authorization": {"bearer " + bobKey}}, bob, nil},
		{"x-api-key", keyedConfig(false), map[string][]string{"X-Api-Key": {bobKey}}, bob, nil},
		{"same key in both headers", keyedConfig(false), map[string][]string{"Authorization": {"Bearer " + aliceKey}, "X-Api-Key": {aliceKey}}, alice, nil},
		{"basic auth of a proxy is not a key", keyedConfig(false), map[string][]string{"Authorization": {"Basic dTpw"}, "X-Api-Key": {aliceKey}}, alice, nil},
		{"wrong key", keyedConfig(false), map[string][]string{"Authorization": {"Bearer sk-mallory"}}, Principal{}, ErrInvalidKey},
		{"wrong key with anonymous allowed", keyedConfig(true), map[string][]string{"X-Api-Key": {"sk-mallory"}}, Principal{}, ErrInvalidKey},
		{"key that is a prefix of a real one", keyedConfig(false), map[string][]string{"X-Api-Key": {aliceKey[:8]}}, Principal{}, ErrInvalidKey},
		{"the hash sent as the key", keyedConfig(false), map[string][]string{"X-Api-Key": {HashKey(aliceKey)}}, Principal{}, ErrInvalidKey},
		{"two different keys", keyedConfig(false), map[string][]string{"Authorization": {"Bearer " + aliceKey}, "X-Api-Key": {bobKey}}, Principal{}, ErrInvalidKey},
		{"oversized key", keyedConfig(false), map[string][]string{"X-Api-Key": {strings.Repeat("k", maxKeyLen+1)}}, Principal{}, ErrInvalidKey},
		{"missing key", keyedConfig(false), nil, Principal{}, ErrMissingKey},
		{"empty bearer", keyedConfig(false), map[string][]string{"Authorization": {"Bearer "}}, Principal{}, ErrMissingKey},
		{"missing key with anonymous", keyedConfig(true), nil, anon, nil},
		{"missing key, no keys, loopback", noKeysAnonymous, nil, anon, nil},
		{"any key, no keys, loopback", noKeysAnonymous, map[string][]string{"Authorization": {"Bearer sk-anything"}}, anon, nil},
		{"missing key, no keys, public", noKeysClosed, nil, Principal{}, ErrMissingKey},
		{"any key, no keys, public", noKeysClosed, map[string][]string{"X-Api-Key": {"sk-anything"}}, Principal{}, ErrInvalidKey},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := mustNew(t, tt.cfg)
			r := httptest.NewRequest("POST", "/v1/chat/completions", nil)
			for k, vs := range tt.headers {
				for _, v := range vs {
					r.Header.Add(k, v)
				}
			}
			got, err := a.Authenticate(r)
			if err == nil && got.Config != tt.cfg {
				t.Errorf("Authenticate: the principal carries config %p, want the authenticator's %p", got.Config, tt.cfg)
			}
			got.Config = nil
			if !errors.Is(err, tt.err) || !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Authenticate = %+v, %v; want %+v, %v", got, err, tt.want, tt.err)
			}
			if err != nil && strings.Contains(err.Error(), "sk-") {
				t.Errorf("error %q carries the key", err)
			}
		})
	}
}

func TestMayUse(t *testing.T) {
	tests := []struct {
		routes []string
		route  string
		want   bool
	}{
		{[]string{"*"}, "llama", true},
		{[]string{"*"}, "anything", true},
		{[]string{"llama", "qwen"}, "qwen", true},
		{[]string{"llama"}, "qwen", false},
		{[]string{"llama"}, "*", false}, // "*" as a route asked for is just a name
		{nil, "llama", false},
	}
	for _, tt := range tests {
		if got := (Principal{Name: "p", Routes: tt.routes}).MayUse(tt.route); got != tt.want {
			t.Errorf("Principal{Routes: %q}.MayUse(%q) = %v, want %v", tt.routes, tt.route, got, tt.want)
		}
	}
}

func TestNewRefusesBadKeys(t *testing.T) {
	tests := []struct {
		name   string
		change func(c *edgeconfig.Config)
		want   string
	}{
		{"nil config", nil, "nil config"},
		{"bad hex", func(c *edgeconfig.Config) { c.API.Keys[1].SHA256 = "not-hex" }, "api.keys[1].sha256: must be 64 hexadecimal digits"},
		{"unknown principal", func(c *edgeconfig.Config) { c.API.Keys[0].Principal = "carol" }, `api.keys[0].principal: unknown principal "carol"`},
		{"duplicate key", func(c *edgeconfig.Config) { c.API.Keys[1].SHA256 = c.API.Keys[0].SHA256 }, "api.keys[1].sha256: the same key is listed twice"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var c *edgeconfig.Config
			if tt.change != nil {
				c = keyedConfig(false)
				tt.change(c)
			}
			if _, err := New(c); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("New = %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

func TestAuthenticatorDoesNotShareTheConfigsRoutes(t *testing.T) {
	c := keyedConfig(false)
	a := mustNew(t, c)
	c.Principals[1].Routes[0] = "qwen"
	r := httptest.NewRequest("GET", "/v1/models", nil)
	r.Header.Set("X-Api-Key", bobKey)
	p, err := a.Authenticate(r)
	if err != nil || !p.MayUse("llama") || p.MayUse("qwen") {
		t.Errorf("after editing the config: %+v, %v; want bob with llama only", p, err)
	}
}

func TestAnonymousAllowedFollowsTheConfig(t *testing.T) {
	for _, anonymous := range []bool{true, false} {
		if got := mustNew(t, keyedConfig(anonymous)).AnonymousAllowed(); got != anonymous {
			t.Errorf("AnonymousAllowed = %v, want %v", got, anonymous)
		}
	}
}

func TestHashKey(t *testing.T) {
	// printf %s abc | sha256sum
	if got, want := HashKey("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"; got != want {
		t.Errorf("HashKey(abc) = %s, want %s", got, want)
	}
}

func BenchmarkAuthenticate(b *testing.B) {
	a, err := New(keyedConfig(false))
	if err != nil {
		b.Fatal(err)
	}
	r := httptest.NewRequest("POST", "/v1/chat/completions", nil)
	r.Header.Set("Authorization", "Bearer "+bobKey)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := a.Authenticate(r); err != nil {
			b.Fatal(err)
		}
	}
}

func TestAdminFollowsTheConfigAndAnonymousNeverIs(t *testing.T) {
	c := keyedConfig(true)
	c.Principals[0].Admin = true // alice
	a := mustNew(t, c)
	c.Principals[1].Admin = true // after New: changes nothing
	tests := []struct {
		name   string
		header string
		who    string
		admin  bool
	}{
		{"admin principal", aliceKey, "alice", true},
		{"principal without admin", bobKey, "bob", false},
		{"anonymous", "", edgeconfig.AnonymousPrincipal, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest("POST", "/admin/v1/credentials/upstream/revoke", nil)
			if tt.header != "" {
				r.Header.Set("Authorization", "Bearer "+tt.header)
			}
			p, err := a.Authenticate(r)
			if err != nil || p.Name != tt.who || p.Admin != tt.admin {
				t.Errorf("Authenticate = %+v, %v; want %s with admin %v", p, err, tt.who, tt.admin)
			}
		})
	}
	// With no keys at all, any key acts as anonymous, which is not an admin either.
	r := httptest.NewRequest("POST", "/admin/v1/credentials/upstream/revoke", nil)
	r.Header.Set("Authorization", "Bearer sk-anything")
	if p, err := mustNew(t, edgeconfig.Default()).Authenticate(r); err != nil || p.Admin {
		t.Errorf("keyless Edge: %+v, %v; want a non-admin anonymous", p, err)
	}
}
