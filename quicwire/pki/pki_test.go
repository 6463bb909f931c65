package pki_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/x509"
	"encoding/pem"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/iop-dev/iop/quicwire"
	"github.com/iop-dev/iop/quicwire/pki"
)

const td = "iop.local"

func newCA(t *testing.T, opts pki.Options) *pki.CA {
	t.Helper()
	ca, err := pki.NewCA(td, opts)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func parseCert(t *testing.T, b []byte) *x509.Certificate {
	t.Helper()
	block, _ := pem.Decode(b)
	if block == nil || block.Type != "CERTIFICATE" {
		t.Fatalf("not a PEM certificate: %q", b)
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestNewCAMakesALeafOnlyCAForItsTrustDomain: the CA names its trust domain
// (S3) and cannot sign intermediates.
func TestNewCAMakesALeafOnlyCAForItsTrustDomain(t *testing.T) {
	ca := newCA(t, pki.Options{})
	c := ca.Cert
	if !c.IsCA || c.MaxPathLen != 0 || !c.MaxPathLenZero {
		t.Errorf("IsCA=%v MaxPathLen=%d MaxPathLenZero=%v, want a CA with path length 0", c.IsCA, c.MaxPathLen, c.MaxPathLenZero)
	}
	if c.Subject.CommonName != "IOP CA "+td {
		t.Errorf("CN = %q", c.Subject.CommonName)
	}
	if len(c.URIs) != 1 || c.URIs[0].String() != "spiffe://"+td {
		t.Errorf("URIs = %v, want spiffe://%s", c.URIs, td)
	}
	if k, ok := c.PublicKey.(*ecdsa.PublicKey); !ok || k.Curve != elliptic.P256() {
		t.Errorf("key %T, want ECDSA P-256", c.PublicKey)
	}
	if c.SignatureAlgorithm != x509.ECDSAWithSHA256 {
		t.Errorf("signature %v, want ECDSA-SHA256", c.SignatureAlgorithm)
	}
	if got := c.NotAfter.Sub(c.NotBefore); got != pki.DefaultCAValidity {
		t.Errorf("validity %v, want %v", got, pki.DefaultCAValidity)
	}
	if _, err := pki.NewCA("Not A Domain", pki.Options{}); err == nil {
		t.Error("NewCA accepted an invalid trust domain")
	}
}

// TestIssuedLeafCarriesTheIdentityAndVerifies: a leaf names exactly its
// identity and chains to the CA for both client and server auth.
func TestIssuedLeafCarriesTheIdentityAndVerifies(t *testing.T) {
	ca := newCA(t, pki.Options{})
	for _, id := range []quicwire.Identity{quicwire.NodeIdentity(td, "node-1"), quicwire.EdgeIdentity(td, "edge-1")} {
		t.Run(id.Kind, func(t *testing.T) {
			certPEM, keyPEM, err := ca.Issue(id, pki.Options{DNSNames: []string{"edge.example"}, IPAddresses: []net.IP{net.ParseIP("10.0.0.1")}})
			if err != nil {
				t.Fatal(err)
			}
			leaf := parseCert(t, certPEM)
			for _, usage := range []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth} {
				if _, err := leaf.Verify(x509.VerifyOptions{Roots: ca.Pool(), KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
					t.Errorf("verify for %v: %v", usage, err)
				}
			}
			got, err := quicwire.IdentityFromCert(leaf)
			if err != nil || got != id {
				t.Errorf("IdentityFromCert = %v, %v; want %v", got, err, id)
			}
			if leaf.IsCA {
				t.Error("leaf is a CA")
			}
			if len(leaf.DNSNames) != 1 || len(leaf.IPAddresses) != 1 {
				t.Errorf("SANs DNS=%v IP=%v", leaf.DNSNames, leaf.IPAddresses)
			}
			if got := leaf.NotAfter.Sub(leaf.NotBefore); got != pki.DefaultLeafValidity {
				t.Errorf("validity %v, want %v", got, pki.DefaultLeafValidity)
			}
			if leaf.SerialNumber.Sign() <= 0 || leaf.SerialNumber.BitLen() > 129 {
				t.Errorf("serial %v is not a positive 128-bit number", leaf.SerialNumber)
			}
			if b, _ := pem.Decode(keyPEM); b == nil || b.Type != "PRIVATE KEY" {
				t.Errorf("key PEM is not PKCS#8 PRIVATE KEY")
			}
		})
	}
}

func TestIssueRefusesWhatTheCAMustNotSign(t *testing.T) {
	ca := newCA(t, pki.Options{})
	tests := map[string]quicwire.Identity{
		"another trust domain": quicwire.NodeIdentity("other.example", "n1"),
		"invalid id":           quicwire.NodeIdentity(td, "a/b"),
		"unknown kind":         {TrustDomain: td, Kind: "client", ID: "n1"},
	}
	for name, id := range tests {
		if _, _, err := ca.Issue(id, pki.Options{}); err == nil {
			t.Errorf("%s: Issue(%v) succeeded", name, id)
		}
	}
}

func TestLeafNeverOutlivesItsCA(t *testing.T) {
	ca := newCA(t, pki.Options{Validity: 24 * time.Hour})
	certPEM, _, err := ca.Issue(quicwire.NodeIdentity(td, "n1"), pki.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if leaf := parseCert(t, certPEM); !leaf.NotAfter.Equal(ca.Cert.NotAfter) {
		t.Errorf("leaf NotAfter %v, want clamped to CA's %v", leaf.NotAfter, ca.Cert.NotAfter)
	}
}

func TestSerialsAreDistinct(t *testing.T) {
	ca := newCA(t, pki.Options{})
	seen := map[string]bool{ca.Cert.SerialNumber.String(): true}
	for range 20 {
		c, err := ca.IssueTLS(quicwire.NodeIdentity(td, "n1"), pki.Options{})
		if err != nil {
			t.Fatal(err)
		}
		s := c.Leaf.SerialNumber.String()
		if seen[s] {
			t.Fatalf("serial %s issued twice", s)
		}
		seen[s] = true
	}
}

// TestCARoundTripsThroughFiles: what WriteFiles writes, LoadCA, LoadPool and
// LoadKeyPair read back, with private keys readable by the owner only.
func TestCARoundTripsThroughFiles(t *testing.T) {
	dir := t.TempDir()
	ca := newCA(t, pki.Options{})
	keyPEM, err := ca.KeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	caFile, caKeyFile := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "ca-key.pem")
	if err := pki.WriteFiles(caFile, ca.CertPEM(), caKeyFile, keyPEM); err != nil {
		t.Fatal(err)
	}
	for file, want := range map[string]os.FileMode{caFile: 0o644, caKeyFile: 0o600} {
		st, err := os.Stat(file)
		if err != nil {
			t.Fatal(err)
		}
		// The umask may only remove bits; a key must never gain any.
		if st.Mode().Perm()&^want != 0 {
			t.Errorf("%s mode %v, want at most %v", file, st.Mode().Perm(), want)
		}
	}

	loaded, err := pki.LoadCA(caFile, caKeyFile)
	if err != nil {
		t.Fatal(err)
	}
	if loaded.TrustDomain != td || !loaded.Cert.Equal(ca.Cert) {
		t.Errorf("LoadCA = %q %v, want the written CA", loaded.TrustDomain, loaded.Cert.Subject)
	}
	certPEM, leafKeyPEM, err := loaded.Issue(quicwire.EdgeIdentity(td, "e1"), pki.Options{})
	if err != nil {
		t.Fatal(err)
	}
	leafFile, leafKeyFile := filepath.Join(dir, "e1.pem"), filepath.Join(dir, "e1-key.pem")
	if err := pki.WriteFiles(leafFile, certPEM, leafKeyFile, leafKeyPEM); err != nil {
		t.Fatal(err)
	}
	pool, err := pki.LoadPool(caFile)
	if err != nil {
		t.Fatal(err)
	}
	kp, err := pki.LoadKeyPair(leafFile, leafKeyFile)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kp.Leaf.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		t.Errorf("issued by the loaded CA does not verify against the loaded pool: %v", err)
	}
}

func TestLoadErrorsNameTheFile(t *testing.T) {
	dir := t.TempDir()
	ca := newCA(t, pki.Options{})
	other := newCA(t, pki.Options{})
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	caFile := write("ca.pem", ca.CertPEM())
	otherKey, _ := other.KeyPEM()
	otherKeyFile := write("other-key.pem", otherKey)
	garbage := write("garbage.pem", []byte("not pem"))
	leafPEM, leafKey, err := ca.Issue(quicwire.NodeIdentity(td, "n1"), pki.Options{})
	if err != nil {
		t.Fatal(err)
	}
	leafFile, leafKeyFile := write("leaf.pem", leafPEM), write("leaf-key.pem", leafKey)
	missing := filepath.Join(dir, "missing.pem")

	tests := []struct {
		name, wantFile string
		err            error
	}{
		{"CA key of another CA", otherKeyFile, second(pki.LoadCA(caFile, otherKeyFile))},
		{"CA file that is a leaf", leafFile, second(pki.LoadCA(leafFile, leafKeyFile))},
		{"missing CA", missing, second(pki.LoadCA(missing, otherKeyFile))},
		{"pool from garbage", garbage, second(pki.LoadPool(garbage))},
		{"pool from missing file", missing, second(pki.LoadPool(missing))},
		{"key pair with garbage key", garbage, second(pki.LoadKeyPair(leafFile, garbage))},
		{"key pair with garbage cert", garbage, second(pki.LoadKeyPair(garbage, leafKeyFile))},
		{"key pair with the wrong key", leafFile, second(pki.LoadKeyPair(leafFile, otherKeyFile))},
	}
	for _, tt := range tests {
		if tt.err == nil || !strings.Contains(tt.err.Error(), tt.wantFile) {
			t.Errorf("%s: error %v, want one naming %s", tt.name, tt.err, tt.wantFile)
		}
	}
}

func second[T any](_ T, err error) error { return err }

// TestWriteFilesNeverOverwrites: re-running a command must not destroy a CA
// key, and a refused write leaves nothing behind.
func TestWriteFilesNeverOverwrites(t *testing.T) {
	dir := t.TempDir()
	cert, key := filepath.Join(dir, "c.pem"), filepath.Join(dir, "k.pem")
	if err := os.WriteFile(key, []byte("precious"), 0o600); err != nil {
		t.Fatal(err)
	}
	err := pki.WriteFiles(cert, []byte("new cert"), key, []byte("new key"))
	if err == nil || !strings.Contains(err.Error(), key) {
		t.Fatalf("WriteFiles over an existing key = %v, want an error naming %s", err, key)
	}
	if _, err := os.Stat(cert); !os.IsNotExist(err) {
		t.Errorf("certificate written although the key exists: %v", err)
	}
	if b, _ := os.ReadFile(key); string(b) != "precious" {
		t.Errorf("existing key overwritten: %q", b)
	}
}
