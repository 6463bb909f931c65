package quicwire

// Workload identity of the Edge–Node wire (S3).
//
// In managed mode the Edge and every Node hold a certificate issued by one
// CA (see package quicwire/pki). Each certificate names its holder in a
// single SPIFFE URI SAN, spiffe://TRUST-DOMAIN/KIND/ID, and both sides of the
// QUIC handshake verify the other's chain and identity before a single frame
// is exchanged: the Edge accepts only node identities, the Node accepts only
// the edge identity it was told to expect. DNS names and IP addresses play no
// part, so Nodes can dial the Edge by any address (NAT, load balancer,
// changing IPs) without weakening verification.
//
// Loopback mode exists for a single machine without a CA: transport
// encryption only, no identity. Callers must refuse it for non-loopback
// addresses (IsLoopbackAddr).

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/netip"
	"net/url"
	"regexp"
	"strings"
	"time"

	"github.com/quic-go/quic-go"
)

// ALPN is the TLS application protocol of the Edge–Node wire. Both sides
// insist on it, so a Node cannot be pointed at some other QUIC service (or the
// Edge reached by some other client) by accident.
const ALPN = "iop-wire/1"

// Identity kinds: the first path segment of an identity URI. A Node's
// certificate must never be usable as the Edge's, and vice versa.
const (
	KindNode = "node"
	KindEdge = "edge"
)

// Identity is a workload identity carried in a certificate's URI SAN:
// spiffe://TRUST-DOMAIN/KIND/ID, KIND being KindNode or KindEdge.
type Identity struct {
	TrustDomain string
	Kind        string
	ID          string
}

// NodeIdentity returns the identity of node id in trustDomain.
func NodeIdentity(trustDomain, id string) Identity {
	return Identity{TrustDomain: trustDomain, Kind: KindNode, ID: id}
}

// EdgeIdentity returns the identity of edge id in trustDomain.
func EdgeIdentity(trustDomain, id string) Identity {
	return Identity{TrustDomain: trustDomain, Kind: KindEdge, ID: id}
}

// URI returns the identity as the URL placed in a certificate's URI SAN.
func (i Identity) URI() *url.URL {
	return &url.URL{Scheme: "spiffe", Host: i.TrustDomain, Path: "/" + i.Kind + "/" + i.ID}
}

// String returns the spiffe URI of the identity.
func (i Identity) String() string { return i.URI().String() }

// Validate reports whether the identity is well formed (what ParseIdentity
// would accept).
func (i Identity) Validate() error {
	if err := ValidateTrustDomain(i.TrustDomain); err != nil {
		return err
	}
	if i.Kind != KindNode && i.Kind != KindEdge {
		return fmt.Errorf("identity kind %q: must be %q or %q", i.Kind, KindNode, KindEdge)
	}
	return ValidateID(i.ID)
}

