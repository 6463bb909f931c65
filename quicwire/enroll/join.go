package enroll

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"slices"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/iop-dev/iop/internal/transport"
	"github.com/iop-dev/iop/quicwire"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// JoinALPN is the TLS application protocol of a join connection. It shares
// the Edge's UDP port with quicwire.ALPN; a connection that negotiates it
// presents no client certificate and may do nothing but one join exchange.
const JoinALPN = "iop-join/1"

// MaxJoinFrameSize bounds the JoinRequest and JoinResponse frames. A CSR and a
// chain of two certificates take about 2 KiB.
const MaxJoinFrameSize = 16 << 10

// JoinTimeout bounds a whole join exchange on either side: handshake,
// request, issuing and answer.
const JoinTimeout = 15 * time.Second

// Reasons a join fails, for errors.Is. The Edge's refusals arrive as a
// *JoinError that matches one of the first four.
var (
	ErrTokenUnknown  = errors.New("the Edge does not know this token (never issued by it, or its Node was removed)")
	ErrTokenUsed     = errors.New("this token was already used: a token joins one Node, once")
	ErrTokenExpired  = errors.New("this token has expired")
	ErrUnavailable   = errors.New("the Edge cannot issue certificates")
	ErrBadRequest    = errors.New("the Edge refused the join request as malformed")
	ErrForeignEdge   = errors.New("the Edge at this address does not hold the CA this token names: the token is for another Edge, or this Edge's CA changed since it was made")
	ErrNotAnEdgeCert = errors.New("the Edge's certificate is not an edge identity signed by the token's CA")
)

// JoinError is the Edge's refusal of a join.
type JoinError struct {
	Refusal wirepb.JoinRefusal
	Detail  string
}

func (e *JoinError) Error() string {
	msg := e.reason().Error()
	if e.Detail != "" {
		msg += ": " + e.Detail
	}
	return msg
}

// Is matches the Err* reason of the refusal.
func (e *JoinError) Is(target error) bool { return target == e.reason() }

func (e *JoinError) reason() error {
	switch e.Refusal {
	case wirepb.JoinRefusal_JOIN_REFUSAL_UNKNOWN_TOKEN:
		return ErrTokenUnknown
	case wirepb.JoinRefusal_JOIN_REFUSAL_USED_TOKEN:
		return ErrTokenUsed
	case wirepb.JoinRefusal_JOIN_REFUSAL_EXPIRED_TOKEN:
		return ErrTokenExpired
	case wirepb.JoinRefusal_JOIN_REFUSAL_UNAVAILABLE:
		return ErrUnavailable
	default:
		return ErrBadRequest
	}
}

// EdgeJoinTLSConfig is the Edge's server config for join connections: it
// presents the Edge's certificate followed by the CA certificate (a joining
// Node has no CA yet: it recognises the CA by the token's hash) and asks for
// no client certificate.
func EdgeJoinTLSConfig(cert tls.Certificate, ca *x509.Certificate) *tls.Config {
	chain := tls.Certificate{
		Certificate: append(slices.Clone(cert.Certificate[:1]), ca.Raw),
		PrivateKey:  cert.PrivateKey,
		Leaf:        cert.Leaf,
	}
	return &tls.Config{
		Certificates: []tls.Certificate{chain},
		ClientAuth:   tls.NoClientCert,
		NextProtos:   []string{JoinALPN},
		MinVersion:   tls.VersionTLS13,
	}
}

// WithJoin returns a copy of the Edge's Node-facing server config that also
// accepts join connections: a client that offers JoinALPN gets join's config,
// every other client what base gives it. The wire ALPN keeps its own
// verification unchanged.
func WithJoin(base, join *tls.Config) *tls.Config {
	c := base.Clone()
	c.NextProtos = append(slices.Clone(base.NextProtos), JoinALPN)
	inner := base.GetConfigForClient
	c.GetConfigForClient = func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
		if slices.Contains(hello.SupportedProtos, JoinALPN) {
			return join.Clone(), nil // one per handshake, as base's own hook gives
		}
		if inner != nil {
			return inner(hello)
		}
		return base, nil
	}
	return c
}

// NodeJoinTLSConfig is a joining Node's client config. It trusts the Edge
// only if the chain it presents holds a CA certificate whose public key
// hashes to caHash and the Edge's own certificate is an edge identity that
// CA signed; found gets that CA. The host name plays no part, as on the wire
// (see quicwire.NodeTLSConfig).
func NodeJoinTLSConfig(caHash []byte, found func(*x509.Certificate)) *tls.Config {
	return &tls.Config{
		InsecureSkipVerify: true, // VerifyConnection below does the verification, against the token's CA
		VerifyConnection: func(cs tls.ConnectionState) error {
			ca, err := VerifyEdgeChain(cs.PeerCertificates, caHash, time.Now())
			if err != nil {
				return err
			}
			found(ca)
			return nil
		},
		NextProtos: []string{JoinALPN},
		MinVersion: tls.VersionTLS13,
	}
}

