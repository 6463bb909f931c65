// Package pki creates the certificate authority of a managed IOP deployment
// and issues the Edge and Node certificates that carry their workload
// identities (S3). It is deliberately small: one CA, no intermediates, no
// revocation lists (the Edge keeps its own list of revoked serials, see
// internal/edge/registrar); short leaf lifetimes and renewal are the rotation
// story. Keys are ECDSA P-256 and stored as PKCS#8 "PRIVATE KEY" PEM.
package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/iop-dev/iop/quicwire"
)

// Default validity periods, matching common practice for internal CAs
// (nomad tls, consul tls).
const (
	DefaultCAValidity   = 5 * 365 * 24 * time.Hour
	DefaultLeafValidity = 365 * 24 * time.Hour
)

// CA is a certificate authority whose certificates name identities in one
// trust domain.
type CA struct {
	Cert        *x509.Certificate
	Key         crypto.Signer
	TrustDomain string
}

// Options shape a new certificate. Zero values pick the defaults.
type Options struct {
	// NotBefore is the start of validity; zero means one minute ago, to
	// tolerate small clock skew between machines.
	NotBefore time.Time
	// Validity is the lifetime from NotBefore; zero means DefaultCAValidity
	// for a CA and DefaultLeafValidity for a leaf.
	Validity time.Duration
	// DNSNames and IPAddresses are added as SANs. Identity verification does
	// not use them; they help other TLS clients (curl, browsers) reach the
	// Edge by name.
	DNSNames    []string
	IPAddresses []net.IP
}

func (o Options) window(defaultValidity time.Duration) (notBefore, notAfter time.Time) {
	notBefore = o.NotBefore
	if notBefore.IsZero() {
		notBefore = time.Now().Add(-time.Minute)
	}
	v := o.Validity
	if v <= 0 {
		v = defaultValidity
	}
	return notBefore, notBefore.Add(v)
}

// NewCA creates a self-signed CA for trustDomain. Its certificate carries
// the URI SAN spiffe://TRUST-DOMAIN, so LoadCA can recover the trust domain,
// and MaxPathLen 0: it signs leaves only.
func NewCA(trustDomain string, opts Options) (*CA, error) {
	if err := quicwire.ValidateTrustDomain(trustDomain); err != nil {
		return nil, fmt.Errorf("new CA: %w", err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("new CA: generate key: %w", err)
	}
	serial, err := newSerial()
	if err != nil {
		return nil, fmt.Errorf("new CA: %w", err)
	}
	notBefore, notAfter := opts.window(DefaultCAValidity)
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "IOP CA " + trustDomain, Organization: []string{"IOP"}},
		NotBefore:             notBefore,
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLen:            0,
		MaxPathLenZero:        true,
		URIs:                  []*url.URL{{Scheme: "spiffe", Host: trustDomain}},
		DNSNames:              opts.DNSNames,
		IPAddresses:           opts.IPAddresses,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("new CA: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("new CA: %w", err)
	}
	return &CA{Cert: cert, Key: key, TrustDomain: trustDomain}, nil
}

// LoadCA reads a CA written by NewCA (via CertPEM/KeyPEM). It checks that
// the certificate is a CA, that the key belongs to it, and recovers the trust
// domain from its spiffe://TRUST-DOMAIN URI SAN.
func LoadCA(certPEMFile, keyPEMFile string) (*CA, error) {
	certPEM, err := os.ReadFile(certPEMFile)
	if err != nil {
		return nil, fmt.Errorf("load CA certificate: %w", err)
	}
	cert, err := parseCertPEM(certPEM)
	if err != nil {
		return nil, fmt.Errorf("load CA certificate %s: %w", certPEMFile, err)
	}
	if !cert.IsCA {
		return nil, fmt.Errorf("load CA certificate %s: not a CA certificate", certPEMFile)
	}
	td, err := caTrustDomain(cert)
	if err != nil {
		return nil, fmt.Errorf("load CA certificate %s: %w", certPEMFile, err)
	}
	keyPEM, err := os.ReadFile(keyPEMFile)
	if err != nil {
		return nil, fmt.Errorf("load CA key: %w", err)
	}
	key, err := parseKeyPEM(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("load CA key %s: %w", keyPEMFile, err)
	}
	pub, ok := key.Public().(interface{ Equal(crypto.PublicKey) bool })
	if !ok || !pub.Equal(cert.PublicKey) {
		return nil, fmt.Errorf("load CA key %s: does not match certificate %s", keyPEMFile, certPEMFile)
	}
	return &CA{Cert: cert, Key: key, TrustDomain: td}, nil
}

// caTrustDomain reads the trust domain from a CA certificate's single
// spiffe URI SAN, which must have no path.
func caTrustDomain(cert *x509.Certificate) (string, error) {
	var tds []string
	for _, u := range cert.URIs {
		if u.Scheme == "spiffe" {
			tds = append(tds, u.Host)
			if u.Path != "" && u.Path != "/" {
				return "", fmt.Errorf("CA URI SAN %s has a path; want spiffe://TRUST-DOMAIN", u)
			}
		}
	}
	if len(tds) != 1 {
		return "", fmt.Errorf("want exactly one spiffe://TRUST-DOMAIN URI SAN, found %d", len(tds))
	}
	if err := quicwire.ValidateTrustDomain(tds[0]); err != nil {
		return "", err
	}
	return tds[0], nil
}

