package edgeconfig

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"strings"

	"github.com/iop-dev/iop/internal/yamlconf"
)

// AnonymousPrincipal is the principal a request without a key acts as when anonymous access is
// allowed (see Config.AnonymousAllowed). It may use every route. The name is reserved: no entry
// of `principals` may take it.
const AnonymousPrincipal = "anonymous"

// AllRoutes, in a principal's routes, grants every route, including routes added later.
const AllRoutes = "*"

// API is the `api` section: who may call the client APIs (OpenAI /v1/..., Ollama /api/...).
type API struct {
	// Keys are the client API keys, each mapped to a principal. Only their SHA-256 is stored, so
	// the file (and anything that prints it) never holds a usable key.
	Keys []APIKey `yaml:"keys,omitempty"`
	// AllowAnonymous lets requests without a key through as AnonymousPrincipal, with every route.
	// It is only valid when listen.http is a loopback address: the single-machine setup, where
	// the only callers are on this host. Unset (nil) means true when there are no keys and
	// listen.http is loopback, false otherwise; Config.AnonymousAllowed gives the effective value.
	//
	// A reverse proxy on this host that forwards to a loopback listen.http makes the API public:
	// configure keys then, or set allow_anonymous: false.
	AllowAnonymous *bool `yaml:"allow_anonymous,omitempty"`
	// AdminReads is who may read the Edge's operational state: GET /admin/v1/nodes, queues and
	// credentials, and /metrics, which together show the fleet (Node ids and identities,
	// addresses, labels, versions, providers, credential names). AdminReadsAdmins: only
	// principals with admin: true, by key. AdminReadsOpen: anyone who reaches listen.http.
	// Empty (the default): open exactly when anonymous access is allowed (the single-machine
	// setup: loopback, no keys), admins otherwise. /healthz and /readyz are always open.
	AdminReads string `yaml:"admin_reads,omitempty"`
	// TrustedNetworks let clients from these networks (a home LAN) call without a key, each
	// network as a named principal with that principal's routes (see trust.go). Empty by
	// default. A request with a key is decided by its key.
	TrustedNetworks []TrustedNetwork `yaml:"trusted_networks,omitempty"`
	// AllowedHosts are the names, besides IP addresses, localhost and names under .localhost,
	// that a request let in without a key (from a trusted network, as anonymous, or to the
	// admin reads and /metrics when they are open) may carry in its Host header. A web page
	// that points its own DNS name at this Edge's address (DNS rebinding) sends that name as
	// Host, so refusing names nobody listed keeps the page from using the Edge and reading its
	// answers. List the names clients use to reach the Edge without a key (edge.lan,
	// gpu-box.local): exact DNS names, any case, without a port or wildcards. Empty by
	// default. Requests with a valid key are not checked.
	AllowedHosts []string `yaml:"allowed_hosts,omitempty"`
	// AllowedOrigins are the web origins (scheme://host[:port], as a browser sends them in the
	// Origin header) whose pages may call this Edge from a browser: only they get CORS answers,
	// and only their cross-site requests are served without a key. Empty by default: no page
	// of another site can use the Edge without a key, and none can read its answers. "*" is
	// refused.
	AllowedOrigins []string `yaml:"allowed_origins,omitempty"`
	// TLS makes the client listener serve HTTPS (see trust.go).
	TLS TLS `yaml:"tls,omitempty"`
}

// Values of api.admin_reads.
const (
	AdminReadsAdmins = "admins"
	AdminReadsOpen   = "open"
)

// AdminReadsOpen reports whether the admin read endpoints and /metrics answer anyone:
// api.admin_reads when the file sets it, otherwise AnonymousAllowed.
func (c *Config) AdminReadsOpen() bool {
	switch c.API.AdminReads {
	case AdminReadsOpen:
		return true
	case AdminReadsAdmins:
		return false
	}
	return c.AnonymousAllowed()
}

// APIKey is one entry of api.keys: the SHA-256 of a client API key and the principal it
// authenticates as. Clients send the key itself as "Authorization: Bearer KEY" or "x-api-key: KEY".
type APIKey struct {
	Principal string `yaml:"principal"` // an entry of `principals`; required
	// SHA256 is the hex SHA-256 of the key (64 hex digits, either case), as auth.HashKey or
	// `printf %s "$KEY" | sha256sum` writes it; required.
	SHA256 string `yaml:"sha256"`
}

