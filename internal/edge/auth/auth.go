// Package auth decides who a client API request comes from: it reads the API key a request
// carries, compares its SHA-256 with the hashes in the Edge config, and returns the principal the
// key belongs to, with the routes that principal may use; a request without a key from a trusted
// network (api.trusted_networks) acts as that network's principal. A request the ollama CLI
// signs with its key (OLLAMA_AUTH=1) acts as the principal that lists the key in its
// ollama_keys (ollamakey.go).
//
// Access without a key is for programs, not web pages: Boundary (browser.go), around the whole
// HTTP listener, refuses a request let in without a key when it names the Edge by a name nobody
// listed (DNS rebinding), comes from another site's page, or carries a body a page can send
// anywhere without asking (text/plain, form, multipart).
//
// Keys are never stored, logged or put in an error; only their SHA-256 is held, and it is compared
// in constant time against every configured hash.
package auth

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/iop-dev/iop/internal/edge/edgeconfig"
)

// Errors Authenticate returns; a client API answers both with 401 in its own error shape.
var (
	// ErrMissingKey is a request without a key on an Edge that does not allow anonymous access.
	ErrMissingKey = errors.New("missing API key: send it as \"Authorization: Bearer KEY\" or \"x-api-key: KEY\"")
	// ErrInvalidKey is a key that matches no configured key, or a request that carries two
	// different keys.
	ErrInvalidKey = errors.New("invalid API key")
)

// maxKeyLen bounds the key Authenticate hashes. A longer one cannot have been issued by anyone
// sensible and is refused as invalid without being hashed.
const maxKeyLen = 4096

// Principal is who a request acts as: a name for logs, metrics and leases, the routes it may
// use, and whether it may change the Edge's state through the admin API. Its Routes are shared
// with the Authenticator and must not be modified.
type Principal struct {
	Name   string
	Routes []string // route names, or edgeconfig.AllRoutes ("*") for every route
	// Admin is edgeconfig.Principal.Admin: the principal may call the admin endpoints that change
	// state (revoke, reload, disable, enable). The anonymous principal never is.
	Admin bool
	// Config is the configuration the request was authenticated under. The gateway resolves the
	// request's route and profile in it, so a request sees one configuration from its start to
	// its end, even when a reload lands in between. Nil (a Principal made in code): the
	// gateway's current configuration. Read-only.
	Config *edgeconfig.Config
}

// MayUse reports whether p may use the route named route.
func (p Principal) MayUse(route string) bool {
	return slices.Contains(p.Routes, edgeconfig.AllRoutes) || slices.Contains(p.Routes, route)
}

// anonymousRoutes are the routes of the anonymous principal: all of them. It is never an
// admin: whoever reaches a loopback listener is not thereby trusted to revoke keys.
var anonymousRoutes = []string{edgeconfig.AllRoutes}

// Authenticator maps the API key, or the address, of a request to its principal. It holds one
// immutable snapshot of the configuration at a time; Replace swaps it atomically, and each
// Authenticate reads it once. Safe for concurrent use.
type Authenticator struct {
	state atomic.Pointer[state]
	sigs  *signatures // the Ollama key signatures used, across configurations
}

// state is what one configuration says about callers. Immutable once built.
type state struct {
	cfg       *edgeconfig.Config
	keys      []key // in config order; every one is compared on each request
	anonymous bool  // requests without a key act as the anonymous principal
	trusted   []network
	readsOpen bool
	// hosts and origins are api.allowed_hosts and api.allowed_origins, in lower case (see
	// Boundary).
	hosts, origins map[string]bool
	// ollamaKeys are the principals' ollama_keys by their wire form; sigs is the Authenticator's.
	ollamaKeys map[string]*ollamaKey
	sigs       *signatures
}

// key is one configured API key: the SHA-256 of the key and the principal it authenticates.
type key struct {
	digest    [sha256.Size]byte
	principal Principal
}

// network is one trusted network and the principal its clients act as without a key.
type network struct {
	prefix    netip.Prefix
	principal Principal
}

// New returns an Authenticator for the api and principals sections of cfg. It refuses the key
// problems edgeconfig.Validate refuses (a hash that is not 64 hex digits, a key naming an unknown
// principal, one key listed twice, a trusted network that is not a valid one or whose principal
// is unknown or an admin, an allowed host or origin that is not valid, an Ollama key that is not
// one or is listed twice), so a config built in code cannot slip past those checks.
func New(cfg *edgeconfig.Config, opts ...Option) (*Authenticator, error) {
	a := &Authenticator{sigs: newSignatures(opts)}
	st, err := build(cfg, a.sigs)
	if err != nil {
		return nil, err
	}
	a.state.Store(st)
	return a, nil
}