// CertPEM returns the CA certificate as PEM, the file Edges and Nodes trust.
func (ca *CA) CertPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Cert.Raw})
}

// KeyPEM returns the CA private key as PKCS#8 PEM.
func (ca *CA) KeyPEM() ([]byte, error) { return keyPEM(ca.Key) }

// Pool returns a pool holding only this CA, for EdgeTLSConfig/NodeTLSConfig.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// Issue makes a leaf certificate for id with id.URI() as its only URI SAN,
// and its key, returned as PEM. See Sign.
func (ca *CA) Issue(id quicwire.Identity, opts Options) (certPEM, keyPEMBytes []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("issue %s: generate key: %w", id, err)
	}
	cert, err := ca.Sign(id, &key.PublicKey, opts)
	if err != nil {
		return nil, nil, err
	}
	kp, err := keyPEM(key)
	if err != nil {
		return nil, nil, fmt.Errorf("issue %s: %w", id, err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw}), kp, nil
}

// Sign makes a leaf certificate for id, for a key made elsewhere (a Node's
// certificate request: its private key never leaves it), with id.URI() as
// its only URI SAN. id must be in the CA's trust domain. Both kinds get
// server and client auth: the Edge serves Nodes, and either side may be the
// TLS client of some future connection. The leaf never outlives the CA: its
// NotAfter is clamped to the CA's, since a chain with an expired CA does not
// verify anyway.
func (ca *CA) Sign(id quicwire.Identity, pub crypto.PublicKey, opts Options) (*x509.Certificate, error) {
	if err := id.Validate(); err != nil {
		return nil, fmt.Errorf("issue: %w", err)
	}
	if id.TrustDomain != ca.TrustDomain {
		return nil, fmt.Errorf("issue %s: CA is for trust domain %q", id, ca.TrustDomain)
	}
	serial, err := newSerial()
	if err != nil {
		return nil, fmt.Errorf("issue %s: %w", id, err)
	}
	notBefore, notAfter := opts.window(DefaultLeafValidity)
	if notAfter.After(ca.Cert.NotAfter) {
		notAfter = ca.Cert.NotAfter
	}
	subject := pkix.Name{Organization: []string{"IOP"}, OrganizationalUnit: []string{id.Kind}}
	if len(id.ID) <= 64 { // RFC 5280 upper bound for a common name.
		subject.CommonName = id.ID
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      subject,
		NotBefore:    notBefore,
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		URIs:         []*url.URL{id.URI()},
		DNSNames:     opts.DNSNames,
		IPAddresses:  opts.IPAddresses,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, pub, ca.Key)
	if err != nil {
		return nil, fmt.Errorf("issue %s: %w", id, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("issue %s: %w", id, err)
	}
	return cert, nil
}

// IssueTLS is Issue returning a ready tls.Certificate, for tests and for
// programs that issue certificates in memory.
func (ca *CA) IssueTLS(id quicwire.Identity, opts Options) (tls.Certificate, error) {
	certPEM, kp, err := ca.Issue(id, opts)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.X509KeyPair(certPEM, kp)
}

// LoadPool reads the CA certificate(s) an Edge or Node trusts.
func LoadPool(caPEMFile string) (*x509.CertPool, error) {
	b, err := os.ReadFile(caPEMFile)
	if err != nil {
		return nil, fmt.Errorf("load CA: %w", err)
	}
	p := x509.NewCertPool()
	if !p.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("load CA %s: no PEM certificate found", caPEMFile)
	}
	return p, nil
}

// LoadKeyPair reads a certificate and its key. Unlike tls.LoadX509KeyPair,
// its errors name the file at fault.
func LoadKeyPair(certFile, keyFile string) (tls.Certificate, error) {
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("load certificate: %w", err)
	}
	keyPEMBytes, err := os.ReadFile(keyFile)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("load key: %w", err)
	}
	if _, err := parseCertPEM(certPEM); err != nil {
		return tls.Certificate{}, fmt.Errorf("load certificate %s: %w", certFile, err)
	}
	if _, err := parseKeyPEM(keyPEMBytes); err != nil {
		return tls.Certificate{}, fmt.Errorf("load key %s: %w", keyFile, err)
	}
	c, err := tls.X509KeyPair(certPEM, keyPEMBytes)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("load key pair %s and %s: %w", certFile, keyFile, err)
	}
	return c, nil
}

