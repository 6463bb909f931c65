package frontdoor

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"log/slog"
	"math/big"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// writePair writes a self-signed certificate with serial and its key to certFile and keyFile.
func writePair(t *testing.T, certFile, keyFile string, serial int64) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "edge.test"},
		DNSNames: []string{"edge.test"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// fakeClock is a clock the test moves.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// syncBuffer is a log sink safe for the handshakes' goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

func serialOf(t *testing.T, c *CertFiles) int64 {
	t.Helper()
	cert, err := c.GetCertificate(nil)
	if err != nil {
		t.Fatal(err)
	}
	return cert.Leaf.SerialNumber.Int64()
}

// Issue 16: a certificate rotated on disk is served without a restart, found within the check
// interval and not before; a pair that does not load leaves the last good one in service.
func TestCertFilesReloadOnChangeAndKeepTheLastGoodPair(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "edge.crt"), filepath.Join(dir, "edge.key")
	writePair(t, certFile, keyFile, 1)
	clock := &fakeClock{now: time.Unix(1_000_000, 0)}
	var log syncBuffer
	c, err := NewCertFiles(certFile, keyFile, CertOptions{Check: 2 * time.Second, Now: clock.Now, Logger: slog.New(slog.NewTextHandler(&log, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if got := serialOf(t, c); got != 1 {
		t.Fatalf("serial %d, want 1", got)
	}

	writePair(t, certFile, keyFile, 2)
	clock.Add(time.Second)
	if got := serialOf(t, c); got != 1 {
		t.Errorf("within the check interval: serial %d, want still 1 (the files are not looked at)", got)
	}
	clock.Add(time.Second)
	if got := serialOf(t, c); got != 2 {
		t.Errorf("after the check interval: serial %d, want the rotated 2", got)
	}
	if !strings.Contains(log.String(), "certificate reloaded") || !strings.Contains(log.String(), "serial=2") {
		t.Errorf("the reload was not logged with the new serial:\n%s", log.String())
	}

	// Half a rotation: a new certificate whose key is not there yet.
	writePair(t, filepath.Join(dir, "other.crt"), keyFile, 3)
	clock.Add(2 * time.Second)
	if got := serialOf(t, c); got != 2 {
		t.Errorf("with a key that does not match: serial %d, want the last good 2", got)
	}
	if !strings.Contains(log.String(), "do not load; serving the last good certificate") {
		t.Errorf("the bad pair was not logged:\n%s", log.String())
	}
	// Unchanged files are not read again: the bad pair is logged once.
	clock.Add(2 * time.Second)
	serialOf(t, c)
	if n := strings.Count(log.String(), "do not load"); n != 1 {
		t.Errorf("the same bad pair was logged %d times, want once", n)
	}

	// The files removed: the last good pair stays.
	os.Remove(certFile)
	clock.Add(2 * time.Second)
	if got := serialOf(t, c); got != 2 {
		t.Errorf("with the files gone: serial %d, want the last good 2", got)
	}
	// And a good pair again is taken.
	writePair(t, certFile, keyFile, 4)
	clock.Add(2 * time.Second)
	if got := serialOf(t, c); got != 4 {
		t.Errorf("after a good rotation: serial %d, want 4", got)
	}
}

func TestNewCertFilesRefusesABadPair(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "edge.crt"), filepath.Join(dir, "edge.key")
	if _, err := NewCertFiles(certFile, keyFile, CertOptions{}); err == nil || !strings.Contains(err.Error(), "api.tls") {
		t.Errorf("missing files: %v; want an api.tls error", err)
	}
	writePair(t, certFile, keyFile, 1)
	writePair(t, filepath.Join(dir, "x.crt"), filepath.Join(dir, "x.key"), 2)
	if _, err := NewCertFiles(certFile, filepath.Join(dir, "x.key"), CertOptions{}); err == nil {
		t.Error("a key that does not match the certificate was accepted")
	}
	c, err := NewCertFiles(certFile, keyFile, CertOptions{})
	if err != nil {
		t.Fatal(err)
	}
	conf := c.TLSConfig()
	if conf.MinVersion < 0x0303 || len(conf.NextProtos) != 2 || conf.NextProtos[0] != "h2" {
		t.Errorf("TLS config %+v; want TLS 1.2+, h2 then http/1.1", conf)
	}
	// HTTP/2 multiplexes requests on one connection: their number is bounded per connection.
	srv := New(Limits{}, nil).Server(http.NotFoundHandler(), slog.New(slog.DiscardHandler))
	if srv.HTTP2 == nil || srv.HTTP2.MaxConcurrentStreams != MaxStreams {
		t.Errorf("HTTP/2 streams per connection: %+v, want %d", srv.HTTP2, MaxStreams)
	}
}
