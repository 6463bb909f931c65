// Package nodecert is the Node's certificate in managed mode: what its TLS
// configuration presents, swapped in place when the Edge renews it, and
// written back to cert_file atomically so the next start uses it too.
//
// Renewal keeps the Node's key: only the certificate file changes, in one
// atomic rename, so a crash never leaves a key and a certificate that do not
// match. A new key comes with a new `noded join`.
package nodecert

import (
	"bytes"
	"crypto"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/iop-dev/iop/quicwire"
	"github.com/iop-dev/iop/quicwire/pki"
)

// Holder holds the Node's current certificate. Safe for concurrent use.
type Holder struct {
	certFile string
	key      crypto.Signer
	pool     *x509.CertPool
	want     quicwire.Identity
	cur      atomic.Pointer[tls.Certificate]
}

// Load reads the CA pool, certificate and key of identity want (see
// pki.LoadIdentity).
func Load(caFile, certFile, keyFile string, want quicwire.Identity) (*Holder, *x509.CertPool, error) {
	pool, cert, err := pki.LoadIdentity(caFile, certFile, keyFile, want)
	if err != nil {
		return nil, nil, err
	}
	key, ok := cert.PrivateKey.(crypto.Signer)
	if !ok {
		return nil, nil, fmt.Errorf("%s: key cannot sign", keyFile)
	}
	h := &Holder{certFile: certFile, key: key, pool: pool, want: want}
	h.cur.Store(&cert)
	return h, pool, nil
}

// Current is the certificate to present now.
func (h *Holder) Current() *tls.Certificate { return h.cur.Load() }

// Validity is the current certificate's validity window.
func (h *Holder) Validity() (notBefore, notAfter time.Time) {
	leaf := h.cur.Load().Leaf
	return leaf.NotBefore, leaf.NotAfter
}

// Request makes a certificate request (PKCS#10, DER) for the Node's key.
// Its subject is empty: the Edge names the identity of the connection.
func (h *Holder) Request() ([]byte, error) {
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, h.key)
	if err != nil {
		return nil, fmt.Errorf("certificate request: %w", err)
	}
	return der, nil
}

// Install checks a renewed chain (the certificate, then the CA) and makes
// it current: it must name the same identity, be for the Node's key, and
// verify against the CA the Node trusts. It is written to cert_file first
// (atomically), so what runs is what the next start reads.
func (h *Holder) Install(chain [][]byte) error {
	if len(chain) == 0 {
		return errors.New("renewed certificate: empty chain")
	}
	leaf, err := x509.ParseCertificate(chain[0])
	if err != nil {
		return fmt.Errorf("renewed certificate: %w", err)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: h.pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		return fmt.Errorf("renewed certificate does not verify against the trusted CA: %w", err)
	}
	if got, err := quicwire.IdentityFromCert(leaf); err != nil || got != h.want {
		return fmt.Errorf("renewed certificate names %v, want %s", got, h.want)
	}
	pub, ok := h.key.Public().(interface{ Equal(crypto.PublicKey) bool })
	if !ok || !pub.Equal(leaf.PublicKey) {
		return errors.New("renewed certificate is not for this Node's key")
	}
	var buf bytes.Buffer
	_ = pem.Encode(&buf, &pem.Block{Type: "CERTIFICATE", Bytes: leaf.Raw})
	if err := pki.WriteAtomic(h.certFile, buf.Bytes(), 0o644); err != nil {
		return fmt.Errorf("renewed certificate: %w", err)
	}
	h.cur.Store(&tls.Certificate{Certificate: [][]byte{leaf.Raw}, PrivateKey: h.key, Leaf: leaf})
	return nil
}

// TLSConfig is the Node's client TLS configuration presenting the current
// certificate at every handshake (see quicwire.NodeTLSConfigFunc).
func (h *Holder) TLSConfig(trustDomain, edgeID string) *tls.Config {
	return quicwire.NodeTLSConfigFunc(h.pool, h.Current, trustDomain, edgeID, nil)
}
