package frontdoor

import (
	"crypto/tls"
	"net"
	"path/filepath"
	"testing"
)

// handshake runs a TLS handshake between the listener's configuration and
// a client of client, and returns the client's state or error.
func handshake(t *testing.T, server, client *tls.Config) (tls.ConnectionState, error) {
	t.Helper()
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	srv := tls.Server(a, server)
	done := make(chan error, 1)
	go func() { done <- srv.Handshake(); a.Close() }()
	cl := tls.Client(b, client)
	err := cl.Handshake()
	<-done
	return cl.ConnectionState(), err
}

// Issue 24: TLS 1.2 on the client listener offers AEAD suites with
// forward secrecy only (ECDHE with AES-GCM or ChaCha20-Poly1305): a client
// that offers only CBC suites (SHA-1 or SHA-256 MACs) is refused, one
// that offers GCM or ChaCha20 is served, and TLS 1.3 is as before.
func TestTLS12OffersOnlyAEADSuites(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "edge.crt"), filepath.Join(dir, "edge.key")
	writePair(t, certFile, keyFile, 1)
	c, err := NewCertFiles(certFile, keyFile, CertOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name   string
		suites []uint16
		max    uint16
		ok     bool
	}{
		{"TLS 1.2, CBC-SHA1 only", []uint16{tls.TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA, tls.TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA}, tls.VersionTLS12, false},
		{"TLS 1.2, CBC-SHA256 only", []uint16{tls.TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256}, tls.VersionTLS12, false},
		{"TLS 1.2, AES-GCM", []uint16{tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256}, tls.VersionTLS12, true},
		{"TLS 1.2, AES-256-GCM", []uint16{tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384}, tls.VersionTLS12, true},
		{"TLS 1.2, ChaCha20-Poly1305", []uint16{tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256}, tls.VersionTLS12, true},
		{"TLS 1.3", nil, tls.VersionTLS13, true},
	} {
		client := &tls.Config{InsecureSkipVerify: true, MaxVersion: tt.max, CipherSuites: tt.suites}
		st, err := handshake(t, c.TLSConfig(), client)
		switch {
		case tt.ok && err != nil:
			t.Errorf("%s: refused: %v", tt.name, err)
		case !tt.ok && err == nil:
			t.Errorf("%s: served with %s; want refused", tt.name, tls.CipherSuiteName(st.CipherSuite))
		}
	}
	// Every suite the listener names is an AEAD one with ECDHE.
	for _, id := range c.TLSConfig().CipherSuites {
		for _, s := range tls.InsecureCipherSuites() {
			if s.ID == id {
				t.Errorf("the listener names the insecure suite %s", s.Name)
			}
		}
		switch id {
		case tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
			tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384, tls.TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
			tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256, tls.TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256:
		default:
			t.Errorf("the listener names %s, not an ECDHE AEAD suite", tls.CipherSuiteName(id))
		}
	}
}