// Replace makes cfg the configuration of every request authenticated from now on. It refuses
// cfg, keeping the current one, for the reasons New does. A request already authenticated keeps
// the Principal, and with it the Config, it got.
func (a *Authenticator) Replace(cfg *edgeconfig.Config) error {
	st, err := build(cfg, a.sigs)
	if err != nil {
		return err
	}
	a.state.Store(st)
	return nil
}

// Config is the configuration requests are authenticated under now.
func (a *Authenticator) Config() *edgeconfig.Config { return a.state.Load().cfg }

func build(cfg *edgeconfig.Config, sigs *signatures) (*state, error) {
	if cfg == nil {
		return nil, errors.New("auth: nil config")
	}
	principals := make(map[string]Principal, len(cfg.Principals))
	for _, p := range cfg.Principals {
		principals[p.Name] = Principal{Name: p.Name, Routes: slices.Clone(p.Routes), Admin: p.Admin, Config: cfg}
	}
	st := &state{cfg: cfg, anonymous: cfg.AnonymousAllowed(), readsOpen: cfg.AdminReadsOpen(),
		hosts: lowerSet(cfg.API.AllowedHosts), origins: lowerSet(cfg.API.AllowedOrigins), sigs: sigs}
	if err := cfg.API.CheckAllowed(); err != nil {
		return nil, fmt.Errorf("auth: %w", err)
	}
	var err error
	if st.ollamaKeys, err = buildOllamaKeys(cfg, principals); err != nil {
		return nil, err
	}
	seen := make(map[[sha256.Size]byte]bool, len(cfg.API.Keys))
	for i, k := range cfg.API.Keys {
		d, ok := k.Digest()
		if !ok {
			return nil, fmt.Errorf("auth: api.keys[%d].sha256: must be 64 hexadecimal digits", i)
		}
		p, ok := principals[k.Principal]
		if !ok {
			return nil, fmt.Errorf("auth: api.keys[%d].principal: unknown principal %q", i, k.Principal)
		}
		if seen[d] {
			return nil, fmt.Errorf("auth: api.keys[%d].sha256: the same key is listed twice", i)
		}
		seen[d] = true
		st.keys = append(st.keys, key{digest: d, principal: p})
	}
	for i, n := range cfg.API.TrustedNetworks {
		prefix, err := edgeconfig.CheckTrustedCIDR(n.CIDR)
		if err != nil {
			return nil, fmt.Errorf("auth: api.trusted_networks[%d].cidr: %w", i, err)
		}
		p, ok := principals[n.Principal]
		switch {
		case !ok:
			return nil, fmt.Errorf("auth: api.trusted_networks[%d].principal: unknown principal %q", i, n.Principal)
		case p.Admin:
			return nil, fmt.Errorf("auth: api.trusted_networks[%d].principal: %q is an admin", i, n.Principal)
		}
		st.trusted = append(st.trusted, network{prefix: prefix, principal: p})
	}
	return st, nil
}

// AnonymousAllowed reports whether requests without a key are let through, as the principal
// named edgeconfig.AnonymousPrincipal with every route.
func (a *Authenticator) AnonymousAllowed() bool { return a.state.Load().anonymous }

// AdminReadsOpen reports whether the admin reads and /metrics answer anyone
// (edgeconfig.Config.AdminReadsOpen of the current configuration).
func (a *Authenticator) AdminReadsOpen() bool { return a.state.Load().readsOpen }

// Authenticate returns the principal of r. The key is read from "Authorization: Bearer KEY" (how
// OpenAI clients send it) or "x-api-key: KEY"; other Authorization schemes, such as the Basic
// credentials of a reverse proxy, are not keys and are ignored. A request may carry the key in
// both places only if it is the same key.
//
// A request signed with an Ollama key (an Authorization of Ollama's form) is decided by its
// signature like a key, with one of the signature errors of ollamakey.go, when any principal
// lists ollama_keys; it may not carry an API key as well (ErrInvalidKey). When none lists any,
// the signature is ignored as a key is when no keys are configured: OLLAMA_AUTH=1 set for
// another server does not lock its user out of an Edge that does not use it.
//
// A request with a key is who its key says, or ErrInvalidKey. Without a key, r acts as the
// principal of the first trusted network that holds its peer address (r.RemoteAddr: the TCP
// peer, never a forwarded header), else as the anonymous principal when that is allowed, and
// is refused with ErrMissingKey otherwise. One exception: when no keys are configured, a key
// cannot match, and r is treated as if it had none (served as its trusted network's principal,
// or as anonymous when that is allowed; ErrInvalidKey otherwise), because OpenAI clients insist
// on sending some key even to a local server.
//
// Behind Boundary, r is authenticated under the configuration Boundary decided with, so that a
// reload landing in between cannot let through a request Boundary did not check.
func (a *Authenticator) Authenticate(r *http.Request) (Principal, error) {
	p, _, err := a.snapshot(r).authenticate(r)
	return p, err
}

