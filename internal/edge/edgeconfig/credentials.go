package edgeconfig

import (
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/iop-dev/iop/internal/yamlconf"
)

// Credential kinds: how a provider adapter presents a credential's value to its model server.
const (
	// CredentialKindBearer is sent as "Authorization: Bearer VALUE", as hosted OpenAI-compatible
	// APIs expect. It is the only kind so far, and the default.
	CredentialKindBearer = "bearer"
)

// credentialKinds lists the kinds Validate accepts.
var credentialKinds = []string{CredentialKindBearer}

// Credential is one entry of `credentials`: a secret that model servers behind some profiles
// need (the key of a hosted API), named by where the Edge reads it from. The file holds only
// that reference, never the value. The Edge reads the value at start and on an admin reload
// (see internal/edge/credentials) and hands it to a Node only inside a sealed, short-lived lease for
// one dispatch (SPEC R11, ARCHITECTURE.md decision 9), so the value never rests on a Node.
//
// Exactly one of Env and File is set. Load resolves a relative File against the directory of
// the configuration file.
type Credential struct {
	Name string `yaml:"name"` // unique; id rules (see yamlconf.CheckID); what profiles name
	// Env is the name of the environment variable of edged that holds the value.
	Env string `yaml:"env,omitempty"`
	// File is the path of a file that holds the value; trailing newlines are not part of it.
	File string `yaml:"file,omitempty"`
	// Kind is how the provider adapter presents the value: CredentialKindBearer (the default).
	Kind string `yaml:"kind"`
}

// SetDefaults fills an unset kind with CredentialKindBearer.
func (c *Credential) SetDefaults() {
	if c.Kind == "" {
		c.Kind = CredentialKindBearer
	}
}

// Source says where the value is read from, as "env:NAME" or "file:PATH": what logs, errors
// and the admin API show instead of the value.
func (c Credential) Source() string {
	if c.Env != "" {
		return "env:" + c.Env
	}
	return "file:" + c.File
}

// Credential returns the credential called name, and false when there is none.
func (c *Config) Credential(name string) (Credential, bool) {
	for _, cr := range c.Credentials {
		if cr.Name == name {
			return cr, true
		}
	}
	return Credential{}, false
}

// envName is what a POSIX shell accepts as a variable name.
var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// maxEnvName bounds an env field; a longer one is more likely a pasted value than a name.
const maxEnvName = 256

// validateCredentials checks the credentials section and the profiles' references to it (a
// profile's other fields are validateRoutes'). In loopback mode Nodes are not authenticated, so
// a lease could be sealed to anyone who reaches listen.quic: no profile may use a credential
// there (SPEC S3). A credential that no profile uses is allowed in any mode.
func (c *Config) validateCredentials() yamlconf.Errors {
	var es yamlconf.Errors
	names := make(map[string]string, len(c.Credentials)) // name → path of its first entry
	var valid []string                                   // names in file order, for messages
	for i, cr := range c.Credentials {
		path := fmt.Sprintf("credentials[%d]", i)
		if err := yamlconf.CheckID(path+".name", cr.Name); err != nil {
			es.Append(err)
		} else if first, dup := names[cr.Name]; dup {
			es.Add(path+".name", "duplicate credential %q (first at %s)", cr.Name, first)
		} else {
			names[cr.Name] = path
			valid = append(valid, cr.Name)
		}
		es.Append(cr.validate(path)...)
	}

	for i, p := range c.Profiles {
		if p.Credential == "" {
			continue
		}
		path := fmt.Sprintf("profiles[%d].credential", i)
		switch _, ok := names[p.Credential]; {
		case c.Identity.Mode == yamlconf.ModeLoopback:
			es.Add(path, "credential leases need identity.mode %s (managed mode): in loopback mode Nodes are not authenticated", yamlconf.ModeMTLS)
		case !ok && len(valid) == 0:
			es.Add(path, "no credential named %q; none is configured (define it under credentials)", p.Credential)
		case !ok:
			es.Add(path, "no credential named %q; configured: %s", p.Credential, strings.Join(valid, ", "))
		}
	}
	return es
}

// validate checks one credential's source and kind, naming fields under path. The env and file
// values are never echoed: someone may have pasted the secret itself there.
func (cr Credential) validate(path string) yamlconf.Errors {
	var es yamlconf.Errors
	switch {
	case cr.Env == "" && cr.File == "":
		es.Add(path, "set env (an environment variable) or file (a path) to say where the value is read from")
	case cr.Env != "" && cr.File != "":
		es.Add(path, "set env or file, not both")
	case cr.Env != "" && (len(cr.Env) > maxEnvName || !envName.MatchString(cr.Env)):
		es.Add(path+".env", "must be the name of an environment variable (letters, digits and '_', not starting with a digit, at most %d), not its value; got %d characters",
			maxEnvName, len(cr.Env))
	case cr.File != "" && strings.ContainsRune(cr.File, 0):
		es.Add(path+".file", "must be a file path, and a path cannot contain a NUL byte")
	}
	if !slices.Contains(credentialKinds, cr.Kind) {
		es.Add(path+".kind", "must be one of %s; got %q", strings.Join(credentialKinds, ", "), cr.Kind)
	}
	return es
}

// resolveCredentialPaths makes every relative credentials[].file relative to dir instead.
func (c *Config) resolveCredentialPaths(dir string) {
	for i := range c.Credentials {
		c.Credentials[i].File = yamlconf.ResolvePath(dir, c.Credentials[i].File)
	}
}