// VerifyEdgeChain finds in chain (leaf first) the CA that caHash names and
// checks that it signed the leaf, an edge identity in the CA's trust
// domain, valid at now. It returns the CA.
func VerifyEdgeChain(chain []*x509.Certificate, caHash []byte, now time.Time) (*x509.Certificate, error) {
	if len(chain) == 0 {
		return nil, fmt.Errorf("%w: it presented no certificate", ErrNotAnEdgeCert)
	}
	var ca *x509.Certificate
	for _, c := range chain[1:] {
		if c.IsCA && (Token{CAHash: caHash}).MatchesCA(c) {
			ca = c
			break
		}
	}
	if ca == nil {
		return nil, ErrForeignEdge
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	leaf := chain[0]
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNotAnEdgeCert, err)
	}
	id, err := quicwire.IdentityFromCert(leaf)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNotAnEdgeCert, err)
	}
	if id.Kind != quicwire.KindEdge {
		return nil, fmt.Errorf("%w: it is %s", ErrNotAnEdgeCert, id)
	}
	return ca, nil
}

// Joined is what a Node learns from a successful join.
type Joined struct {
	NodeID      string
	TrustDomain string
	EdgeID      string
	// Cert is the Node's certificate, CA the Edge's CA that signed it
	// (the one the token named).
	Cert *x509.Certificate
	CA   *x509.Certificate
}

// Join runs the join exchange with the Edge at addr: it sends tok's id and
// secret with csrDER (a PKCS#10 request for the key the caller made) and
// returns the certificate issued for it. The secret is sent only after the
// Edge proved it holds the token's CA. tr carries the connection.
func Join(ctx context.Context, tr *quic.Transport, addr string, tok Token, csrDER []byte, version string) (*Joined, error) {
	ctx, cancel := context.WithTimeout(ctx, JoinTimeout)
	defer cancel()
	udp, err := resolve(addr)
	if err != nil {
		return nil, err
	}
	var ca *x509.Certificate
	tlsConf := NodeJoinTLSConfig(tok.CAHash, func(c *x509.Certificate) { ca = c })
	qc, err := tr.Dial(ctx, udp, tlsConf, joinQUICConfig())
	if err != nil {
		switch {
		case errors.Is(err, ErrForeignEdge):
			return nil, fmt.Errorf("%w (the token names CA %s)", ErrForeignEdge, FormatCAHash(tok.CAHash))
		case errors.Is(err, ErrNotAnEdgeCert):
			return nil, fmt.Errorf("edge %s: %w", addr, err)
		}
		var te *quic.TransportError
		if errors.As(err, &te) && te.ErrorCode == 0x100+120 { // no_application_protocol
			return nil, fmt.Errorf("%w: the Edge at %s does not take joins (it needs data_dir in mtls mode, and enrollment.ca_key_file)", ErrUnavailable, addr)
		}
		return nil, fmt.Errorf("dial edge %s: %w", addr, quicwire.DescribeHandshakeError(err))
	}
	defer quicwire.CloseNormal.Close(qc, "")
	if qc.ConnectionState().TLS.NegotiatedProtocol != JoinALPN || ca == nil {
		return nil, fmt.Errorf("edge %s: does not accept joins (%s)", addr, qc.ConnectionState().TLS.NegotiatedProtocol)
	}
	raw, err := qc.OpenStreamSync(ctx)
	if err != nil {
		return nil, fmt.Errorf("join: %w", err)
	}
	if d, ok := ctx.Deadline(); ok {
		_ = raw.SetDeadline(d)
	}
	st := transport.NewFrameWriter(raw, MaxJoinFrameSize)
	if err := st.Write(&wirepb.JoinRequest{TokenId: tok.ID, Secret: tok.Secret, Csr: csrDER, NodeVersion: version}); err != nil {
		return nil, fmt.Errorf("join: send request: %w", err)
	}
	_ = raw.Close()
	resp := new(wirepb.JoinResponse)
	if err := transport.NewFrameReader(raw, MaxJoinFrameSize, "join").Read(resp); err != nil {
		return nil, fmt.Errorf("join: read answer: %w", err)
	}
	if resp.GetRefusal() != wirepb.JoinRefusal_JOIN_REFUSAL_UNSPECIFIED {
		return nil, &JoinError{Refusal: resp.GetRefusal(), Detail: resp.GetRefusalDetail()}
	}
	return checkJoined(resp, ca)
}

// checkJoined checks that the answer is a certificate of a node identity,
// signed by the CA the token named, for the key the Node sent.
func checkJoined(resp *wirepb.JoinResponse, ca *x509.Certificate) (*Joined, error) {
	if len(resp.GetChain()) == 0 {
		return nil, errors.New("join: the Edge sent no certificate")
	}
	leaf, err := x509.ParseCertificate(resp.GetChain()[0])
	if err != nil {
		return nil, fmt.Errorf("join: the Edge's answer: %w", err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		return nil, fmt.Errorf("join: the issued certificate does not verify against the token's CA: %w", err)
	}
	want := quicwire.NodeIdentity(resp.GetTrustDomain(), resp.GetNodeId())
	got, err := quicwire.IdentityFromCert(leaf)
	if err != nil || got != want {
		return nil, fmt.Errorf("join: the issued certificate names %v, not %s", got, want)
	}
	return &Joined{NodeID: resp.GetNodeId(), TrustDomain: resp.GetTrustDomain(), EdgeID: resp.GetEdgeId(), Cert: leaf, CA: ca}, nil
}

func joinQUICConfig() *quic.Config {
	return &quic.Config{HandshakeIdleTimeout: quicwire.HandshakeTimeout, MaxIdleTimeout: JoinTimeout}
}

func resolve(addr string) (*net.UDPAddr, error) {
	udp, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return nil, fmt.Errorf("edge address %q: %w", addr, err)
	}
	return udp, nil
}
