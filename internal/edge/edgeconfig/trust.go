package edgeconfig

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/iop-dev/iop/internal/yamlconf"
)

// TLS is api.tls: the certificate and key the client listener (listen.http) serves HTTPS with.
// Both set: the listener speaks TLS only (HTTP/1.1 and HTTP/2, by ALPN), and a plain HTTP
// request to it is answered 400 "Client sent an HTTP request to an HTTPS server". Both empty
// (the default): plain HTTP. The files are PEM (the certificate file may hold the chain after
// the leaf) and are read again when they change on disk, so a renewed certificate is served
// without a restart (see frontdoor.CertFiles). Load resolves relative paths against the
// configuration file's directory.
type TLS struct {
	CertFile string `yaml:"cert_file,omitempty"`
	KeyFile  string `yaml:"key_file,omitempty"`
}

// Enabled reports whether the client listener serves TLS.
func (t TLS) Enabled() bool { return t.CertFile != "" }

// TrustedNetwork is one entry of api.trusted_networks: the clients whose address is inside
// CIDR may call the client APIs without a key, and act as Principal (an entry of
// `principals`, with its routes). A key, when a request carries one, still decides who the
// request is: a wrong key is refused, not served as the network's principal.
type TrustedNetwork struct {
	// CIDR is the network, as an address and prefix length in canonical form
	// ("192.168.1.0/24", "fd7a:115c:a1e0::/48", "127.0.0.2/32"); see CheckTrustedCIDR for
	// which are refused.
	CIDR string `yaml:"cidr"`
	// Principal names an entry of `principals`; it may not be an admin.
	Principal string `yaml:"principal"`
}

// Prefix returns the parsed CIDR; it is valid when Validate accepted the configuration.
func (n TrustedNetwork) Prefix() netip.Prefix {
	p, _ := netip.ParsePrefix(n.CIDR)
	return p
}

// The narrowest a trusted network containing public addresses may be: one site's block.
const (
	MinPublicPrefix4 = 24
	MinPublicPrefix6 = 48
)

// nonPublic are the address blocks that are not on the public internet: private (RFC 1918,
// RFC 4193), shared carrier-grade NAT space (RFC 6598, where Tailscale addresses live), loopback
// and link-local. A trusted network inside one of them may be as wide as the block.
var nonPublic = []netip.Prefix{
	netip.MustParsePrefix("10.0.0.0/8"),
	netip.MustParsePrefix("172.16.0.0/12"),
	netip.MustParsePrefix("192.168.0.0/16"),
	netip.MustParsePrefix("100.64.0.0/10"),
	netip.MustParsePrefix("127.0.0.0/8"),
	netip.MustParsePrefix("169.254.0.0/16"),
	netip.MustParsePrefix("fc00::/7"),
	netip.MustParsePrefix("fe80::/10"),
	netip.MustParsePrefix("::1/128"),
}

// ipv4Embedding is a range of IPv6 addresses that carry an IPv4 address: a client behind a
// NAT64 or SIIT translator, or on a 6to4 or Teredo tunnel, reaches the Edge from one of them.
// A trusted network inside such a range trusts the IPv4 addresses it embeds, and one that
// contains the whole range trusts every IPv4 address there is.
type ipv4Embedding struct {
	prefix netip.Prefix
	name   string
	offset int // the bit where the IPv4 address starts (a multiple of 8)
	// inverted: the address is stored with its bits flipped (Teredo's client address).
	inverted bool
}