var (
	idPattern = regexp.MustCompile(`^[A-Za-z0-9._-]{1,128}$`)
	// A trust domain is a lowercase DNS-like name: dot-separated labels of
	// letters, digits and inner hyphens.
	trustDomainPattern = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$`)
)

// ValidateID reports whether id is a valid node or edge id:
// 1–128 characters of [A-Za-z0-9._-], and not "." or "..". Ids become URI
// path segments and file names (node-ID.pem), so dot segments are refused.
func ValidateID(id string) error {
	if !idPattern.MatchString(id) || id == "." || id == ".." {
		return fmt.Errorf("invalid id %q: want 1-128 characters of A-Z a-z 0-9 . _ - (and not . or ..)", id)
	}
	return nil
}

// ValidateTrustDomain reports whether td is a valid trust domain: a
// lowercase DNS-like name of at most 253 characters, without a port.
func ValidateTrustDomain(td string) error {
	if len(td) > 253 || !trustDomainPattern.MatchString(td) {
		return fmt.Errorf("invalid trust domain %q: want a lowercase DNS-like name such as iop.local", td)
	}
	return nil
}

// ParseIdentity parses a spiffe://TRUST-DOMAIN/KIND/ID URI strictly: the
// scheme must be spiffe, there must be no port, userinfo, query or fragment,
// and the path must be exactly /node/ID or /edge/ID. Strictness matters
// because the identity is compared by value: two spellings of one identity
// must not exist.
func ParseIdentity(uri string) (Identity, error) {
	u, err := url.Parse(uri)
	if err != nil {
		return Identity{}, fmt.Errorf("parse identity %q: %w", uri, err)
	}
	bad := func(why string) (Identity, error) {
		return Identity{}, fmt.Errorf("parse identity %q: %s", uri, why)
	}
	switch {
	case u.Scheme != "spiffe":
		return bad("scheme must be spiffe")
	case u.Opaque != "":
		return bad("want spiffe://TRUST-DOMAIN/KIND/ID")
	case u.User != nil:
		return bad("userinfo not allowed")
	case u.Port() != "" || strings.HasSuffix(u.Host, ":"):
		return bad("port not allowed")
	case u.RawQuery != "" || u.ForceQuery:
		return bad("query not allowed")
	case u.Fragment != "" || strings.Contains(uri, "#"):
		return bad("fragment not allowed")
	case u.RawPath != "":
		return bad("escaped characters not allowed in path")
	}
	if err := ValidateTrustDomain(u.Host); err != nil {
		return Identity{}, fmt.Errorf("parse identity %q: %w", uri, err)
	}
	kind, id, ok := strings.Cut(strings.TrimPrefix(u.Path, "/"), "/")
	if !ok || !strings.HasPrefix(u.Path, "/") || (kind != KindNode && kind != KindEdge) {
		return bad("path must be /node/ID or /edge/ID")
	}
	if err := ValidateID(id); err != nil {
		return Identity{}, fmt.Errorf("parse identity %q: %w", uri, err)
	}
	ident := Identity{TrustDomain: u.Host, Kind: kind, ID: id}
	if ident.String() != uri {
		// Catches what the checks above let through, e.g. an upper-case
		// scheme that url.Parse folds silently.
		return bad("not in canonical form " + ident.String())
	}
	return ident, nil
}

// IdentityFromCert returns the identity in the single spiffe URI SAN of c.
// A certificate with no spiffe URI, or with several, carries no identity:
// several would let one certificate act as more than one workload.
func IdentityFromCert(c *x509.Certificate) (Identity, error) {
	var found []*url.URL
	for _, u := range c.URIs {
		if strings.EqualFold(u.Scheme, "spiffe") {
			found = append(found, u)
		}
	}
	switch len(found) {
	case 0:
		return Identity{}, fmt.Errorf("%w: certificate has no spiffe URI SAN", ErrNoIdentity)
	case 1:
		id, err := ParseIdentity(found[0].String())
		if err != nil {
			return Identity{}, fmt.Errorf("%w: %w", ErrNoIdentity, err)
		}
		return id, nil
	default:
		return Identity{}, fmt.Errorf("%w: certificate has %d spiffe URI SANs, want exactly one", ErrNoIdentity, len(found))
	}
}

// Reasons a peer's certificate is refused. They are wrapped in an
// *IdentityError; test with errors.Is.
var (
	ErrUnknownAuthority   = errors.New("certificate is not signed by the trusted CA")
	ErrCertificateExpired = errors.New("certificate is expired or not yet valid")
	ErrWrongTrustDomain   = errors.New("identity is in the wrong trust domain")
	ErrWrongKind          = errors.New("identity is of the wrong kind")
	ErrNoIdentity         = errors.New("certificate carries no workload identity")
	ErrIdentityMismatch   = errors.New("identity is not the expected one")
	// ErrInvalidCertificate covers the remaining verification failures: a
	// malformed certificate or one not valid for this use (key usage).
	ErrInvalidCertificate = errors.New("certificate is not valid for this use")
)

// IdentityError is the refusal of a peer's certificate during the handshake.
type IdentityError struct {
	// Peer is what the peer presented: its (unverified) spiffe URI, else
	// its certificate subject; empty when it presented no certificate.
	Peer string
	// Err wraps one of the Err* reasons, with detail.
	Err error
}

// Error gives the reason followed by what the peer presented, so a log line
// tells an operator which certificate to fix.
func (e *IdentityError) Error() string {
	if e.Peer == "" {
		return e.Err.Error()
	}
	return fmt.Sprintf("%v (presented %s)", e.Err, e.Peer)
}

// Unwrap returns the reason, so errors.Is(err, ErrCertificateExpired) works.
func (e *IdentityError) Unwrap() error { return e.Err }

// peerRequirement is what one side demands of the other's certificate.
type peerRequirement struct {
	ca          *x509.CertPool
	trustDomain string
	kind        string
	id          string // "" accepts any id of kind
	usage       x509.ExtKeyUsage
	now         func() time.Time
}

// verify checks the presented chain and identity. It is the single place
// both sides' verification happens, so Edge and Node refuse for the same
// reasons with the same errors.
func (r peerRequirement) verify(certs []*x509.Certificate) (Identity, error) {
	if len(certs) == 0 {
		return Identity{}, &IdentityError{Err: fmt.Errorf("%w: no certificate presented", ErrNoIdentity)}
	}
	leaf := certs[0]
	refuse := func(err error) (Identity, error) {
		return Identity{}, &IdentityError{Peer: describeCert(leaf), Err: err}
	}
	now := r.now()
	inter := x509.NewCertPool()
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	_, err := leaf.Verify(x509.VerifyOptions{
		Roots:         r.ca,
		Intermediates: inter,
		CurrentTime:   now,
		KeyUsages:     []x509.ExtKeyUsage{r.usage},
	})
	if err != nil {
		return refuse(classifyVerifyError(err, leaf, now))
	}
	id, err := IdentityFromCert(leaf)
	switch {
	case err != nil:
		return refuse(err)
	case id.TrustDomain != r.trustDomain:
		return refuse(fmt.Errorf("%w: got %q, want %q", ErrWrongTrustDomain, id.TrustDomain, r.trustDomain))
	case id.Kind != r.kind:
		return refuse(fmt.Errorf("%w: got %q, want %q", ErrWrongKind, id.Kind, r.kind))
	case r.id != "" && id.ID != r.id:
		return refuse(fmt.Errorf("%w: got %s %q, want %q", ErrIdentityMismatch, id.Kind, id.ID, r.id))
	}
	return id, nil
}

// classifyVerifyError maps an x509 verification error to one of the Err*
// reasons, keeping the original in the chain for errors.As.
func classifyVerifyError(err error, leaf *x509.Certificate, now time.Time) error {
	var unknown x509.UnknownAuthorityError
	if errors.As(err, &unknown) {
		return fmt.Errorf("%w (%w)", ErrUnknownAuthority, err)
	}
	var invalid x509.CertificateInvalidError
	if errors.As(err, &invalid) && invalid.Reason == x509.Expired {
		c := invalid.Cert
		if c == nil {
			c = leaf
		}
		which := "certificate"
		if c.IsCA {
			which = "CA certificate"
		}
		stamp := func(t time.Time) string { return t.UTC().Format(time.RFC3339) }
		if now.Before(c.NotBefore) {
			return fmt.Errorf("%w: %s not valid until %s (now %s)", ErrCertificateExpired, which, stamp(c.NotBefore), stamp(now))
		}
		return fmt.Errorf("%w: %s expired at %s (now %s)", ErrCertificateExpired, which, stamp(c.NotAfter), stamp(now))
	}
	return fmt.Errorf("%w (%w)", ErrInvalidCertificate, err)
}

// describeCert names what a peer presented, for error messages only.
func describeCert(c *x509.Certificate) string {
	for _, u := range c.URIs {
		if strings.EqualFold(u.Scheme, "spiffe") {
			return u.String()
		}
	}
	return fmt.Sprintf("certificate %q", c.Subject.String())
}

// nowOrDefault returns now, or time.Now when now is nil.
func nowOrDefault(now func() time.Time) func() time.Time {
	if now == nil {
		return time.Now
	}
	return now
}

// EdgeTLSConfig is the Edge's server config in managed mode (S3). It
// presents cert, requires a client certificate chaining to ca (valid for
// client auth at now()), and requires a node identity in trustDomain.
//
// The client certificate is requested rather than required by crypto/tls and
// all verification happens in VerifyConnection: that way a refusal always
// carries a precise typed reason (including "no certificate presented"),
// rather than a generic alert from inside crypto/tls. Every refusal is also
// reported to onReject (if non-nil) with the peer's address, so the Edge can
// log "refused node connection from ADDR: ..."; it is called from
// handshake goroutines, possibly concurrently. VerifyConnection also runs
// on resumed sessions, so resumption never skips the check.
func EdgeTLSConfig(ca *x509.CertPool, cert tls.Certificate, trustDomain string, now func() time.Time, onReject func(remote string, err error)) *tls.Config {
	now = nowOrDefault(now)
	req := peerRequirement{ca: ca, trustDomain: trustDomain, kind: KindNode, usage: x509.ExtKeyUsageClientAuth, now: now}
	base := &tls.Config{
		Certificates: []tls.Certificate{cert},
		ClientAuth:   tls.RequestClientCert,
		NextProtos:   []string{ALPN},
		MinVersion:   tls.VersionTLS13,
		Time:         now,
	}
	verifyFrom := func(remote string) func(tls.ConnectionState) error {
		return func(cs tls.ConnectionState) error {
			_, err := req.verify(cs.PeerCertificates)
			if err != nil && onReject != nil {
				onReject(remote, err)
			}
			return err
		}
	}
	base.VerifyConnection = verifyFrom("")
	// GetConfigForClient is the one hook that sees the remote address (quic-go
	// fills ClientHelloInfo.Conn with one), so each connection gets a config
	// whose VerifyConnection knows whom it refuses.
	base.GetConfigForClient = func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
		remote := ""
		if hello.Conn != nil && hello.Conn.RemoteAddr() != nil {
			remote = hello.Conn.RemoteAddr().String()
		}
		c := base.Clone()
		c.GetConfigForClient = nil
		c.VerifyConnection = verifyFrom(remote)
		return c, nil
	}
	return base
}

// NodeTLSConfig is the Node's client config in managed mode (S3). It
// presents cert and accepts only an Edge whose chain verifies against ca (for
// server auth, at now()) and whose URI SAN is an edge identity in trustDomain,
// equal to edgeID when edgeID != "".
//
// InsecureSkipVerify is set because crypto/tls's built-in verification
// checks the host name, which means nothing here: the Edge is identified by
// its spiffe URI, not by the address a Node dials. VerifyConnection, which
// crypto/tls runs on every handshake regardless of InsecureSkipVerify, does
// the full chain verification against ca plus the identity check, so
// nothing is skipped.
func NodeTLSConfig(ca *x509.CertPool, cert tls.Certificate, trustDomain, edgeID string, now func() time.Time) *tls.Config {
	return NodeTLSConfigFunc(ca, func() *tls.Certificate { return &cert }, trustDomain, edgeID, now)
}

// NodeTLSConfigFunc is NodeTLSConfig with the certificate read from cert at
// each handshake, so a renewed certificate is presented by the next
// connection without a restart.
func NodeTLSConfigFunc(ca *x509.CertPool, cert func() *tls.Certificate, trustDomain, edgeID string, now func() time.Time) *tls.Config {
	now = nowOrDefault(now)
	req := peerRequirement{ca: ca, trustDomain: trustDomain, kind: KindEdge, id: edgeID, usage: x509.ExtKeyUsageServerAuth, now: now}
	return &tls.Config{
		// Always send our certificate: crypto/tls would otherwise withhold it
		// when the server's CertificateRequest does not list our CA, and the
		// Edge would log "no certificate" instead of the real reason.
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert(), nil },
		InsecureSkipVerify:   true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			_, err := req.verify(cs.PeerCertificates)
			return err
		},
		NextProtos: []string{ALPN},
		MinVersion: tls.VersionTLS13,
		Time:       now,
	}
}

// PeerIdentity returns the identity of the peer of an established
// connection. It reads the leaf of state.PeerCertificates and does not verify
// it again: it must only be used on connections made with EdgeTLSConfig or
// NodeTLSConfig, whose handshake already verified chain and identity. The
// Edge uses it after the handshake to bind the connection to a node id.
func PeerIdentity(state tls.ConnectionState) (Identity, error) {
	if len(state.PeerCertificates) == 0 {
		return Identity{}, &IdentityError{Err: fmt.Errorf("%w: no certificate presented", ErrNoIdentity)}
	}
	leaf := state.PeerCertificates[0]
	id, err := IdentityFromCert(leaf)
	if err != nil {
		return Identity{}, &IdentityError{Peer: describeCert(leaf), Err: err}
	}
	return id, nil
}

// LoopbackEdgeTLSConfig is the Edge's server config in loopback mode: an
// ephemeral self-signed certificate and no client certificate. It gives
// encryption but no identity, so it is for a single machine only; the caller
// must refuse it unless the listen address IsLoopbackAddr.
func LoopbackEdgeTLSConfig() (*tls.Config, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("loopback certificate: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, fmt.Errorf("loopback certificate: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "IOP loopback edge"},
		// Wide validity: the Node does not verify it, and tests may run on
		// a fake clock far from the wall clock.
		NotBefore:   now.AddDate(-30, 0, 0),
		NotAfter:    now.AddDate(30, 0, 0),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:    []string{"localhost"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("loopback certificate: %w", err)
	}
	return &tls.Config{
		Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}},
		NextProtos:   []string{ALPN},
		MinVersion:   tls.VersionTLS13,
	}, nil
}

// LoopbackNodeTLSConfig is the Node's client config in loopback mode: it
// does not verify the Edge. The caller must refuse it unless the Edge address
// IsLoopbackAddr.
func LoopbackNodeTLSConfig() *tls.Config {
	return &tls.Config{
		InsecureSkipVerify: true, // loopback mode: no CA exists to verify against.
		NextProtos:         []string{ALPN},
		MinVersion:         tls.VersionTLS13,
	}
}

// IsLoopbackAddr reports whether hostport (or a bare host) names the local
// machine: a literal loopback IP or "localhost". Any other name is false,
// even one that resolves to loopback, because resolution can change.
func IsLoopbackAddr(hostport string) bool {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		host = hostport
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	addr, err := netip.ParseAddr(host)
	return err == nil && addr.IsLoopback()
}

// TLS alerts that mean "your certificate was refused" (RFC 8446 §6.2).
var certificateAlerts = map[tls.AlertError]bool{
	42: true, 43: true, 44: true, 45: true, 46: true, 48: true, 116: true,
}

// DescribeHandshakeError turns a TLS or QUIC handshake failure seen by the
// Node into a message that says which side refused what and what to check.
// The original error stays wrapped (%w). Errors it does not recognise are
// returned unchanged.
func DescribeHandshakeError(err error) error {
	if err == nil {
		return nil
	}
	var idErr *IdentityError
	if errors.As(err, &idErr) {
		return fmt.Errorf("this Node refused the Edge's certificate (is it signed by the CA this Node trusts, unexpired, and an edge identity in this trust domain?): %w", err)
	}
	alert, remote, ok := handshakeAlert(err)
	switch {
	case ok && remote && certificateAlerts[alert]:
		return fmt.Errorf("the Edge refused this Node's certificate (is it signed by the Edge's CA, unexpired, and does it name this node?): %w", err)
	case ok && alert == 120: // no_application_protocol
		return fmt.Errorf("the peer does not speak %s (is this address an IOP Edge?): %w", ALPN, err)
	}
	return err
}

// handshakeAlert extracts a TLS alert from a QUIC crypto error (codes
// 0x100–0x1ff carry the alert) or a TCP TLS "remote error". remote says the
// peer sent it.
func handshakeAlert(err error) (alert tls.AlertError, remote, ok bool) {
	var te *quic.TransportError
	if errors.As(err, &te) && te.ErrorCode >= 0x100 && te.ErrorCode < 0x200 {
		return tls.AlertError(te.ErrorCode - 0x100), te.Remote, true
	}
	var ae tls.AlertError
	if errors.As(err, &ae) {
		return ae, false, true
	}
	// Over TCP crypto/tls reports a received alert as a *net.OpError with Op
	// "remote error" wrapping an unexported alert type, so match its text.
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "remote error" && op.Err != nil {
		for a := range certificateAlerts {
			if op.Err.Error() == a.Error() {
				return a, true, true
			}
		}
		if op.Err.Error() == tls.AlertError(120).Error() {
			return 120, true, true
		}
	}
	return 0, false, false
}