// LoadIdentity reads what a daemon needs for managed mode: the CA pool it
// trusts and its own certificate and key, and checks that the certificate
// names want. A daemon that would present the wrong identity fails at
// start, with the files named, rather than being refused by its peer.
func LoadIdentity(caFile, certFile, keyFile string, want quicwire.Identity) (*x509.CertPool, tls.Certificate, error) {
	pool, err := LoadPool(caFile)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	cert, err := LoadKeyPair(certFile, keyFile)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	if cert.Leaf == nil {
		if cert.Leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return nil, tls.Certificate{}, fmt.Errorf("%s: %w", certFile, err)
		}
	}
	got, err := quicwire.IdentityFromCert(cert.Leaf)
	if err != nil {
		return nil, tls.Certificate{}, fmt.Errorf("%s: %w", certFile, err)
	}
	if got != want {
		return nil, tls.Certificate{}, fmt.Errorf("%s names %s, but this %s is %s", certFile, got, want.Kind, want)
	}
	return pool, cert, nil
}

// WriteFiles writes a certificate (mode 0644) and its key (mode 0600). It
// never overwrites: if either file exists it writes nothing and the error
// names the file, so re-running a command cannot destroy a CA key. If the
// second write fails the first file is removed, leaving no half pair.
func WriteFiles(certFile string, certPEM []byte, keyFile string, keyPEMBytes []byte) error {
	for _, f := range []string{certFile, keyFile} {
		if _, err := os.Lstat(f); err == nil {
			return fmt.Errorf("refusing to overwrite existing file %s", f)
		} else if !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("check %s: %w", f, err)
		}
	}
	if err := writeNew(certFile, certPEM, 0o644); err != nil {
		return err
	}
	if err := writeNew(keyFile, keyPEMBytes, 0o600); err != nil {
		_ = os.Remove(certFile)
		return err
	}
	return nil
}

// writeNew creates name exclusively (O_EXCL closes the race with the Lstat
// check) and writes data.
func writeNew(name string, data []byte, perm os.FileMode) error {
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("refusing to overwrite existing file %s", name)
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", name, err)
	}
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(name)
		return fmt.Errorf("write %s: %w", name, err)
	}
	return nil
}

// newSerial returns a random positive 128-bit serial number.
func newSerial() (*big.Int, error) {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, fmt.Errorf("serial number: %w", err)
	}
	return n.Add(n, big.NewInt(1)), nil // never zero: RFC 5280 wants positive.
}

func keyPEM(key crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("encode key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// parseCertPEM returns the first certificate in b.
func parseCertPEM(b []byte) (*x509.Certificate, error) {
	for {
		var block *pem.Block
		block, b = pem.Decode(b)
		if block == nil {
			return nil, errors.New("no PEM CERTIFICATE block found")
		}
		if block.Type == "CERTIFICATE" {
			return x509.ParseCertificate(block.Bytes)
		}
	}
}

// parseKeyPEM accepts PKCS#8 (what this package writes) and, for keys made by
// other tools, SEC 1 "EC PRIVATE KEY" and PKCS#1 "RSA PRIVATE KEY".
func parseKeyPEM(b []byte) (crypto.Signer, error) {
	for {
		var block *pem.Block
		block, b = pem.Decode(b)
		if block == nil {
			return nil, errors.New("no PEM private key block found")
		}
		if !strings.HasSuffix(block.Type, "PRIVATE KEY") {
			continue
		}
		var key any
		var err error
		switch block.Type {
		case "EC PRIVATE KEY":
			key, err = x509.ParseECPrivateKey(block.Bytes)
		case "RSA PRIVATE KEY":
			key, err = x509.ParsePKCS1PrivateKey(block.Bytes)
		default:
			key, err = x509.ParsePKCS8PrivateKey(block.Bytes)
		}
		if err != nil {
			return nil, err
		}
		s, ok := key.(crypto.Signer)
		if !ok {
			return nil, fmt.Errorf("unsupported private key type %T", key)
		}
		return s, nil
	}
}

// LoadCACert reads the CA certificate (the first of caPEMFile) that a
// deployment's tokens name by its hash.
func LoadCACert(caPEMFile string) (*x509.Certificate, error) {
	b, err := os.ReadFile(caPEMFile)
	if err != nil {
		return nil, fmt.Errorf("load CA: %w", err)
	}
	c, err := parseCertPEM(b)
	if err != nil {
		return nil, fmt.Errorf("load CA %s: %w", caPEMFile, err)
	}
	if !c.IsCA {
		return nil, fmt.Errorf("load CA %s: not a CA certificate", caPEMFile)
	}
	return c, nil
}

// WriteAtomic replaces name with data (mode perm) atomically: it writes a
// temporary file in the same directory, syncs it and renames it over name,
// so a reader or a crash sees the old content or the new, never a part.
func WriteAtomic(name string, data []byte, perm os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(name), "."+filepath.Base(name)+".tmp*")
	if err != nil {
		return fmt.Errorf("write %s: %w", name, err)
	}
	tmp := f.Name()
	err = f.Chmod(perm)
	if err == nil {
		_, err = f.Write(data)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, name)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("write %s: %w", name, err)
	}
	if d, err := os.Open(filepath.Dir(name)); err == nil {
		_ = d.Sync() // the rename itself survives a crash
		d.Close()
	}
	return nil
}