// ipv4Embeddings are the well-known ranges of ipv4Embedding.
var ipv4Embeddings = []ipv4Embedding{
	{prefix: netip.MustParsePrefix("64:ff9b::/96"), name: "NAT64", offset: 96}, // RFC 6052
	// RFC 8215 lets the operator put the IPv4 address where RFC 6052's /32 to /96 formats
	// say. Reading it from the last 32 bits (the /96 format) is the strictest reading: a
	// prefix that fixes 24 of those bits fixes at least 24 IPv4 bits in every other format.
	{prefix: netip.MustParsePrefix("64:ff9b:1::/48"), name: "local-use NAT64", offset: 96},
	{prefix: netip.MustParsePrefix("2002::/16"), name: "6to4", offset: 16}, // RFC 3056
	// RFC 4380: the client's public address, flipped, in the last 32 bits. The Teredo server's
	// address (bits 32-63) says nothing about who connects, so it does not narrow the clients.
	{prefix: netip.MustParsePrefix("2001::/32"), name: "Teredo", offset: 96, inverted: true},
	{prefix: netip.MustParsePrefix("::/96"), name: "IPv4-compatible", offset: 96}, // RFC 4291, deprecated
	{prefix: netip.MustParsePrefix("::ffff:0:0/96"), name: "IPv4-mapped", offset: 96},
}

// embedded returns the IPv4 addresses a prefix inside e holds: its IPv4 bits, as long as it
// fixes them.
func (e ipv4Embedding) embedded(p netip.Prefix) netip.Prefix {
	a := p.Addr().As16()
	var v4 [4]byte
	copy(v4[:], a[e.offset/8:])
	if e.inverted {
		for i := range v4 {
			v4[i] = ^v4[i]
		}
	}
	bits := min(max(p.Bits()-e.offset, 0), 32)
	return netip.PrefixFrom(netip.AddrFrom4(v4), bits).Masked()
}

// CheckTrustedCIDR parses a trusted network's CIDR and refuses one that would trust the public
// internet or a large part of it. The rule: a network inside private, shared (CGNAT), loopback
// or link-local space (10/8, 172.16/12, 192.168/16, 100.64/10, 127/8, 169.254/16, fc00::/7,
// fe80::/10, ::1) is accepted at any length; any other network must be at most one site's
// block: /24 or longer for IPv4, /48 or longer for IPv6. So 0.0.0.0/0, ::/0 and every short
// prefix are refused. An IPv4-mapped IPv6 prefix (::ffff:a.b.c.d/n) is refused too: write the
// IPv4 form (auth matches a client's IPv4-mapped address as the IPv4 address it carries). The
// CIDR must be in canonical form (no host bits set), so that what the file says is what is
// trusted.
//
// IPv6 ranges whose addresses carry an IPv4 address (NAT64 64:ff9b::/96 and 64:ff9b:1::/48,
// 6to4 2002::/16, Teredo 2001::/32, IPv4-compatible ::/96) are held to the IPv4 rule as well: a
// prefix inside one must embed no more IPv4 addresses than a trusted IPv4 network may hold
// (64:ff9b::/96 is every IPv4 address; 64:ff9b::cb00:7100/120 is 203.0.113.0/24, accepted), and
// a prefix that contains one of these ranges whole (64:ff9b::/64, ::/80) is refused.
func CheckTrustedCIDR(s string) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(strings.TrimSpace(s))
	switch {
	case s == "":
		return netip.Prefix{}, fmt.Errorf("required: a network such as 192.168.1.0/24")
	case err != nil:
		return netip.Prefix{}, fmt.Errorf("must be a network as address/length, such as 192.168.1.0/24, got %q", s)
	case p.Addr().Is4In6():
		return netip.Prefix{}, fmt.Errorf("is an IPv4-mapped IPv6 network; write it as IPv4 (a client's IPv4-mapped address is matched as the IPv4 address it carries), got %q", s)
	case p != p.Masked() || p.String() != s:
		return netip.Prefix{}, fmt.Errorf("must be in canonical form %q, got %q", p.Masked(), s)
	}
	for _, e := range ipv4Embeddings {
		if p.Bits() < e.prefix.Bits() || !e.prefix.Contains(p.Addr()) {
			continue
		}
		if v4 := e.embedded(p); tooWide(v4) {
			return netip.Prefix{}, fmt.Errorf("%s is inside %s %s, whose addresses carry an IPv4 address, and it holds the IPv4 addresses %s: "+
				"wider than /%d, the most a public IPv4 network may be trusted (a private, CGNAT, loopback or link-local one may be wider); "+
				"write the IPv4 network you mean instead (such as 192.168.1.0/24), or an IPv6 prefix that embeds no more than that",
				s, e.name, e.prefix, v4, MinPublicPrefix4)
		}
	}
	if tooWide(p) {
		minBits := MinPublicPrefix6
		if p.Addr().Is4() {
			minBits = MinPublicPrefix4
		}
		return netip.Prefix{}, fmt.Errorf("%s contains public addresses and is wider than /%d: trusting it lets a large part of the internet in without a key (a private, CGNAT, loopback or link-local network may be wider)", s, minBits)
	}
	for _, e := range ipv4Embeddings {
		if p.Bits() < e.prefix.Bits() && p.Contains(e.prefix.Addr()) {
			return netip.Prefix{}, fmt.Errorf("%s contains %s (%s), whose addresses carry every IPv4 address: trusting it lets the IPv4 internet in without a key; "+
				"write the IPv4 network you mean instead, or an IPv6 network that leaves %s out", s, e.prefix, e.name, e.prefix)
		}
	}
	return p, nil
}

