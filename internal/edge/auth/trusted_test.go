package auth

import (
	"errors"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/iop-dev/iop/internal/edge/edgeconfig"
)

// trustedConfig is keyedConfig without anonymous access, with the LAN 192.168.1.0/24 and the
// one loopback address 127.0.0.2 trusted as the principal "lan", which may use "llama" only.
func trustedConfig() *edgeconfig.Config {
	c := keyedConfig(false)
	c.Principals = append(c.Principals, edgeconfig.Principal{Name: "lan", Routes: []string{"llama"}})
	c.API.TrustedNetworks = []edgeconfig.TrustedNetwork{
		{CIDR: "192.168.1.0/24", Principal: "lan"},
		{CIDR: "127.0.0.2/32", Principal: "lan"},
		{CIDR: "fd00:1::/64", Principal: "lan"},
	}
	return c
}

// Issue 16: a client from a trusted network without a key is served as the network's
// principal; from elsewhere it is refused; a key, when given, still decides.
func TestTrustedNetworkServesItsPrincipalWithoutAKey(t *testing.T) {
	a := mustNew(t, trustedConfig())
	tests := []struct {
		name   string
		remote string
		key    string
		who    string
		err    error
	}{
		{"LAN without a key", "192.168.1.23:50000", "", "lan", nil},
		{"trusted loopback address", "127.0.0.2:41000", "", "lan", nil},
		{"IPv6 ULA in the network", "[fd00:1::5]:443", "", "lan", nil},
		{"IPv4-mapped address of the LAN", "[::ffff:192.168.1.9]:50000", "", "lan", nil},
		{"another loopback address", "127.0.0.3:41000", "", "", ErrMissingKey},
		{"the next network", "192.168.2.1:50000", "", "", ErrMissingKey},
		{"the internet", "203.0.113.7:50000", "", "", ErrMissingKey},
		{"LAN with a valid key: the key wins", "192.168.1.23:50000", aliceKey, "alice", nil},
		{"LAN with a wrong key: refused, not the LAN's principal", "192.168.1.23:50000", "sk-mallory", "", ErrInvalidKey},
		{"unparsable peer address", "somewhere", "", "", ErrMissingKey},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest("GET", "/v1/models", nil)
			r.RemoteAddr = tt.remote
			if tt.key != "" {
				r.Header.Set("Authorization", "Bearer "+tt.key)
			}
			p, err := a.Authenticate(r)
			if !errors.Is(err, tt.err) || p.Name != tt.who {
				t.Fatalf("Authenticate from %s = %q, %v; want %q, %v", tt.remote, p.Name, err, tt.who, tt.err)
			}
			if tt.who == "lan" && (p.Admin || !p.MayUse("llama") || p.MayUse("other")) {
				t.Errorf("the network's principal is %+v; want lan's routes and no admin", p)
			}
		})
	}
}

// An Edge with trusted networks and no keys at all: a key cannot match anything, so a LAN
// client's placeholder key (OpenAI SDKs always send one) is no key; elsewhere it is refused.
func TestTrustedNetworkWithoutKeysIgnoresAPlaceholderKey(t *testing.T) {
	c := trustedConfig()
	c.API.Keys = nil
	c.Listen.HTTP = "0.0.0.0:8080" // anonymous access off by default
	a := mustNew(t, c)
	for _, tt := range []struct {
		remote, key, who string
		err              error
	}{
		{"192.168.1.23:50000", "sk-placeholder", "lan", nil},
		{"192.168.1.23:50000", "", "lan", nil},
		{"203.0.113.7:50000", "sk-placeholder", "", ErrInvalidKey},
		{"203.0.113.7:50000", "", "", ErrMissingKey},
	} {
		r := httptest.NewRequest("GET", "/v1/models", nil)
		r.RemoteAddr = tt.remote
		if tt.key != "" {
			r.Header.Set("Authorization", "Bearer "+tt.key)
		}
		if p, err := a.Authenticate(r); !errors.Is(err, tt.err) || p.Name != tt.who {
			t.Errorf("from %s with key %q: %q, %v; want %q, %v", tt.remote, tt.key, p.Name, err, tt.who, tt.err)
		}
	}
}