// via is how a request was let in: by its key, or without one.
type via int

const (
	viaKey       via = iota // a configured key matched
	viaNetwork              // no key (or no keys configured); a trusted network holds its address
	viaAnonymous            // no key (or no keys configured); anonymous access is allowed
)

// authenticate is Authenticate under st, also saying how the request was let in.
func (st *state) authenticate(r *http.Request) (Principal, via, error) {
	k, err := keyOf(r.Header)
	if err != nil {
		return Principal{}, viaKey, err
	}
	if len(st.ollamaKeys) > 0 {
		switch sig, err := signatureOf(r.Header); {
		case err != nil:
			return Principal{}, viaKey, err
		case sig != "" && k != "":
			return Principal{}, viaKey, ErrInvalidKey
		case sig != "":
			p, err := st.signed(r, sig)
			return p, viaKey, err
		}
	}
	switch {
	case k == "" || len(st.keys) == 0:
		if p, ok := st.fromNetwork(r.RemoteAddr); ok {
			return p, viaNetwork, nil
		}
		switch {
		case st.anonymous:
			return Principal{Name: edgeconfig.AnonymousPrincipal, Routes: anonymousRoutes, Config: st.cfg}, viaAnonymous, nil
		case k != "":
			return Principal{}, viaKey, ErrInvalidKey
		}
		return Principal{}, viaKey, ErrMissingKey
	case len(k) > maxKeyLen:
		return Principal{}, viaKey, ErrInvalidKey
	}
	if p, ok := st.lookup(sha256.Sum256([]byte(k))); ok {
		return p, viaKey, nil
	}
	return Principal{}, viaKey, ErrInvalidKey
}

// fromNetwork returns the principal of the first trusted network holding the host of
// remoteAddr (host:port), and false when none does.
func (st *state) fromNetwork(remoteAddr string) (Principal, bool) {
	if len(st.trusted) == 0 {
		return Principal{}, false
	}
	ap, err := netip.ParseAddrPort(remoteAddr)
	if err != nil {
		return Principal{}, false
	}
	addr := ap.Addr().Unmap().WithZone("")
	for _, n := range st.trusted {
		if n.prefix.Contains(addr) {
			return n.principal, true
		}
	}
	return Principal{}, false
}

// lookup finds the key whose digest is d. It compares d with every configured digest in
// constant time and without stopping at a match, so how long it takes says nothing about which
// key, or how much of one, matched.
func (st *state) lookup(d [sha256.Size]byte) (Principal, bool) {
	found := -1
	for i := range st.keys {
		eq := subtle.ConstantTimeCompare(d[:], st.keys[i].digest[:])
		found = subtle.ConstantTimeSelect(eq, i, found)
	}
	if found < 0 {
		return Principal{}, false
	}
	return st.keys[found].principal, true
}

// keyOf returns the API key in h, "" when there is none, or ErrInvalidKey when h carries two
// different ones.
func keyOf(h http.Header) (string, error) {
	var k string
	add := func(v string) error {
		v = strings.TrimSpace(v)
		switch {
		case v == "":
		case k == "":
			k = v
		case subtle.ConstantTimeCompare([]byte(k), []byte(v)) != 1:
			return ErrInvalidKey
		}
		return nil
	}
	for _, v := range h.Values("Authorization") {
		scheme, rest, _ := strings.Cut(strings.TrimSpace(v), " ")
		if !strings.EqualFold(scheme, "Bearer") {
			continue
		}
		if err := add(rest); err != nil {
			return "", err
		}
	}
	for _, v := range h.Values("X-Api-Key") {
		if err := add(v); err != nil {
			return "", err
		}
	}
	return k, nil
}

// lowerSet is the set of vs in lower case.
func lowerSet(vs []string) map[string]bool {
	set := make(map[string]bool, len(vs))
	for _, v := range vs {
		set[strings.ToLower(v)] = true
	}
	return set
}

// HashKey returns the hex SHA-256 of key, as api.keys[].sha256 holds it.
func HashKey(key string) string {
	d := sha256.Sum256([]byte(key))
	return hex.EncodeToString(d[:])
}
