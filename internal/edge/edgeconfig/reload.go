package edgeconfig

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
)

// What a reload may change. A running Edge applies a new file's api.keys, allow_anonymous,
// admin_reads, trusted_networks, allowed_hosts and allowed_origins, its principals, profiles,
// routes, credentials and scheduling (read per request, as profiles are); every
// other field (edge_id, listen, identity, data_dir, limits, log, api.tls's file names, and any
// field added later unless it is listed here) sizes or names the process and takes a restart.
// The contents of the api.tls files are not the file's: they are re-read when they change.
var reloadable = map[string]bool{
	"api.keys": true, "api.allow_anonymous": true, "api.admin_reads": true, "api.trusted_networks": true,
	"api.allowed_hosts": true, "api.allowed_origins": true,
	"principals": true, "profiles": true, "routes": true, "credentials": true,
	"scheduling": true,
}

// Reloadable reports whether the field at path (a top-level key, or "api." and an api key) is
// applied by a reload.
func Reloadable(path string) bool { return reloadable[path] }

// ForReload returns what a running Edge with configuration c applies from next, a validated
// new file: next's reloadable fields over c's other fields, validated as a whole; and the paths
// of the fields next changes that only a restart applies, sorted. The error is Validate's on
// the merged configuration (a file can be valid only with its new listen.http, say); c and next
// are not modified.
func (c *Config) ForReload(next *Config) (*Config, []string, error) {
	merged := *c
	var restart []string
	cv, nv, mv := reflect.ValueOf(c).Elem(), reflect.ValueOf(next).Elem(), reflect.ValueOf(&merged).Elem()
	walkFields(cv.Type(), "", func(path string, index []int) {
		old, neu := cv.FieldByIndex(index), nv.FieldByIndex(index)
		switch {
		case reloadable[path]:
			mv.FieldByIndex(index).Set(neu)
		case !reflect.DeepEqual(old.Interface(), neu.Interface()):
			restart = append(restart, path)
		}
	})
	slices.Sort(restart)
	if err := merged.Validate(); err != nil {
		return nil, restart, err
	}
	return &merged, restart, nil
}

// ErrLastAdminKey is a reload refused because it would take away the last API key of an admin
// principal while the running configuration has one: after it, nobody could call the admin
// endpoints that change state, POST /admin/v1/reload among them, to undo it.
var ErrLastAdminKey = errors.New("the file leaves no API key of an admin principal (admin: true)")

// AdminKeys is how many of c's api.keys authenticate a principal with admin: true. Only a key
// makes an admin: neither a trusted network nor anonymous access ever does.
func (c *Config) AdminKeys() int {
	admin := make(map[string]bool, len(c.Principals))
	for _, p := range c.Principals {
		admin[p.Name] = p.Admin
	}
	n := 0
	for _, k := range c.API.Keys {
		if admin[k.Principal] {
			n++
		}
	}
	return n
}

// KeepsAdmin checks that next, applied by a reload over c, leaves an admin key when c has one
// (ErrLastAdminKey otherwise). A restart applies such a file: whoever restarts the Edge controls
// it without the admin API; a reload is often asked for through that API, and would lock its
// caller out. A configuration without an admin key may reload to another without one.
func (c *Config) KeepsAdmin(next *Config) error {
	if n := c.AdminKeys(); n > 0 && next.AdminKeys() == 0 {
		return fmt.Errorf("api.keys: %w, and the running configuration has %d; applied, it would leave nobody able to "+
			"call the admin endpoints, this reload among them. Keep a key whose principal has admin: true (or give admin: true "+
			"to the principal of a key you keep), or restart the Edge to run without one", ErrLastAdminKey, n)
	}
	return nil
}

// walkFields calls fn with the yaml path and index of every top-level field of t, and of every
// field of its api section.
func walkFields(t reflect.Type, prefix string, fn func(path string, index []int)) {
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "" || name == "-" {
			continue
		}
		if prefix == "" && name == "api" {
			walkFields(f.Type, "api.", func(path string, index []int) { fn(path, append([]int{i}, index...)) })
			continue
		}
		fn(prefix+name, []int{i})
	}
}

// Changes summarises what next changes of c's reloadable fields, one entry per section that
// differs: "api.keys: 2 -> 3", "routes: +chat ~code -old" (added, changed, removed by name).
// It shows counts and names only, never a key's hash or a credential's source.
func (c *Config) Changes(next *Config) []string {
	var out []string
	if !reflect.DeepEqual(c.API.Keys, next.API.Keys) {
		out = append(out, fmt.Sprintf("api.keys: %d -> %d", len(c.API.Keys), len(next.API.Keys)))
	}
	if c.AnonymousAllowed() != next.AnonymousAllowed() {
		out = append(out, fmt.Sprintf("anonymous access: %t -> %t", c.AnonymousAllowed(), next.AnonymousAllowed()))
	}
	if c.AdminReadsOpen() != next.AdminReadsOpen() {
		out = append(out, fmt.Sprintf("admin reads open: %t -> %t", c.AdminReadsOpen(), next.AdminReadsOpen()))
	}
	id := func(s string) string { return s }
	out = appendNamed(out, "api.allowed_hosts", c.API.AllowedHosts, next.API.AllowedHosts, id)
	out = appendNamed(out, "api.allowed_origins", c.API.AllowedOrigins, next.API.AllowedOrigins, id)
	out = appendNamed(out, "api.trusted_networks", c.API.TrustedNetworks, next.API.TrustedNetworks, func(n TrustedNetwork) string { return n.CIDR })
	out = appendNamed(out, "principals", c.Principals, next.Principals, func(p Principal) string { return p.Name })
	out = appendNamed(out, "profiles", c.Profiles, next.Profiles, func(p Profile) string { return p.Name })
	out = appendNamed(out, "routes", c.Routes, next.Routes, func(r Route) string { return r.Name })
	out = appendNamed(out, "credentials", c.Credentials, next.Credentials, func(cr Credential) string { return cr.Name })
	return out
}

// appendNamed appends "path: +added ~changed -removed" when the entries of old and next, keyed
// by name, differ.
func appendNamed[T any](out []string, path string, old, next []T, name func(T) string) []string {
	before := make(map[string]T, len(old))
	for _, v := range old {
		before[name(v)] = v
	}
	var parts []string
	after := make(map[string]bool, len(next))
	for _, v := range next {
		n := name(v)
		after[n] = true
		switch was, ok := before[n]; {
		case !ok:
			parts = append(parts, "+"+n)
		case !reflect.DeepEqual(was, v):
			parts = append(parts, "~"+n)
		}
	}
	for _, v := range old {
		if !after[name(v)] {
			parts = append(parts, "-"+name(v))
		}
	}
	if len(parts) == 0 {
		return out
	}
	return append(out, path+": "+strings.Join(parts, " "))
}