// tooWide reports whether p holds public addresses and is wider than one site's block
// (MinPublicPrefix4, MinPublicPrefix6). A network inside a nonPublic block may be as wide as
// the block.
func tooWide(p netip.Prefix) bool {
	for _, np := range nonPublic {
		if np.Bits() <= p.Bits() && np.Contains(p.Addr()) {
			return false
		}
	}
	if p.Addr().Is4() {
		return p.Bits() < MinPublicPrefix4
	}
	return p.Bits() < MinPublicPrefix6
}

// validateTrusted checks api.tls and api.trusted_networks; principals maps the valid principal
// names to their entries' paths.
func (c *Config) validateTrusted(principals map[string]string) yamlconf.Errors {
	var es yamlconf.Errors
	if t := c.API.TLS; (t.CertFile == "") != (t.KeyFile == "") {
		if t.CertFile == "" {
			es.Add("api.tls.cert_file", "required with api.tls.key_file")
		} else {
			es.Add("api.tls.key_file", "required with api.tls.cert_file")
		}
	}
	for _, f := range []struct{ path, value string }{{"api.tls.cert_file", c.API.TLS.CertFile}, {"api.tls.key_file", c.API.TLS.KeyFile}} {
		if strings.ContainsRune(f.value, 0) {
			es.Add(f.path, "must be a file path, and a path cannot contain a NUL byte")
		}
	}
	admins := make(map[string]bool, len(c.Principals))
	for _, p := range c.Principals {
		admins[p.Name] = p.Admin
	}
	seen := make(map[netip.Prefix]string, len(c.API.TrustedNetworks))
	for i, n := range c.API.TrustedNetworks {
		path := fmt.Sprintf("api.trusted_networks[%d]", i)
		if p, err := CheckTrustedCIDR(n.CIDR); err != nil {
			es.Add(path+".cidr", "%s", err)
		} else if first, dup := seen[p]; dup {
			es.Add(path+".cidr", "the same network as %s", first)
		} else {
			seen[p] = path
		}
		switch _, ok := principals[n.Principal]; {
		case yamlconf.CheckID(path+".principal", n.Principal) != nil:
			es.Append(yamlconf.CheckID(path+".principal", n.Principal))
		case !ok:
			es.Add(path+".principal", "unknown principal %q; add it under principals", n.Principal)
		case admins[n.Principal]:
			es.Add(path+".principal", "principal %q is an admin; a network address is not enough to change the Edge's state, so name a principal without admin: true", n.Principal)
		}
	}
	return es
}

// resolveTLSPaths makes relative api.tls paths relative to dir instead.
func (c *Config) resolveTLSPaths(dir string) {
	c.API.TLS.CertFile = yamlconf.ResolvePath(dir, c.API.TLS.CertFile)
	c.API.TLS.KeyFile = yamlconf.ResolvePath(dir, c.API.TLS.KeyFile)
}
