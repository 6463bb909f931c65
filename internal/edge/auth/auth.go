// Package auth decides who a client API request comes from: it reads the API key a request
// carries, compares its SHA-256 with the hashes in the Edge config, and returns the principal the
// key belongs to, with the routes that principal may use.
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
	"slices"
	"strings"

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
}

// MayUse reports whether p may use the route named route.
func (p Principal) MayUse(route string) bool {
	return slices.Contains(p.Routes, edgeconfig.AllRoutes) || slices.Contains(p.Routes, route)
}

// anonymous is the principal of a request without a key, when the config allows that. It is
// never an admin: whoever reaches a loopback listener is not thereby trusted to revoke keys.
var anonymous = Principal{Name: edgeconfig.AnonymousPrincipal, Routes: []string{edgeconfig.AllRoutes}}

// Authenticator maps the API key of a request to its principal. It is immutable after New and
// safe for concurrent use.
type Authenticator struct {
	keys      []key // in config order; every one is compared on each request
	anonymous bool  // requests without a key act as the anonymous principal
}

// key is one configured API key: the SHA-256 of the key and the principal it authenticates.
type key struct {
	digest    [sha256.Size]byte
	principal Principal
}

// New returns an Authenticator for the api and principals sections of cfg. It refuses the key
// problems edgeconfig.Validate refuses (a hash that is not 64 hex digits, a key naming an unknown
// principal, one key listed twice), so a config built in code cannot slip past those checks.
func New(cfg *edgeconfig.Config) (*Authenticator, error) {
	if cfg == nil {
		return nil, errors.New("auth: nil config")
	}
	principals := make(map[string]Principal, len(cfg.Principals))
	for _, p := range cfg.Principals {
		principals[p.Name] = Principal{Name: p.Name, Routes: slices.Clone(p.Routes), Admin: p.Admin}
	}
	a := &Authenticator{anonymous: cfg.AnonymousAllowed()}
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
		a.keys = append(a.keys, key{digest: d, principal: p})
	}
	return a, nil
}

// AnonymousAllowed reports whether requests without a key are let through, as the principal
// named edgeconfig.AnonymousPrincipal with every route.
func (a *Authenticator) AnonymousAllowed() bool { return a.anonymous }

// Authenticate returns the principal of r. The key is read from "Authorization: Bearer KEY" (how
// OpenAI clients send it) or "x-api-key: KEY"; other Authorization schemes, such as the Basic
// credentials of a reverse proxy, are not keys and are ignored. A request may carry the key in
// both places only if it is the same key.
//
// Without a key, r acts as the anonymous principal when that is allowed, and is refused with
// ErrMissingKey otherwise. A key matching no configured key is ErrInvalidKey, with one
// exception: when anonymous access is allowed and no keys are configured, a key is not checked
// and r acts as the anonymous principal, as it would without one, because OpenAI clients insist
// on sending some key even to a local server.
func (a *Authenticator) Authenticate(r *http.Request) (Principal, error) {
	k, err := keyOf(r.Header)
	switch {
	case err != nil:
		return Principal{}, err
	case k == "" || (len(a.keys) == 0 && a.anonymous):
		if a.anonymous {
			return anonymous, nil
		}
		return Principal{}, ErrMissingKey
	case len(k) > maxKeyLen:
		return Principal{}, ErrInvalidKey
	}
	if p, ok := a.lookup(sha256.Sum256([]byte(k))); ok {
		return p, nil
	}
	return Principal{}, ErrInvalidKey
}

// lookup finds the key whose digest is d. It compares d with every configured digest in
// constant time and without stopping at a match, so how long it takes says nothing about which
// key, or how much of one, matched.
func (a *Authenticator) lookup(d [sha256.Size]byte) (Principal, bool) {
	found := -1
	for i := range a.keys {
		eq := subtle.ConstantTimeCompare(d[:], a.keys[i].digest[:])
		found = subtle.ConstantTimeSelect(eq, i, found)
	}
	if found < 0 {
		return Principal{}, false
	}
	return a.keys[found].principal, true
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

// HashKey returns the hex SHA-256 of key, as api.keys[].sha256 holds it.
func HashKey(key string) string {
	d := sha256.Sum256([]byte(key))
	return hex.EncodeToString(d[:])
}
