package enroll

import (
	"crypto/x509"
	"errors"
	"testing"
	"time"

	"github.com/iop-dev/iop/quicwire"
	"github.com/iop-dev/iop/quicwire/pki"
)

func TestJoiningNodeTrustsOnlyTheTokensCA(t *testing.T) {
	ca, err := pki.NewCA("iop.test", pki.Options{})
	if err != nil {
		t.Fatal(err)
	}
	other, err := pki.NewCA("iop.test", pki.Options{})
	if err != nil {
		t.Fatal(err)
	}
	leaf := func(ca *pki.CA, id quicwire.Identity) *x509.Certificate {
		c, err := ca.IssueTLS(id, pki.Options{})
		if err != nil {
			t.Fatal(err)
		}
		return c.Leaf
	}
	edge := leaf(ca, quicwire.EdgeIdentity("iop.test", "edge-1"))
	now := time.Now()

	got, err := VerifyEdgeChain([]*x509.Certificate{edge, ca.Cert}, CAHash(ca.Cert), now)
	if err != nil || !got.Equal(ca.Cert) {
		t.Fatalf("the token's own Edge: %v", err)
	}
	// Another Edge (another CA): the token's hash finds no CA.
	if _, err := VerifyEdgeChain([]*x509.Certificate{leaf(other, quicwire.EdgeIdentity("iop.test", "edge-1")), other.Cert}, CAHash(ca.Cert), now); !errors.Is(err, ErrForeignEdge) {
		t.Errorf("another Edge's chain: %v, want ErrForeignEdge", err)
	}
	// An impostor presenting the real CA certificate with its own leaf.
	if _, err := VerifyEdgeChain([]*x509.Certificate{leaf(other, quicwire.EdgeIdentity("iop.test", "edge-1")), ca.Cert}, CAHash(ca.Cert), now); !errors.Is(err, ErrNotAnEdgeCert) {
		t.Errorf("a leaf the CA did not sign: %v, want ErrNotAnEdgeCert", err)
	}
	// A Node's certificate is not an Edge's.
	if _, err := VerifyEdgeChain([]*x509.Certificate{leaf(ca, quicwire.NodeIdentity("iop.test", "n1")), ca.Cert}, CAHash(ca.Cert), now); !errors.Is(err, ErrNotAnEdgeCert) {
		t.Errorf("a node certificate: %v, want ErrNotAnEdgeCert", err)
	}
	if _, err := VerifyEdgeChain(nil, CAHash(ca.Cert), now); !errors.Is(err, ErrNotAnEdgeCert) {
		t.Errorf("no certificate: %v", err)
	}
}
