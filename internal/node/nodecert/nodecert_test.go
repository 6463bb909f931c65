package nodecert

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/iop-dev/iop/quicwire"
	"github.com/iop-dev/iop/quicwire/pki"
)

// setup writes a CA and a Node's pair as `edged tls` would, and loads them.
func setup(t *testing.T) (*Holder, *pki.CA, string) {
	t.Helper()
	dir := t.TempDir()
	ca, err := pki.NewCA("iop.test", pki.Options{})
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err := ca.Issue(quicwire.NodeIdentity("iop.test", "n1"), pki.Options{})
	if err != nil {
		t.Fatal(err)
	}
	caFile, certFile, keyFile := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "node.pem"), filepath.Join(dir, "node-key.pem")
	if err := pki.WriteAtomic(caFile, ca.CertPEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := pki.WriteFiles(certFile, certPEM, keyFile, keyPEM); err != nil {
		t.Fatal(err)
	}
	h, _, err := Load(caFile, certFile, keyFile, quicwire.NodeIdentity("iop.test", "n1"))
	if err != nil {
		t.Fatal(err)
	}
	return h, ca, dir
}

// sign issues id a certificate for the key of the Holder's request.
func sign(t *testing.T, h *Holder, ca *pki.CA, id quicwire.Identity) []byte {
	t.Helper()
	der, err := h.Request()
	if err != nil {
		t.Fatal(err)
	}
	csr, err := x509.ParseCertificateRequest(der)
	if err != nil || csr.CheckSignature() != nil {
		t.Fatalf("request: %v", err)
	}
	c, err := ca.Sign(id, csr.PublicKey, pki.Options{Validity: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return c.Raw
}

func TestInstallSwapsTheCertificateAndWritesItBack(t *testing.T) {
	h, ca, dir := setup(t)
	before := h.Current()
	der := sign(t, h, ca, quicwire.NodeIdentity("iop.test", "n1"))
	if err := h.Install([][]byte{der, ca.Cert.Raw}); err != nil {
		t.Fatal(err)
	}
	if h.Current() == before || !h.Current().Leaf.Equal(mustParse(t, der)) {
		t.Error("the current certificate is not the renewed one")
	}
	// The next start reads the renewed certificate with the same key.
	again, _, err := Load(filepath.Join(dir, "ca.pem"), filepath.Join(dir, "node.pem"), filepath.Join(dir, "node-key.pem"), quicwire.NodeIdentity("iop.test", "n1"))
	if err != nil || !again.Current().Leaf.Equal(h.Current().Leaf) {
		t.Errorf("reload after renewal: %v", err)
	}
	// What the TLS configuration presents is the renewed one.
	got, _ := h.TLSConfig("iop.test", "").GetClientCertificate(nil)
	if !got.Leaf.Equal(h.Current().Leaf) {
		t.Error("the TLS configuration presents the old certificate")
	}
}

func TestInstallRefusesWhatIsNotThisNodesCertificate(t *testing.T) {
	h, ca, _ := setup(t)
	other, _ := pki.NewCA("iop.test", pki.Options{})
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	foreignKey, _ := ca.Sign(quicwire.NodeIdentity("iop.test", "n1"), &key.PublicKey, pki.Options{})
	before := h.Current()
	for _, tc := range []struct {
		name  string
		chain [][]byte
		want  string
	}{
		{"empty", nil, "empty chain"},
		{"garbage", [][]byte{[]byte("junk")}, "renewed certificate"},
		{"another node", [][]byte{sign(t, h, ca, quicwire.NodeIdentity("iop.test", "n2"))}, "names spiffe://iop.test/node/n2"},
		{"another CA", [][]byte{sign(t, h, other, quicwire.NodeIdentity("iop.test", "n1"))}, "does not verify"},
		{"another key", [][]byte{foreignKey.Raw}, "not for this Node's key"},
	} {
		if err := h.Install(tc.chain); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
	if h.Current() != before {
		t.Error("a refused certificate was installed")
	}
}

func mustParse(t *testing.T, der []byte) *x509.Certificate {
	t.Helper()
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