// Digest returns the SHA-256 that k.SHA256 spells, and false when it is not 64 hex digits.
func (k APIKey) Digest() ([sha256.Size]byte, bool) {
	var d [sha256.Size]byte
	if len(k.SHA256) != hex.EncodedLen(sha256.Size) {
		return d, false
	}
	if _, err := hex.Decode(d[:], []byte(k.SHA256)); err != nil {
		return d, false
	}
	return d, true
}

// Principal is one entry of `principals`: a caller of the client APIs, the routes it may use,
// and whether it may change the Edge's state through the admin API.
type Principal struct {
	Name string `yaml:"name"` // unique; id rules (see yamlconf.CheckID); not AnonymousPrincipal
	// Routes are the names of the routes this principal may use, or AllRoutes ("*") for all of
	// them; at least one.
	Routes []string `yaml:"routes,omitempty"`
	// Admin lets this principal call the admin endpoints that change state: revoking,
	// reloading, disabling and enabling credentials and profiles. Default false. The anonymous
	// principal is never an admin.
	Admin bool `yaml:"admin,omitempty"`
	// OllamaKeys are the public keys, as authorized_keys lines ("ssh-ed25519 AAAA... user@host",
	// what `cat ~/.ollama/id_ed25519.pub` prints), whose signatures identify this principal: the
	// ollama CLI and Ollama's Go client sign every request with ~/.ollama/id_ed25519 when
	// OLLAMA_AUTH=1, and send no API key (see ParseOllamaKey and package auth). Ed25519 keys
	// only; no key in two places.
	OllamaKeys []string `yaml:"ollama_keys,omitempty"`
}

// AnonymousAllowed reports whether requests without a key are let through as AnonymousPrincipal:
// api.allow_anonymous when the file sets it, otherwise true exactly when there are no keys and
// listen.http is a loopback address.
func (c *Config) AnonymousAllowed() bool {
	if c.API.AllowAnonymous != nil {
		return *c.API.AllowAnonymous
	}
	return len(c.API.Keys) == 0 && c.httpOnLoopback()
}

// httpOnLoopback reports whether listen.http is a loopback host:port.
func (c *Config) httpOnLoopback() bool {
	host, _, err := net.SplitHostPort(c.Listen.HTTP)
	return err == nil && yamlconf.IsLoopbackHost(host)
}

// emptyKeyDigest is the SHA-256 of the empty string. A request with an empty key has no key, so
// a configured key with this digest could never match; it is refused as a mistake.
var emptyKeyDigest = sha256.Sum256(nil)

