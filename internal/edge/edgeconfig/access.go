package edgeconfig

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"

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
	}
	es.Append(c.validateTrusted(principals)...)

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
