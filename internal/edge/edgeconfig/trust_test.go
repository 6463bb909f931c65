package edgeconfig

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// trustFile is accessFile with a LAN trusted as the principal "lan" and TLS on the listener.
var trustFile = strings.Replace(strings.Replace(accessFile, "  allow_anonymous: true\n",
	"  trusted_networks:\n    - {cidr: 192.168.1.0/24, principal: lan}\n    - cidr: 127.0.0.2/32\n      principal: lan\n  tls: {cert_file: edge.crt, key_file: edge.key}\n", 1),
	"    routes: [llama]\n", "    routes: [llama]\n  - {name: lan, routes: [llama]}\n", 1)

func TestParseReadsTrustedNetworksAndTLS(t *testing.T) {
	c := mustParse(t, trustFile)
	want := []TrustedNetwork{{CIDR: "192.168.1.0/24", Principal: "lan"}, {CIDR: "127.0.0.2/32", Principal: "lan"}}
	if len(c.API.TrustedNetworks) != 2 || c.API.TrustedNetworks[0] != want[0] || c.API.TrustedNetworks[1] != want[1] {
		t.Errorf("trusted_networks = %+v, want %+v", c.API.TrustedNetworks, want)
	}
	if c.API.TLS != (TLS{CertFile: "edge.crt", KeyFile: "edge.key"}) || !c.API.TLS.Enabled() {
		t.Errorf("tls = %+v", c.API.TLS)
	}
	if c.API.TrustedNetworks[0].Prefix().Bits() != 24 {
		t.Errorf("Prefix = %v", c.API.TrustedNetworks[0].Prefix())
	}
	if Default().API.TLS.Enabled() || len(Default().API.TrustedNetworks) != 0 {
		t.Error("TLS or trusted networks on by default")
	}
}

// Issue 16: a trusted network may not cover the internet. Private, CGNAT, loopback and
// link-local space may be trusted at any width inside it; anything else only as narrow as one
// site (/24, /48).
func TestCheckTrustedCIDR(t *testing.T) {
	tests := []struct {
		cidr   string
		reason string // "" when accepted
	}{
		{"192.168.1.0/24", ""},
		{"192.168.0.0/16", ""},
		{"10.0.0.0/8", ""},
		{"172.16.0.0/12", ""},
		{"100.64.0.0/10", ""}, // CGNAT: Tailscale's addresses
		{"127.0.0.2/32", ""},
		{"169.254.0.0/16", ""},
		{"fd00::/8", ""},
		{"fc00::/7", ""},
		{"fe80::/10", ""},
		{"::1/128", ""},
		{"203.0.113.0/24", ""},  // public, one site
		{"203.0.113.7/32", ""},  // public, one host
		{"2001:db8:1::/48", ""}, // public IPv6, one site
		{"0.0.0.0/0", "wider than /24"},
		{"::/0", "wider than /48"},
		{"0.0.0.0/1", "wider than /24"},
		{"128.0.0.0/1", "wider than /24"},
		{"8.0.0.0/7", "wider than /24"},
		{"203.0.112.0/23", "wider than /24"},
		{"2001:db8::/32", "wider than /48"},
		{"10.0.0.0/7", "wider than /24"},     // wider than the private block: has public space
		{"192.168.0.0/15", "wider than /24"}, // the same
		{"fc00::/6", "wider than /48"},
		{"::ffff:0.0.0.0/96", "IPv4-mapped"},
		{"::ffff:192.168.1.0/120", "IPv4-mapped"},
		{"192.168.1.1/24", "canonical form \"192.168.1.0/24\""},
		{"192.168.1.0", "address/length"},
		{"192.168.1.0/33", "address/length"},
		{"lan", "address/length"},
		{"", "required"},
		{"FD00::/8", "canonical form"},
	}
	for _, tt := range tests {
		_, err := CheckTrustedCIDR(tt.cidr)
		switch {
		case tt.reason == "" && err != nil:
			t.Errorf("%q refused: %v", tt.cidr, err)
		case tt.reason != "" && (err == nil || !strings.Contains(err.Error(), tt.reason)):
			t.Errorf("%q: %v; want refused with %q", tt.cidr, err, tt.reason)
		}
	}
}