// validateAccess checks the api and principals sections. httpValid is whether listen.http parsed,
// so a bad address is not reported a second time as "not loopback".
func (c *Config) validateAccess(httpValid bool) yamlconf.Errors {
	var es yamlconf.Errors
	switch c.API.AdminReads {
	case "", AdminReadsAdmins, AdminReadsOpen:
	default:
		es.Add("api.admin_reads", "must be %q or %q (or left out: open exactly when anonymous access is), got %q", AdminReadsAdmins, AdminReadsOpen, c.API.AdminReads)
	}
	if a := c.API.AllowAnonymous; a != nil && *a && httpValid && !c.httpOnLoopback() {
		es.Add("api.allow_anonymous", "anonymous access is only allowed on a loopback listen.http; got %q (configure api.keys instead)", c.Listen.HTTP)
	}

	routes := make(map[string]bool, len(c.Routes))
	for _, r := range c.Routes {
		routes[r.Name] = true
	}
	principals := make(map[string]string, len(c.Principals)) // name → path of its first entry
	// ollamaKeys maps a public key (wire form) to the path of its first entry, across principals.
	ollamaKeys := make(map[string]string)
	for i, p := range c.Principals {
		path := fmt.Sprintf("principals[%d]", i)
		if err := yamlconf.CheckID(path+".name", p.Name); err != nil {
			es.Append(err)
		} else if p.Name == AnonymousPrincipal {
			es.Add(path+".name", "%q is reserved for requests without a key (see api.allow_anonymous)", AnonymousPrincipal)
		} else if first, dup := principals[p.Name]; dup {
			es.Add(path+".name", "duplicate principal %q (first at %s)", p.Name, first)
		} else {
			principals[p.Name] = path
		}
		es.Append(checkRouteNames(path+".routes", p.Routes, routes)...)
		es.Append(checkOllamaKeys(path+".ollama_keys", p.OllamaKeys, ollamaKeys)...)
	}
	es.Append(c.validateTrusted(principals)...)
	es.Append(checkAllowedHosts("api.allowed_hosts", c.API.AllowedHosts)...)
	es.Append(checkAllowedOrigins("api.allowed_origins", c.API.AllowedOrigins)...)

	digests := make(map[[sha256.Size]byte]string, len(c.API.Keys)) // digest → path of its first entry
	for i, k := range c.API.Keys {
		path := fmt.Sprintf("api.keys[%d]", i)
		if err := yamlconf.CheckID(path+".principal", k.Principal); err != nil {
			es.Append(err)
		} else if _, ok := principals[k.Principal]; !ok {
			es.Add(path+".principal", "unknown principal %q; add it under principals", k.Principal)
		}
		// The value is never echoed: someone may have pasted the key itself here.
		d, ok := k.Digest()
		switch {
		case k.SHA256 == "":
			es.Add(path+".sha256", "required: the hex SHA-256 of the key")
		case !ok:
			es.Add(path+".sha256", "must be 64 hexadecimal digits (the SHA-256 of the key, not the key), got %d characters", len(k.SHA256))
		case d == emptyKeyDigest:
			es.Add(path+".sha256", "is the SHA-256 of an empty key, which no request can present")
		case digests[d] != "":
			es.Add(path+".sha256", "the same key as %s; a key authenticates one principal", digests[d])
		default:
			digests[d] = path
		}
	}
	return es
}

// checkRouteNames checks a principal's routes: at least one, each AllRoutes or the name of a
// route in routes, none twice.
func checkRouteNames(path string, names []string, routes map[string]bool) yamlconf.Errors {
	var es yamlconf.Errors
	if len(names) == 0 {
		es.Add(path, "required: the names of the routes this principal may use, or %q for all", AllRoutes)
		return es
	}
	seen := make(map[string]bool, len(names))
	for i, name := range names {
		p := fmt.Sprintf("%s[%d]", path, i)
		switch {
		case seen[name]:
			es.Add(p, "duplicate route %q", name)
		case name == AllRoutes:
		case !routes[name]:
			es.Add(p, "unknown route %q; name a route under routes, or %q for all", name, AllRoutes)
		}
		seen[name] = true
	}
	return es
}

// CheckAllowed is Validate's check of api.allowed_hosts and api.allowed_origins alone, for a
// configuration built in code (auth.New refuses what it refuses).
func (a API) CheckAllowed() error {
	es := checkAllowedHosts("api.allowed_hosts", a.AllowedHosts)
	es.Append(checkAllowedOrigins("api.allowed_origins", a.AllowedOrigins)...)
	return es.Err()
}

// checkAllowedHosts checks api.allowed_hosts: each entry a DNS name that is not always
// accepted anyway, written as a Host header carries it, without a port; none twice (names are
// compared in any case).
func checkAllowedHosts(path string, hosts []string) yamlconf.Errors {
	var es yamlconf.Errors
	seen := make(map[string]string, len(hosts)) // lower-case name → path of its first entry
	for i, h := range hosts {
		p := fmt.Sprintf("%s[%d]", path, i)
		lower := strings.ToLower(h)
		switch {
		case h == "":
			es.Add(p, "required: a host name such as edge.lan")
		case strings.Contains(h, "*"):
			es.Add(p, "wildcards are not supported: list each name clients use (a wildcard would let a rebinding page's own name in), got %q", h)
		case isIPLiteral(h):
			es.Add(p, "%q is an IP address, and a Host that is an IP address is always accepted: leave it out", h)
		case lower == "localhost" || strings.HasSuffix(lower, ".localhost"):
			es.Add(p, "%q is always accepted (localhost and names under .localhost resolve to this machine only): leave it out", h)
		case strings.Contains(h, ":") || strings.Contains(h, "/"):
			es.Add(p, "write the name without a port or scheme (the port is not compared), such as edge.lan, got %q", h)
		case strings.HasSuffix(h, ".") && isDNSName(strings.TrimSuffix(h, ".")):
			es.Add(p, "write it as %q: the trailing dot is ignored in a Host header", strings.TrimSuffix(h, "."))
		case !isDNSName(h):
			es.Add(p, "must be a DNS name such as edge.lan (letters, digits, hyphens and underscores in dot-separated labels of at most 63; an international name in its xn-- form), got %q", h)
		case seen[lower] != "":
			es.Add(p, "the same name as %s", seen[lower])
		default:
			seen[lower] = p
		}
	}
	return es
}