func TestNewRefusesATrustedNetworkEdgeconfigRefuses(t *testing.T) {
	for name, edit := range map[string]func(c *edgeconfig.Config){
		"the whole internet": func(c *edgeconfig.Config) { c.API.TrustedNetworks[0].CIDR = "0.0.0.0/0" },
		"unknown principal":  func(c *edgeconfig.Config) { c.API.TrustedNetworks[0].Principal = "nobody" },
		"admin principal":    func(c *edgeconfig.Config) { c.Principals[2].Admin = true },
	} {
		t.Run(name, func(t *testing.T) {
			c := trustedConfig()
			edit(c)
			if _, err := New(c); err == nil || !strings.Contains(err.Error(), "trusted_networks[0]") {
				t.Errorf("New = %v; want an error naming api.trusted_networks[0]", err)
			}
		})
	}
}

// A reload: Replace swaps the whole snapshot at once, a refused one changes nothing, and a
// principal authenticated before keeps the configuration it was authenticated under.
func TestReplaceSwapsTheSnapshotAndRefusesABadOne(t *testing.T) {
	before := keyedConfig(false)
	a := mustNew(t, before)
	req := func(key string) (Principal, error) {
		r := httptest.NewRequest("GET", "/v1/models", nil)
		r.Header.Set("X-Api-Key", key)
		return a.Authenticate(r)
	}
	old, err := req(bobKey)
	if err != nil {
		t.Fatal(err)
	}
	const carolKey = "sk-carol-5555"
	after := keyedConfig(false)
	after.Principals = append(after.Principals, edgeconfig.Principal{Name: "carol", Routes: []string{"llama"}})
	after.API.Keys = append(after.API.Keys, edgeconfig.APIKey{Principal: "carol", SHA256: HashKey(carolKey)})
	if _, err := req(carolKey); !errors.Is(err, ErrInvalidKey) {
		t.Fatalf("carol before the reload: %v, want ErrInvalidKey", err)
	}
	if err := a.Replace(after); err != nil {
		t.Fatal(err)
	}
	if p, err := req(carolKey); err != nil || p.Name != "carol" || p.Config != after {
		t.Errorf("carol after the reload = %+v, %v", p, err)
	}
	if old.Config != before {
		t.Errorf("a principal authenticated before the reload changed its config")
	}

	bad := keyedConfig(false)
	bad.API.Keys[0].Principal = "nobody"
	if err := a.Replace(bad); err == nil {
		t.Fatal("Replace accepted a key of an unknown principal")
	}
	if a.Config() != after {
		t.Error("a refused Replace changed the configuration")
	}
	if p, err := req(carolKey); err != nil || p.Name != "carol" {
		t.Errorf("carol after a refused reload = %+v, %v", p, err)
	}
}

// Issue 24, gap 9: a trusted IPv6 network that embeds the whole IPv4 internet (NAT64's
// 64:ff9b::/96, through which every IPv4 client of a SIIT or NAT64 translator arrives) never
// lets a request in: New refuses it. A narrow one matches only the addresses it embeds.
func TestNAT64PrefixNeverTrustsTheIPv4Internet(t *testing.T) {
	c := trustedConfig()
	c.API.TrustedNetworks = []edgeconfig.TrustedNetwork{{CIDR: "64:ff9b::/96", Principal: "lan"}}
	if a, err := New(c); err == nil {
		r := httptest.NewRequest("GET", "/v1/models", nil)
		r.RemoteAddr = "[64:ff9b::808:808]:443" // 8.8.8.8, translated
		p, err := a.Authenticate(r)
		t.Fatalf("New accepted 64:ff9b::/96; 8.8.8.8 through NAT64 is %q, %v", p.Name, err)
	} else if !strings.Contains(err.Error(), "trusted_networks[0]") || !strings.Contains(err.Error(), "NAT64") {
		t.Errorf("New = %v; want the NAT64 prefix of api.trusted_networks[0] refused", err)
	}

	c.API.TrustedNetworks[0].CIDR = "64:ff9b::c0a8:100/120" // 192.168.1.0/24, translated
	a := mustNew(t, c)
	for remote, want := range map[string]error{
		"[64:ff9b::c0a8:105]:443": nil,
		"[64:ff9b::808:808]:443":  ErrMissingKey,
		"[64:ff9b::c0a8:205]:443": ErrMissingKey,
		"192.168.1.5:443":         ErrMissingKey, // the IPv4 network itself is not what was trusted
	} {
		r := httptest.NewRequest("GET", "/v1/models", nil)
		r.RemoteAddr = remote
		if p, err := a.Authenticate(r); !errors.Is(err, want) || (want == nil && p.Name != "lan") {
			t.Errorf("from %s: %q, %v; want %v", remote, p.Name, err, want)
		}
	}
}
