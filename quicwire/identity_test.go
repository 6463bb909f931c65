package quicwire_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"math/big"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/iop-dev/iop/quicwire"
	"github.com/iop-dev/iop/quicwire/pki"
)

const td = "iop.local"

// y2k is where testing/synctest's fake clock starts.
var y2k = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

func newCA(t *testing.T, trustDomain string, opts pki.Options) *pki.CA {
	t.Helper()
	ca, err := pki.NewCA(trustDomain, opts)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func issue(t *testing.T, ca *pki.CA, id quicwire.Identity, opts pki.Options) tls.Certificate {
	t.Helper()
	c, err := ca.IssueTLS(id, opts)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func pool(cas ...*pki.CA) *x509.CertPool {
	p := x509.NewCertPool()
	for _, ca := range cas {
		p.AddCert(ca.Cert)
	}
	return p
}

// handshakeResult is what each side of one TLS connection saw.
type handshakeResult struct {
	edgeErr, nodeErr error
	edgeState        tls.ConnectionState
	nodeState        tls.ConnectionState
}

// handshake runs one TLS connection between edgeCfg (server) and nodeCfg
// (client) over conns from dial. In TLS 1.3 the client finishes its
// handshake before the server has judged the client certificate, so the
// node also reads one byte: a refusal by the Edge surfaces there.
func handshake(t *testing.T, edgeCfg, nodeCfg *tls.Config, edgeConn, nodeConn net.Conn) handshakeResult {
	t.Helper()
	var r handshakeResult
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		s := tls.Server(edgeConn, edgeCfg)
		defer s.Close()
		if r.edgeErr = s.Handshake(); r.edgeErr == nil {
			r.edgeState = s.ConnectionState()
			_, r.edgeErr = s.Write([]byte{1})
		}
	}()
	go func() {
		defer wg.Done()
		c := tls.Client(nodeConn, nodeCfg)
		defer c.Close()
		if r.nodeErr = c.Handshake(); r.nodeErr == nil {
			r.nodeState = c.ConnectionState()
			_, r.nodeErr = io.ReadFull(c, make([]byte, 1))
		}
	}()
	wg.Wait()
	return r
}

// tcpPair returns the two ends of a loopback TCP connection. TCP (rather
// than net.Pipe) buffers, so neither side blocks writing an alert the other
// is not reading.
func tcpPair(t *testing.T) (server, client net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server = <-accepted
	if server == nil {
		t.Fatal("accept failed")
	}
	return server, client
}

// rejectLog records onReject calls.
type rejectLog struct {
	mu      sync.Mutex
	remotes []string
	errs    []error
}

func (l *rejectLog) onReject(remote string, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.remotes = append(l.remotes, remote)
	l.errs = append(l.errs, err)
}

// TestManagedModeVerifiesWorkloadIdentity covers S3: in managed mode the
// Edge accepts only a node identity from its CA and trust domain, the Node
// accepts only the edge identity it expects, and each refusal carries a
// typed reason on the verifying side.
func TestManagedModeVerifiesWorkloadIdentity(t *testing.T) {
	ca := newCA(t, td, pki.Options{})
	foreign := newCA(t, td, pki.Options{})
	otherTD := newCA(t, "other.example", pki.Options{})
	oldCA := newCA(t, td, pki.Options{NotBefore: time.Date(1999, 6, 1, 0, 0, 0, 0, time.UTC), Validity: 2 * 365 * 24 * time.Hour})
	now := time.Now()

	edgeCert := issue(t, ca, quicwire.EdgeIdentity(td, "edge-1"), pki.Options{})
	nodeCert := issue(t, ca, quicwire.NodeIdentity(td, "node-1"), pki.Options{})

	tests := []struct {
		name      string
		edgeCert  tls.Certificate
		nodeCert  *tls.Certificate // nil: the node presents no certificate
		edgeTrust *x509.CertPool
		nodeTrust *x509.CertPool
		wantEdge  string // "" accepts any edge id
		now       func() time.Time
		// wantEdgeRefusal is the reason the Edge refuses the node;
		// wantNodeRefusal the reason the Node refuses the Edge.
		wantEdgeRefusal error
		wantNodeRefusal error
	}{
		{
			name:     "node from the CA is accepted",
			edgeCert: edgeCert, nodeCert: &nodeCert,
			wantEdge: "edge-1",
		},
		{
			name:     "node from a foreign CA is refused",
			edgeCert: edgeCert, nodeCert: ptr(issue(t, foreign, quicwire.NodeIdentity(td, "node-1"), pki.Options{})),
			wantEdgeRefusal: quicwire.ErrUnknownAuthority,
		},
		{
			name:     "expired node certificate is refused",
			edgeCert: edgeCert, nodeCert: ptr(issue(t, ca, quicwire.NodeIdentity(td, "node-1"), pki.Options{NotBefore: now.Add(-48 * time.Hour), Validity: time.Hour})),
			wantEdgeRefusal: quicwire.ErrCertificateExpired,
		},
		{
			name:     "not yet valid node certificate is refused",
			edgeCert: edgeCert, nodeCert: ptr(issue(t, ca, quicwire.NodeIdentity(td, "node-1"), pki.Options{NotBefore: now.Add(time.Hour)})),
			wantEdgeRefusal: quicwire.ErrCertificateExpired,
		},
		{
			name:     "edge identity presented by a node is refused",
			edgeCert: edgeCert, nodeCert: ptr(issue(t, ca, quicwire.EdgeIdentity(td, "edge-2"), pki.Options{})),
			wantEdgeRefusal: quicwire.ErrWrongKind,
		},
		{
			name:     "node of another trust domain is refused even by a CA the Edge trusts",
			edgeCert: edgeCert, nodeCert: ptr(issue(t, otherTD, quicwire.NodeIdentity("other.example", "node-1"), pki.Options{})),
			edgeTrust:       pool(ca, otherTD),
			wantEdgeRefusal: quicwire.ErrWrongTrustDomain,
		},
		{
			name:     "node without a certificate is refused",
			edgeCert: edgeCert, nodeCert: nil,
			wantEdgeRefusal: quicwire.ErrNoIdentity,
		},
		{
			name:     "node refuses an edge from a foreign CA",
			edgeCert: issue(t, foreign, quicwire.EdgeIdentity(td, "edge-1"), pki.Options{}), nodeCert: &nodeCert,
			wantNodeRefusal: quicwire.ErrUnknownAuthority,
		},
		{
			name:     "node refuses an edge presenting a node identity",
			edgeCert: issue(t, ca, quicwire.NodeIdentity(td, "edge-1"), pki.Options{}), nodeCert: &nodeCert,
			wantNodeRefusal: quicwire.ErrWrongKind,
		},
		{
			name:     "node refuses an edge other than the one it expects",
			edgeCert: edgeCert, nodeCert: &nodeCert,
			wantEdge:        "edge-2",
			wantNodeRefusal: quicwire.ErrIdentityMismatch,
		},
		{
			name:     "node refuses an expired edge",
			edgeCert: issue(t, ca, quicwire.EdgeIdentity(td, "edge-1"), pki.Options{NotBefore: now.Add(-48 * time.Hour), Validity: time.Hour}), nodeCert: &nodeCert,
			wantNodeRefusal: quicwire.ErrCertificateExpired,
		},
		{
			name:      "verification uses the injected clock (synctest starts at 2000-01-01)",
			edgeCert:  issue(t, oldCA, quicwire.EdgeIdentity(td, "edge-1"), pki.Options{NotBefore: time.Date(1999, 12, 1, 0, 0, 0, 0, time.UTC)}),
			nodeCert:  ptr(issue(t, oldCA, quicwire.NodeIdentity(td, "node-1"), pki.Options{NotBefore: time.Date(1999, 12, 1, 0, 0, 0, 0, time.UTC)})),
			edgeTrust: pool(oldCA), nodeTrust: pool(oldCA),
			now: func() time.Time { return y2k },
		},
		{
			name:            "certificates of 1999 are expired on the wall clock",
			edgeCert:        edgeCert,
			nodeCert:        ptr(issue(t, oldCA, quicwire.NodeIdentity(td, "node-1"), pki.Options{NotBefore: time.Date(1999, 12, 1, 0, 0, 0, 0, time.UTC)})),
			edgeTrust:       pool(ca, oldCA),
			wantEdgeRefusal: quicwire.ErrCertificateExpired,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			edgeTrust, nodeTrust := tt.edgeTrust, tt.nodeTrust
			if edgeTrust == nil {
				edgeTrust = ca.Pool()
			}
			if nodeTrust == nil {
				nodeTrust = ca.Pool()
			}
			var log rejectLog
			edgeCfg := quicwire.EdgeTLSConfig(edgeTrust, tt.edgeCert, td, tt.now, log.onReject)
			var nodeCfg *tls.Config
			if tt.nodeCert != nil {
				nodeCfg = quicwire.NodeTLSConfig(nodeTrust, *tt.nodeCert, td, tt.wantEdge, tt.now)
			} else {
				nodeCfg = &tls.Config{InsecureSkipVerify: true, NextProtos: []string{quicwire.ALPN}, MinVersion: tls.VersionTLS13}
			}
			server, client := tcpPair(t)
			r := handshake(t, edgeCfg, nodeCfg, server, client)

			switch {
			case tt.wantEdgeRefusal != nil:
				if !errors.Is(r.edgeErr, tt.wantEdgeRefusal) {
					t.Fatalf("edge error = %v, want %v", r.edgeErr, tt.wantEdgeRefusal)
				}
				t.Logf("edge: refused node connection from %s: %v", log.remotes[0], r.edgeErr)
				var idErr *quicwire.IdentityError
				if !errors.As(r.edgeErr, &idErr) {
					t.Errorf("edge error %T is not an *IdentityError", r.edgeErr)
				}
				if len(log.errs) != 1 || !errors.Is(log.errs[0], tt.wantEdgeRefusal) {
					t.Fatalf("onReject got %v, want one %v", log.errs, tt.wantEdgeRefusal)
				}
				if log.remotes[0] != client.LocalAddr().String() {
					t.Errorf("onReject remote = %q, want %q", log.remotes[0], client.LocalAddr())
				}
				// The Node learns of the refusal from the Edge's alert.
				if r.nodeErr == nil {
					t.Fatal("node error = nil, want the Edge's refusal")
				}
				if d := quicwire.DescribeHandshakeError(r.nodeErr); !strings.Contains(d.Error(), "the Edge refused this Node's certificate") {
					t.Errorf("described node error = %q", d)
				}
			case tt.wantNodeRefusal != nil:
				if !errors.Is(r.nodeErr, tt.wantNodeRefusal) {
					t.Fatalf("node error = %v, want %v", r.nodeErr, tt.wantNodeRefusal)
				}
				t.Logf("node: %v", quicwire.DescribeHandshakeError(r.nodeErr))
				if d := quicwire.DescribeHandshakeError(r.nodeErr); !strings.Contains(d.Error(), "this Node refused the Edge's certificate") || !errors.Is(d, tt.wantNodeRefusal) {
					t.Errorf("described node error = %q", d)
				}
				if r.edgeErr == nil {
					t.Error("edge error = nil, want the Node's alert")
				}
				if len(log.errs) != 0 {
					t.Errorf("onReject called for a refusal by the Node: %v", log.errs)
				}
			default:
				if r.edgeErr != nil || r.nodeErr != nil {
					t.Fatalf("handshake failed: edge %v, node %v", r.edgeErr, r.nodeErr)
				}
				got, err := quicwire.PeerIdentity(r.edgeState)
				if err != nil || got != quicwire.NodeIdentity(td, "node-1") {
					t.Errorf("edge PeerIdentity = %v, %v; want node-1", got, err)
				}
				got, err = quicwire.PeerIdentity(r.nodeState)
				if err != nil || got != quicwire.EdgeIdentity(td, "edge-1") {
					t.Errorf("node PeerIdentity = %v, %v; want edge-1", got, err)
				}
				if r.edgeState.NegotiatedProtocol != quicwire.ALPN {
					t.Errorf("ALPN = %q, want %q", r.edgeState.NegotiatedProtocol, quicwire.ALPN)
				}
				if len(log.errs) != 0 {
					t.Errorf("onReject called on success: %v", log.errs)
				}
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

// TestManagedHandshakeInsideSynctestBubble: tests of other packages run in
// testing/synctest, whose clock starts at 2000-01-01; with now nil the
// configs follow that clock (S3 must hold under the fake clock too).
func TestManagedHandshakeInsideSynctestBubble(t *testing.T) {
	ca := newCA(t, td, pki.Options{NotBefore: time.Date(1999, 6, 1, 0, 0, 0, 0, time.UTC), Validity: 2 * 365 * 24 * time.Hour})
	edgeCert := issue(t, ca, quicwire.EdgeIdentity(td, "edge-1"), pki.Options{NotBefore: time.Date(1999, 12, 1, 0, 0, 0, 0, time.UTC)})
	nodeCert := issue(t, ca, quicwire.NodeIdentity(td, "node-1"), pki.Options{NotBefore: time.Date(1999, 12, 1, 0, 0, 0, 0, time.UTC)})
	synctest.Test(t, func(t *testing.T) {
		server, client := net.Pipe()
		r := handshake(t,
			quicwire.EdgeTLSConfig(ca.Pool(), edgeCert, td, nil, nil),
			quicwire.NodeTLSConfig(ca.Pool(), nodeCert, td, "edge-1", nil),
			server, client)
		if r.edgeErr != nil || r.nodeErr != nil {
			t.Fatalf("handshake at %v failed: edge %v, node %v", time.Now(), r.edgeErr, r.nodeErr)
		}
		if got, _ := quicwire.PeerIdentity(r.edgeState); got.ID != "node-1" {
			t.Errorf("edge PeerIdentity = %v, want node-1", got)
		}
	})
}

// TestLoopbackModeHandshakes: loopback mode encrypts without identity, for
// a single machine without a CA.
func TestLoopbackModeHandshakes(t *testing.T) {
	edgeCfg, err := quicwire.LoopbackEdgeTLSConfig()
	if err != nil {
		t.Fatal(err)
	}
	server, client := tcpPair(t)
	r := handshake(t, edgeCfg, quicwire.LoopbackNodeTLSConfig(), server, client)
	if r.edgeErr != nil || r.nodeErr != nil {
		t.Fatalf("handshake failed: edge %v, node %v", r.edgeErr, r.nodeErr)
	}
	if _, err := quicwire.PeerIdentity(r.edgeState); !errors.Is(err, quicwire.ErrNoIdentity) {
		t.Errorf("PeerIdentity in loopback mode = %v, want ErrNoIdentity", err)
	}
}

func TestIsLoopbackAddrAcceptsOnlyLiteralLoopback(t *testing.T) {
	tests := map[string]bool{
		"127.0.0.1:7000": true,
		"127.1.2.3:7000": true,
		"[::1]:7000":     true,
		"localhost:7000": true,
		"LOCALHOST:7000": true,
		"127.0.0.1":      true,
		"::1":            true,
		":7000":          false, // all interfaces
		"0.0.0.0:7000":   false,
		"10.0.0.1:7000":  false,
		"example.com:1":  false,
		"localhost.evil": false,
		"[::]:7000":      false,
	}
	for addr, want := range tests {
		if got := quicwire.IsLoopbackAddr(addr); got != want {
			t.Errorf("IsLoopbackAddr(%q) = %v, want %v", addr, got, want)
		}
	}
}

func TestParseIdentityIsStrict(t *testing.T) {
	valid := map[string]quicwire.Identity{
		"spiffe://iop.local/node/n1":                  quicwire.NodeIdentity("iop.local", "n1"),
		"spiffe://iop.local/edge/E_1.a-b":             quicwire.EdgeIdentity("iop.local", "E_1.a-b"),
		"spiffe://a/node/" + strings.Repeat("x", 128): quicwire.NodeIdentity("a", strings.Repeat("x", 128)),
	}
	for uri, want := range valid {
		got, err := quicwire.ParseIdentity(uri)
		if err != nil || got != want {
			t.Errorf("ParseIdentity(%q) = %v, %v; want %v", uri, got, err, want)
		}
		if got.String() != uri {
			t.Errorf("%v.String() = %q, want %q", got, got.String(), uri)
		}
	}
	invalid := []string{
		"",
		"https://iop.local/node/n1",
		"SPIFFE://iop.local/node/n1",
		"spiffe://IOP.local/node/n1",
		"spiffe://iop.local:443/node/n1",
		"spiffe://iop.local:/node/n1",
		"spiffe://user@iop.local/node/n1",
		"spiffe://iop.local/node/n1?x=1",
		"spiffe://iop.local/node/n1?",
		"spiffe://iop.local/node/n1#f",
		"spiffe://iop.local/node/n1/extra",
		"spiffe://iop.local/node/",
		"spiffe://iop.local/node",
		"spiffe://iop.local/client/n1",
		"spiffe://iop.local/node/..",
		"spiffe://iop.local/node/%6E1",
		"spiffe://iop.local/node/n%201",
		"spiffe://iop.local//node/n1",
		"spiffe:///node/n1",
		"spiffe://-bad.local/node/n1",
		"spiffe://[::1]/node/n1",
		"spiffe:iop.local/node/n1",
		"spiffe://iop.local/node/" + strings.Repeat("x", 129),
	}
	for _, uri := range invalid {
		if id, err := quicwire.ParseIdentity(uri); err == nil {
			t.Errorf("ParseIdentity(%q) = %v, want an error", uri, id)
		}
	}
}

func TestIdentityFromCertWantsExactlyOneSpiffeURI(t *testing.T) {
	node := quicwire.NodeIdentity(td, "n1")
	tests := []struct {
		name string
		uris []*url.URL
		want error
	}{
		{"one spiffe URI", []*url.URL{node.URI(), {Scheme: "https", Host: "x"}}, nil},
		{"none", []*url.URL{{Scheme: "https", Host: "x"}}, quicwire.ErrNoIdentity},
		{"several", []*url.URL{node.URI(), quicwire.NodeIdentity(td, "n2").URI()}, quicwire.ErrNoIdentity},
		{"malformed", []*url.URL{{Scheme: "spiffe", Host: td, Path: "/node/a/b"}}, quicwire.ErrNoIdentity},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := quicwire.IdentityFromCert(selfSigned(t, tt.uris))
			if !errors.Is(err, tt.want) || (tt.want == nil && got != node) {
				t.Errorf("IdentityFromCert = %v, %v; want %v, %v", got, err, node, tt.want)
			}
		})
	}
}

func selfSigned(t *testing.T, uris []*url.URL) *x509.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), NotAfter: time.Now().Add(time.Hour), URIs: uris}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestDescribeHandshakeErrorNamesTheRefusingSide(t *testing.T) {
	refusedByEdge := &quic.TransportError{Remote: true, ErrorCode: 0x100 + 42}
	noALPN := &quic.TransportError{Remote: true, ErrorCode: 0x100 + 120}
	other := errors.New("timeout: no recent network activity")
	tests := []struct {
		name string
		err  error
		want string
	}{
		{"edge refused the node over QUIC", refusedByEdge, "the Edge refused this Node's certificate"},
		{"node refused the edge", &quicwire.IdentityError{Err: quicwire.ErrUnknownAuthority}, "this Node refused the Edge's certificate"},
		{"ALPN mismatch", noALPN, quicwire.ALPN},
		{"unrelated error passes through", other, other.Error()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := quicwire.DescribeHandshakeError(tt.err)
			if !strings.Contains(got.Error(), tt.want) || !errors.Is(got, tt.err) {
				t.Errorf("DescribeHandshakeError = %q, want it to contain %q and wrap the original", got, tt.want)
			}
		})
	}
	if quicwire.DescribeHandshakeError(nil) != nil {
		t.Error("DescribeHandshakeError(nil) != nil")
	}
}

func TestValidateID(t *testing.T) {
	for id, ok := range map[string]bool{
		"n1": true, "node-1.a_b": true, strings.Repeat("a", 128): true,
		"": false, ".": false, "..": false, "a/b": false, "a b": false, "é": false, strings.Repeat("a", 129): false,
	} {
		if err := quicwire.ValidateID(id); (err == nil) != ok {
			t.Errorf("ValidateID(%q) = %v, want ok=%v", id, err, ok)
		}
	}
}
