package frontdoor

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"
)

// DefaultCertCheck is how often CertFiles looks at its files at most.
const DefaultCertCheck = 2 * time.Second

// CertFiles is the client listener's certificate, read from a PEM certificate file and key
// file and read again when they change, so that a renewed certificate (certbot, an ACME
// client, a copy by hand) is served without a restart. It looks at the files' size and
// modification time on a handshake, at most once per check interval; when they differ from
// the last read it reads the pair again. A pair that does not load (half written, a key that
// does not match) is logged and the last good pair stays in service; the next change is tried
// again.
type CertFiles struct {
	certFile, keyFile string
	every             time.Duration
	now               func() time.Time
	log               *slog.Logger

	mu      sync.Mutex
	cert    *tls.Certificate
	stamp   [2]fileStamp // of the last pair tried, good or not
	checked time.Time
}

// fileStamp is what says a file changed.
type fileStamp struct {
	size    int64
	modTime time.Time
}

// CertOptions are the optional parts of CertFiles.
type CertOptions struct {
	// Check is how often the files are looked at, at most; default DefaultCertCheck.
	Check time.Duration
	// Now is the clock; default time.Now.
	Now func() time.Time
	// Logger logs reloads and failed reads; nil logs nothing.
	Logger *slog.Logger
}

// NewCertFiles reads the pair; an error here fails the Edge's start.
func NewCertFiles(certFile, keyFile string, opts CertOptions) (*CertFiles, error) {
	c := &CertFiles{certFile: certFile, keyFile: keyFile, every: opts.Check, now: opts.Now, log: opts.Logger}
	if c.every <= 0 {
		c.every = DefaultCertCheck
	}
	if c.now == nil {
		c.now = time.Now
	}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	stamp, _ := c.stamps()
	cert, err := c.load()
	if err != nil {
		return nil, err
	}
	c.cert, c.stamp, c.checked = cert, stamp, c.now()
	return c, nil
}

// tls12Suites are the TLS 1.2 suites the listener accepts: ECDHE (forward secrecy) with an AEAD
// cipher, AES-GCM or ChaCha20-Poly1305, as Mozilla's "intermediate" profile has them. Go's
// defaults also offer the ECDHE CBC suites with SHA-1 MACs (Lucky13-class padding oracles, no
// AEAD), which every client that can do TLS 1.2 can do without. TLS 1.3 suites are not
// configurable in Go and are all AEAD.
var tls12Suites = []uint16{
	tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
	tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
	tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
	tls.TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
	tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
	tls.TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
}

// TLSConfig is the listener's TLS configuration: TLS 1.2 (AEAD suites with ECDHE only) or later,
// HTTP/2 and HTTP/1.1 by ALPN, the certificate from GetCertificate.
func (c *CertFiles) TLSConfig() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, CipherSuites: tls12Suites,
		NextProtos: []string{"h2", "http/1.1"}, GetCertificate: c.GetCertificate}
}

// GetCertificate returns the current pair, first reading the files again if the check
// interval has passed and they changed. It is tls.Config.GetCertificate.
func (c *CertFiles) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	if now.Sub(c.checked) < c.every {
		return c.cert, nil
	}
	c.checked = now
	stamp, err := c.stamps()
	if err != nil || stamp == c.stamp {
		if err != nil && stamp != c.stamp {
			c.stamp = stamp
			c.log.Warn("api.tls: cannot read the certificate files; serving the last good certificate", "err", err)
		}
		return c.cert, nil
	}
	c.stamp = stamp
	cert, err := c.load()
	if err != nil {
		c.log.Warn("api.tls: the changed certificate files do not load; serving the last good certificate", "err", err)
		return c.cert, nil
	}
	c.cert = cert
	c.log.Info("api.tls: certificate reloaded", "cert_file", c.certFile, "subject", cert.Leaf.Subject.String(),
		"serial", cert.Leaf.SerialNumber.String(), "not_after", cert.Leaf.NotAfter)
	return c.cert, nil
}

// stamps are the stamps of both files; a file that cannot be stat'ed has the zero stamp.
func (c *CertFiles) stamps() ([2]fileStamp, error) {
	var out [2]fileStamp
	var first error
	for i, name := range []string{c.certFile, c.keyFile} {
		fi, err := os.Stat(name)
		if err != nil {
			if first == nil {
				first = err
			}
			continue
		}
		out[i] = fileStamp{size: fi.Size(), modTime: fi.ModTime()}
	}
	return out, first
}

// load reads and checks the pair.
func (c *CertFiles) load() (*tls.Certificate, error) {
	cert, err := tls.LoadX509KeyPair(c.certFile, c.keyFile)
	if err != nil {
		return nil, fmt.Errorf("api.tls: %s and %s: %w", c.certFile, c.keyFile, err)
	}
	if cert.Leaf == nil {
		if cert.Leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return nil, fmt.Errorf("api.tls: %s: %w", c.certFile, err)
		}
	}
	return &cert, nil
}