// Issue 24, gap 9: an IPv6 prefix whose addresses carry IPv4 addresses (NAT64, 6to4, Teredo,
// IPv4-compatible) trusts the IPv4 addresses it embeds, so it may be no wider, in IPv4 terms,
// than the IPv4 rule allows: 64:ff9b::/96 is the whole IPv4 internet. A prefix that contains
// such a range is refused too. ::ffff: (IPv4-mapped) prefixes are written as IPv4 (auth unmaps
// mapped peers before matching).
func TestCheckTrustedCIDRRefusesIPv6ThatEmbedsWideIPv4(t *testing.T) {
	tests := []struct {
		cidr   string
		reason string // "" when accepted
	}{
		{"64:ff9b::/96", "NAT64 64:ff9b::/96"},
		{"64:ff9b::/97", "0.0.0.0/1"},
		{"64:ff9b::cb00:0/112", "203.0.0.0/16"},
		{"64:ff9b::/64", "contains 64:ff9b::/96 (NAT64"},
		{"64:ff9b::/48", "contains 64:ff9b::/96 (NAT64"},
		{"64:ff9b:1::/48", "local-use NAT64 64:ff9b:1::/48"},
		{"64:ff9b:1::/64", "local-use NAT64 64:ff9b:1::/48"},
		{"64:ff9b:1:ffff::/96", "0.0.0.0/0"},
		{"2002::/16", "6to4 2002::/16"},
		{"2002:cb00::/24", "6to4 2002::/16"},
		{"2002:cb00::/32", "203.0.0.0/16"},
		{"2002:cb00:7100::/40", "wider than /48"}, // embeds 203.0.113.0/24, but is wider than one IPv6 site
		{"2001::/32", "Teredo 2001::/32"},
		{"2001:0:cb00:7101::/64", "Teredo 2001::/32"}, // one Teredo server: every client behind it
		{"::/96", "IPv4-compatible ::/96"},
		{"::/64", "contains ::/96 (IPv4-compatible"},
		{"::/80", "contains ::/96 (IPv4-compatible"},
		{"::ffff:0.0.0.0/96", "write it as IPv4"},
		{"::fffe:0:0/95", "contains ::ffff:0.0.0.0/96 (IPv4-mapped"},
		// Narrow enough: what each embeds is one public /24 or less, or a private network.
		{"64:ff9b::cb00:7100/120", ""}, // 203.0.113.0/24
		{"64:ff9b::cb00:7107/128", ""}, // 203.0.113.7
		{"64:ff9b::a00:0/104", ""},     // 10.0.0.0/8: private
		{"64:ff9b:1::c0a8:100/120", ""},
		{"2002:cb00:7107::/48", ""},             // 203.0.113.7's 6to4 site
		{"2001:0:cb00:7101::34ff:8ef8/128", ""}, // one Teredo client
		{"::1/128", ""},                         // loopback stays trusted
		{"2001:db8:1::/48", ""},                 // documentation space: embeds nothing
		{"64:ff9a::/48", ""},                    // the /48 before NAT64's: embeds nothing
	}
	for _, tt := range tests {
		_, err := CheckTrustedCIDR(tt.cidr)
		switch {
		case tt.reason == "" && err != nil:
			t.Errorf("%q refused: %v", tt.cidr, err)
		case tt.reason != "" && (err == nil || !strings.Contains(err.Error(), tt.reason)):
			t.Errorf("%q: %v; want refused with %q", tt.cidr, err, tt.reason)
		}
	}
}

// The refusal of a NAT64 prefix says what it embeds and what to write instead.
func TestNAT64RefusalSaysToWriteTheIPv4Network(t *testing.T) {
	_, err := CheckTrustedCIDR("64:ff9b::/96")
	if err == nil {
		t.Fatal("64:ff9b::/96 accepted: it trusts every IPv4 address")
	}
	for _, want := range []string{"0.0.0.0/0", "write the IPv4 network", "/24"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}

func TestValidateTrustedNetworksAndTLS(t *testing.T) {
	base := func() *Config {
		c := accessConfig()
		c.Principals = append(c.Principals, Principal{Name: "lan", Routes: []string{"llama"}})
		c.API.TrustedNetworks = []TrustedNetwork{{CIDR: "192.168.1.0/24", Principal: "lan"}}
		return c
	}
	if err := base().Validate(); err != nil {
		t.Fatalf("base: %v", err)
	}
	tests := []struct {
		name   string
		edit   func(c *Config)
		path   string
		reason string
	}{
		{"the whole internet", func(c *Config) { c.API.TrustedNetworks[0].CIDR = "0.0.0.0/0" }, "api.trusted_networks[0].cidr", "public addresses"},
		{"all of IPv6", func(c *Config) { c.API.TrustedNetworks[0].CIDR = "::/0" }, "api.trusted_networks[0].cidr", "public addresses"},
		{"the same network twice", func(c *Config) {
			c.API.TrustedNetworks = append(c.API.TrustedNetworks, TrustedNetwork{CIDR: "192.168.1.0/24", Principal: "bob"})
		}, "api.trusted_networks[1].cidr", "the same network as api.trusted_networks[0]"},
		{"unknown principal", func(c *Config) { c.API.TrustedNetworks[0].Principal = "guest" }, "api.trusted_networks[0].principal", `unknown principal "guest"`},
		{"no principal", func(c *Config) { c.API.TrustedNetworks[0].Principal = "" }, "api.trusted_networks[0].principal", "required"},
		{"admin principal", func(c *Config) { c.Principals[2].Admin = true }, "api.trusted_networks[0].principal", "is an admin"},
		{"the anonymous principal", func(c *Config) { c.API.TrustedNetworks[0].Principal = AnonymousPrincipal }, "api.trusted_networks[0].principal", "unknown principal"},
		{"cert without key", func(c *Config) { c.API.TLS.CertFile = "edge.crt" }, "api.tls.key_file", "required with api.tls.cert_file"},
		{"key without cert", func(c *Config) { c.API.TLS.KeyFile = "edge.key" }, "api.tls.cert_file", "required with api.tls.key_file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := base()
			tt.edit(c)
			wantOneProblem(t, c.Validate(), tt.path, tt.reason)
		})
	}
}

func TestParseReportsTrustProblemsWithLines(t *testing.T) {
	_, err := Parse([]byte(strings.Replace(trustFile, "{cidr: 192.168.1.0/24, principal: lan}", "{cidr: 0.0.0.0/0, principal: lan}", 1)))
	if err == nil || !strings.Contains(err.Error(), "api.trusted_networks[0].cidr (line 10)") {
		t.Errorf("Parse = %v; want the problem at api.trusted_networks[0].cidr (line 10)", err)
	}
}

func TestLoadResolvesTLSFilesAgainstTheFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "edge.yaml")
	if err := os.WriteFile(path, []byte(trustFile), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if c.API.TLS.CertFile != filepath.Join(dir, "edge.crt") || c.API.TLS.KeyFile != filepath.Join(dir, "edge.key") {
		t.Errorf("tls = %+v; want both under %s", c.API.TLS, dir)
	}
}
