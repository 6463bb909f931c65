package cluster

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"slices"
	"strings"

	"github.com/iop-dev/iop/internal/edge/edgeconfig"
)

// ConfigHash is the hash of the parts of cfg that every Edge of a cluster
// must have alike, since a client's request may land on any of them: who
// may call (api.keys, principals, anonymous access, who may read the admin
// state, trusted_networks, allowed_origins), and what a model resolves to
// (routes, profiles, and the credentials profiles name, by reference). A
// client that passes on one Edge and is refused on another, or a model
// served differently, shows as an Edge whose hash differs from the
// majority's in the cluster view.
//
// Left out, as each Edge's own: edge_id, listen, identity, data_dir,
// limits, log, enrollment, cluster, shutdown_grace, api.tls (each Edge has
// its certificate), and api.allowed_hosts (each Edge may be reached by a
// name of its own).
//
// The encoding is canonical: entries whose order carries no meaning are
// sorted (keys, principals and their routes, profiles, routes,
// credentials, origins), entries whose order does are kept (a route's
// targets, trusted networks: the first match wins), and key hashes are
// lower-cased, so two files that mean the same hash the same. The result
// is "sha256:" and 64 hex digits; it holds no secret (the keys are hashes
// already, credentials are named by reference).
func ConfigHash(cfg *edgeconfig.Config) string {
	shared := struct {
		Keys            []edgeconfig.APIKey
		Anonymous       bool
		AdminReadsOpen  bool
		TrustedNetworks []edgeconfig.TrustedNetwork
		AllowedOrigins  []string
		Principals      []edgeconfig.Principal
		Profiles        []edgeconfig.Profile
		Routes          []edgeconfig.Route
		Credentials     []edgeconfig.Credential
	}{
		Anonymous:       cfg.AnonymousAllowed(),
		AdminReadsOpen:  cfg.AdminReadsOpen(),
		TrustedNetworks: cfg.API.TrustedNetworks,
		AllowedOrigins:  sorted(cfg.API.AllowedOrigins, strings.Compare),
		Profiles:        sorted(cfg.Profiles, func(a, b edgeconfig.Profile) int { return strings.Compare(a.Name, b.Name) }),
		Routes: sorted(cfg.Routes, func(a, b edgeconfig.Route) int {
			return cmp.Or(strings.Compare(a.Name, b.Name), strings.Compare(a.Model, b.Model))
		}),
		Credentials: sorted(cfg.Credentials, func(a, b edgeconfig.Credential) int { return strings.Compare(a.Name, b.Name) }),
	}
	for _, k := range cfg.API.Keys {
		shared.Keys = append(shared.Keys, edgeconfig.APIKey{Principal: k.Principal, SHA256: strings.ToLower(k.SHA256)})
	}
	slices.SortFunc(shared.Keys, func(a, b edgeconfig.APIKey) int {
		return cmp.Or(strings.Compare(a.SHA256, b.SHA256), strings.Compare(a.Principal, b.Principal))
	})
	for _, p := range cfg.Principals {
		p.Routes = sorted(p.Routes, strings.Compare)
		shared.Principals = append(shared.Principals, p)
	}
	slices.SortFunc(shared.Principals, func(a, b edgeconfig.Principal) int { return strings.Compare(a.Name, b.Name) })
	// Every field is a plain value: encoding cannot fail, and encoding/json
	// writes struct fields in their declared order.
	b, err := json.Marshal(shared)
	if err != nil {
		panic("cluster: ConfigHash: " + err.Error())
	}
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// sorted returns a sorted copy of s.
func sorted[T any](s []T, compare func(a, b T) int) []T {
	out := slices.Clone(s)
	slices.SortStableFunc(out, compare)
	return out
}
