package edgeconfig

import (
	"time"

	"github.com/iop-dev/iop/internal/yamlconf"
)

// Enrollment bounds.
const (
	// DefaultNodeCertLifetime is how long a certificate the Edge issues to a Node is valid. Nodes
	// renew at two thirds of it over their connection, so it can be short: a removed Node's
	// certificate is refused at once anyway, and a stolen one ends soon.
	DefaultNodeCertLifetime = 24 * time.Hour
	MinNodeCertLifetime     = time.Minute
	MaxNodeCertLifetime     = 366 * 24 * time.Hour
)

// validateIdentity is the identity section's own validation, except that an Edge holding the
// CA key may leave identity.cert_file and key_file out (both): it then issues its own
// certificate from the CA, in memory.
func (c *Config) validateIdentity() []*yamlconf.Error {
	es := c.Identity.Validate("identity")
	if c.Identity.Mode != yamlconf.ModeMTLS || c.Enrollment.CAKeyFile == "" || c.Identity.CertFile != "" || c.Identity.KeyFile != "" {
		return es
	}
	kept := es[:0]
	for _, e := range es {
		if e.Path != "identity.cert_file" && e.Path != "identity.key_file" {
			kept = append(kept, e)
		}
	}
	return kept
}

// SelfIssued reports whether the Edge issues its own certificate: managed, with the CA key and
// no certificate files.
func (c *Config) SelfIssued() bool {
	return c.Identity.Mode == yamlconf.ModeMTLS && c.Enrollment.CAKeyFile != "" && c.Identity.CertFile == "" && c.Identity.KeyFile == ""
}

// Enrollment is the `enrollment` section: the Edge issues Node identities itself (`edged node
// add` makes a join token, `noded join` redeems it, Nodes renew over their connection). It needs
// the CA's private key, and data_dir for its store of tokens, issued certificates and
// revocations. Without ca_key_file, joins and renewals are refused with a message saying so;
// `edged node remove` and the revocation check on every Node connection work whenever data_dir
// is set. With ca_key_file, identity.cert_file and key_file may be left out: the Edge then issues
// its own certificate (see SelfIssued).
type Enrollment struct {
	// CAKeyFile is the private key of identity.ca_file; mtls only; relative to the config file.
	CAKeyFile string `yaml:"ca_key_file,omitempty"`
	// NodeCertLifetime is the validity of the certificates issued to Nodes; default 24h, from 1m
	// to 366 days.
	NodeCertLifetime yamlconf.Duration `yaml:"node_cert_lifetime"`
}

// SetDefaults fills an unset lifetime.
func (e *Enrollment) SetDefaults() {
	if e.NodeCertLifetime == 0 {
		e.NodeCertLifetime = yamlconf.Duration(DefaultNodeCertLifetime)
	}
}

// Enabled reports whether the Edge issues Node identities.
func (e Enrollment) Enabled() bool { return e.CAKeyFile != "" }

func (c *Config) validateEnrollment() yamlconf.Errors {
	var es yamlconf.Errors
	e := c.Enrollment
	// 0, in a configuration built in code, is the default.
	if d := time.Duration(e.NodeCertLifetime); d != 0 && (d < MinNodeCertLifetime || d > MaxNodeCertLifetime) {
		es.Add("enrollment.node_cert_lifetime", "must be from %s to %s, got %s", MinNodeCertLifetime, MaxNodeCertLifetime, d)
	}
	if e.CAKeyFile == "" {
		return es
	}
	if c.Identity.Mode != yamlconf.ModeMTLS {
		es.Add("enrollment.ca_key_file", "only in mtls mode: loopback mode has no CA")
	}
	if c.DataDir == "" {
		es.Add("enrollment.ca_key_file", "needs data_dir, where the Edge keeps its tokens, issued certificates and revocations")
	}
	return es
}