// checkAllowedOrigins checks api.allowed_origins: each entry an origin as a browser
// serializes it (scheme://host[:port], no default port, no path), none twice (compared in any
// case). A wildcard and the opaque origin "null" are refused: either would let any page in.
func checkAllowedOrigins(path string, origins []string) yamlconf.Errors {
	var es yamlconf.Errors
	seen := make(map[string]string, len(origins)) // lower-case origin → path of its first entry
	for i, o := range origins {
		p := fmt.Sprintf("%s[%d]", path, i)
		lower := strings.ToLower(o)
		switch {
		case o == "":
			es.Add(p, "required: an origin such as https://chat.example")
		case strings.Contains(o, "*"):
			es.Add(p, "a wildcard would let every web page use this Edge without a key and read its answers; list each origin as scheme://host[:port], got %q", o)
		case lower == "null":
			es.Add(p, "the origin null is sent by sandboxed frames and local files, which any page can make; it cannot be allowed")
		default:
			if msg := checkOrigin(o); msg != "" {
				es.Add(p, "%s", msg)
			} else if first := seen[lower]; first != "" {
				es.Add(p, "the same origin as %s", first)
			} else {
				seen[lower] = p
			}
		}
	}
	return es
}

// checkOrigin returns what is wrong with o as an origin, "" when nothing is.
func checkOrigin(o string) string {
	u, err := url.Parse(o)
	if err != nil || u.Scheme == "" || u.Host == "" || u.Opaque != "" {
		return fmt.Sprintf("must be an origin as scheme://host[:port], such as https://chat.example, got %q", o)
	}
	origin := u.Scheme + "://" + u.Host
	if u.Path != "" || u.RawQuery != "" || u.ForceQuery || u.Fragment != "" || u.User != nil {
		return fmt.Sprintf("an origin is scheme://host[:port] only, without user, path, query or fragment: write %q, got %q", origin, o)
	}
	host, port := u.Hostname(), u.Port()
	if !isDNSName(host) && !isIPLiteral(host) {
		return fmt.Sprintf("must be an origin as scheme://host[:port] whose host is a DNS name or an IP address, got %q", o)
	}
	if strings.HasSuffix(u.Host, ":") {
		return fmt.Sprintf("the port after %q is missing: write %q", u.Host, strings.TrimSuffix(origin, ":"))
	}
	if port != "" {
		n, err := strconv.Atoi(port)
		if err != nil || n < 1 || n > 65535 {
			return fmt.Sprintf("the port must be from 1 to 65535, got %q", port)
		}
		if def := map[string]string{"http": "80", "https": "443"}[strings.ToLower(u.Scheme)]; def == port {
			return fmt.Sprintf("browsers leave the default port out of an origin, so this one would never match; leave the default port out: write %q", strings.TrimSuffix(origin, ":"+port))
		}
	}
	return ""
}

// isIPLiteral reports whether h is an IP address, bracketed or not (the Host header brackets
// an IPv6 address).
func isIPLiteral(h string) bool {
	_, err := netip.ParseAddr(strings.TrimSuffix(strings.TrimPrefix(h, "["), "]"))
	return err == nil
}

// isDNSName reports whether h is a host name as a Host header carries it: dot-separated labels
// of 1 to 63 letters, digits, hyphens and underscores (service names such as my_service are
// in use), at most 253 bytes. An international name must be in its ASCII (xn--) form, which is
// what browsers send.
func isDNSName(h string) bool {
	if h == "" || len(h) > 253 {
		return false
	}
	for label := range strings.SplitSeq(h, ".") {
		if label == "" || len(label) > 63 {
			return false
		}
		for _, r := range label {
			switch {
			case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_':
			default:
				return false
			}
		}
	}
	return true
}
