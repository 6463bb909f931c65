package edgeconfig

import (
	"testing"
	"time"

	"github.com/iop-dev/iop/internal/yamlconf"
)

func TestEnrollmentNeedsMTLSAndADataDir(t *testing.T) {
	c := mtlsConfig()
	c.Enrollment.CAKeyFile = "/etc/iop/ca-key.pem"
	wantOneProblem(t, c.Validate(), "enrollment.ca_key_file", "needs data_dir")
	c.DataDir = "/var/lib/iop"
	if err := c.Validate(); err != nil {
		t.Errorf("mtls with data_dir: %v", err)
	}
	if !c.Enrollment.Enabled() {
		t.Error("not enabled with a CA key")
	}
}

func TestNodeCertLifetimeIsBounded(t *testing.T) {
	for _, d := range []time.Duration{time.Second, 59 * time.Second, 400 * 24 * time.Hour} {
		c := mtlsConfig()
		c.Enrollment.NodeCertLifetime = yamlconf.Duration(d)
		wantOneProblem(t, c.Validate(), "enrollment.node_cert_lifetime", "must be from 1m0s")
	}
	c := mtlsConfig()
	c.Enrollment.NodeCertLifetime = yamlconf.Duration(time.Hour)
	if err := c.Validate(); err != nil {
		t.Errorf("1h: %v", err)
	}
}

func TestEnrollmentSectionParses(t *testing.T) {
	c, err := Parse([]byte("identity: {ca_file: ca.pem, cert_file: e.pem, key_file: k.pem}\ndata_dir: d\nenrollment: {ca_key_file: ca-key.pem, node_cert_lifetime: 2h}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Enrollment.CAKeyFile != "ca-key.pem" || time.Duration(c.Enrollment.NodeCertLifetime) != 2*time.Hour {
		t.Errorf("parsed %+v", c.Enrollment)
	}
}

// An Edge holding the CA key may leave its certificate files out and issue
// its own; it may not name just one of them.
func TestAnEdgeWithTheCAKeyMayIssueItsOwnCertificate(t *testing.T) {
	c := mtlsConfig()
	c.Identity.CertFile, c.Identity.KeyFile = "", ""
	c.DataDir, c.Enrollment.CAKeyFile = "/var/lib/iop", "/etc/iop/ca-key.pem"
	if err := c.Validate(); err != nil || !c.SelfIssued() {
		t.Errorf("no certificate files with the CA key: %v (self-issued %v)", err, c.SelfIssued())
	}
	c.Identity.CertFile = "/etc/iop/edge.pem"
	wantOneProblem(t, c.Validate(), "identity.key_file", "required in mtls mode")
	c = mtlsConfig()
	c.Identity.CertFile, c.Identity.KeyFile = "", ""
	if err := c.Validate(); err == nil || c.SelfIssued() {
		t.Errorf("no certificate files and no CA key: %v", err)
	}
}
