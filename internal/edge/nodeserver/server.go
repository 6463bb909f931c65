// Package nodeserver is the Edge's side of the Edge–Node wire: it accepts
// Node connections over QUIC, runs registration, the ready handshake and
// heartbeats on each control stream, feeds the node registry, and opens
// dispatched streams to ready Nodes.
package nodeserver

import (
	"context"
	"crypto/ed25519"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/iop-dev/iop/internal/edge/fleet"
	"github.com/iop-dev/iop/internal/transport"
	"github.com/iop-dev/iop/quicwire"
	"github.com/iop-dev/iop/quicwire/enroll"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// Options configure a Server.
type Options struct {
	// EdgeID names this Edge in registration responses.
	EdgeID string
	// Liveness is the heartbeat profile; daemons use quicwire.DefaultLiveness.
	Liveness quicwire.Liveness
	// Managed requires a CA-verified node identity whose id equals the
	// registered node id (S3). Without it (loopback mode) only connections
	// from loopback addresses are accepted.
	Managed bool
	// TrustDomain is the SPIFFE trust domain of node identities (managed).
	TrustDomain string
	// LeaseSigningKey is the Ed25519 key Nodes learn at registration to
	// check sealed leases.
	LeaseSigningKey ed25519.PublicKey
	// Credentials, if set, is the state of credentials and profiles that
	// every connected Node is told on its control stream (CredentialNotice):
	// right after registration, and again at every change.
	Credentials CredentialState
	// RegisterTimeout bounds the wait for the control stream and the
	// RegisterRequest after the handshake. Default 10 s.
	RegisterTimeout time.Duration
	// StreamWait bounds how long a dispatch waits for a free stream on a
	// Node's connection (see ErrStreamWait). Default 5 s.
	StreamWait time.Duration
	// Enrollment, if set, serves join connections (ALPN enroll.JoinALPN),
	// checks every Node certificate against its revocations, and renews
	// certificates on the control stream. Managed mode only.
	Enrollment Enrollment
	// Directory, if set, is the cluster's Edge list, which every Node is
	// told at registration and, if it keeps connections to every Edge
	// (RegisterRequest.cluster_aware), again at every change (cluster.go).
	// Nil: this Edge alone; Nodes are sent an empty list and keep the
	// addresses they were configured with.
	Directory EdgeDirectory
	// Refused, if set, records refused connections and registrations
	// (counted, and logged without flooding: frontdoor.Refusals);
	// otherwise each is logged at Warn.
	Refused Refuser
	Logger  *slog.Logger
}

// Refuser records a refusal of kind with its message and log attributes.
type Refuser interface {
	Refuse(kind, msg string, args ...any)
}

// refuse records a refused connection or registration.
func (s *Server) refuse(kind, msg string, args ...any) {
	if s.opts.Refused != nil {
		s.opts.Refused.Refuse(kind, msg, args...)
		return
	}
	s.log.Warn(msg, args...)
}

// Enrollment is the Edge's Node enrollment (internal/edge/registrar.Service
// implements it).
type Enrollment interface {
	// ServeJoin serves one unauthenticated join connection until it ends.
	ServeJoin(ctx context.Context, qc *quic.Conn)
	// Admit refuses a verified Node certificate that was revoked, or whose
	// Node was removed.
	Admit(nodeID string, leaf *x509.Certificate) error
	// Check is Admit without recording anything.
	Check(nodeID string, leaf *x509.Certificate) error
	// Renews reports whether Renew can issue certificates.
	Renews() bool
	// Renew issues a new certificate for nodeID's key in csrDER; the chain
	// is the certificate, then the CA.
	Renew(nodeID string, csrDER []byte) ([][]byte, error)
}

// CredentialState is the Edge's credential revocations and disables
// (internal/edge/credentials.Store implements it).
type CredentialState interface {
	Notice() *wirepb.CredentialNotice
	Changed() <-chan struct{}
}

// Server accepts Node connections. Create it with NewServer, run Serve, and
// stop it with Shutdown.
type Server struct {
	// Set by NewServer, never changed.
	opts Options
	reg  *fleet.Registry
	log  *slog.Logger

	mu sync.Mutex
	// conns holds every accepted connection until its handler returned,
	// so Shutdown can close it, registered or not. Guarded by mu.
	conns map[*quic.Conn]struct{}
	// closed: Shutdown began; a connection accepted now is closed at once.
	// Guarded by mu.
	closed bool
	// wg counts the handlers (one per connection); Shutdown waits for it.
	wg sync.WaitGroup
	// stopping is closed by Stopping, which sets stopReason; each
	// cluster-aware Node's connection tells its Node then (cluster.go).
	// Guarded by mu.
	stopping   chan struct{}
	stopReason string
	// busyRefusals counts the streams Nodes refused busy (BusyRefusals).
	busyRefusals atomic.Int64
}

// NewServer returns a server that records Nodes in reg.
func NewServer(opts Options, reg *fleet.Registry) *Server {
	if opts.RegisterTimeout == 0 {
		opts.RegisterTimeout = 10 * time.Second
	}
	if opts.StreamWait == 0 {
		opts.StreamWait = 5 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	return &Server{opts: opts, reg: reg, log: opts.Logger, conns: make(map[*quic.Conn]struct{}), stopping: make(chan struct{})}
}

// Registry is the node registry the server feeds.
func (s *Server) Registry() *fleet.Registry { return s.reg }

// Serve accepts connections from ln until ctx is done or ln is closed.
// Each connection is handled on its own goroutine, owned by the server.
func (s *Server) Serve(ctx context.Context, ln *quic.Listener) error {
	for {
		qc, err := ln.Accept(ctx)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, quic.ErrServerClosed) {
				return nil
			}
			return fmt.Errorf("edge transport: accept: %w", err)
		}
		if !s.track(qc) {
			quicwire.CloseShutdown.Close(qc, "edge shutting down")
			continue
		}
		s.wg.Go(func() {
			defer s.untrack(qc)
			s.handle(ctx, qc)
		})
	}
}

func (s *Server) track(qc *quic.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.conns[qc] = struct{}{}
	return true
}

func (s *Server) untrack(qc *quic.Conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.conns, qc)
}

// Shutdown closes every Node connection with CloseShutdown and waits for
// their handlers, or for ctx.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.closed = true
	for qc := range s.conns {
		quicwire.CloseShutdown.Close(qc, "edge shutting down")
	}
	s.mu.Unlock()
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// refusal is a registration refused before a generation exists.
type refusal struct {
	code   quicwire.CloseCode
	reason string
}

func (r *refusal) Error() string { return r.code.String() + ": " + r.reason }

// handle runs one connection: the Node's identity and registration are
// checked here, at the door; a registered connection is then a nodeConn,
// served until its generation is fenced. When handle returns the
// connection is closed and every goroutine it started has returned.
func (s *Server) handle(ctx context.Context, qc *quic.Conn) {
	if qc.ConnectionState().TLS.NegotiatedProtocol == enroll.JoinALPN {
		if s.opts.Enrollment == nil {
			quicwire.CloseRefused.Close(qc, "this Edge does not accept joins")
			return
		}
		s.opts.Enrollment.ServeJoin(ctx, qc)
		return
	}
	identity, err := s.peerIdentity(qc)
	if err != nil {
		s.refuse("node_identity", "refused node connection", "remote", qc.RemoteAddr().String(), "err", err)
		quicwire.CloseUnauthenticated.Close(qc, err.Error())
		return
	}

	actx, cancel := context.WithTimeout(ctx, s.opts.RegisterTimeout)
	st, err := qc.AcceptStream(actx)
	cancel()
	if err != nil {
		s.refuse("registration", "node opened no control stream", "remote", qc.RemoteAddr().String(), "err", err)
		quicwire.CloseProtocolError.Close(qc, "no control stream")
		return
	}
	cs := transport.NewControlStream(st)
	req, err := s.readRegister(st, cs)
	if err == nil {
		err = s.checkRegister(req, identity)
	}
	if err == nil && s.opts.Managed && s.opts.Enrollment != nil {
		// Revocation is checked on every connection, after the identity
		// matched the registered id (S3).
		if aerr := s.opts.Enrollment.Admit(req.GetNodeId(), qc.ConnectionState().TLS.PeerCertificates[0]); aerr != nil {
			err = &refusal{quicwire.CloseUnauthenticated, aerr.Error()}
		}
	}
	if err != nil {
		var ref *refusal
		if !errors.As(err, &ref) {
			ref = &refusal{code: quicwire.CloseProtocolError, reason: err.Error()}
		}
		s.refuse("registration", "refused node registration", "remote", qc.RemoteAddr().String(), "node", req.GetNodeId(), "code", ref.code.String(), "reason", ref.reason)
		_ = cs.Send(&wirepb.ControlFrame{Msg: &wirepb.ControlFrame_RegisterResponse{RegisterResponse: &wirepb.RegisterResponse{
			RefusalReason: ref.reason, RefusalCode: uint64(ref.code), ProtocolVersion: quicwire.ProtocolVersion,
		}}})
		ref.code.Close(qc, ref.reason)
		return
	}

	c := newNodeConn(s, qc, cs, req, identity)
	if s.opts.Managed && s.opts.Enrollment != nil {
		// A removal between Admit and Register fenced the previous
		// generation, not this one: check again now that it is current.
		if err := s.opts.Enrollment.Check(req.GetNodeId(), qc.ConnectionState().TLS.PeerCertificates[0]); err != nil {
			s.reg.Fence(c.gen, quicwire.CloseUnauthenticated, err.Error())
		}
	}
	c.run()
}

// peerIdentity returns the verified workload identity of the peer, or
// "loopback" in loopback mode (after checking the address).
func (s *Server) peerIdentity(qc *quic.Conn) (string, error) {
	if !s.opts.Managed {
		if ua, ok := qc.RemoteAddr().(*net.UDPAddr); ok && !ua.IP.IsLoopback() {
			return "", fmt.Errorf("loopback mode accepts only loopback peers, not %s", ua)
		}
		return "loopback", nil
	}
	id, err := quicwire.PeerIdentity(qc.ConnectionState().TLS)
	if err != nil {
		return "", err
	}
	if id.Kind != quicwire.KindNode {
		return "", fmt.Errorf("peer identity %s is not a node identity", id)
	}
	return id.String(), nil
}

func (s *Server) readRegister(st *quic.Stream, cs *transport.ControlStream) (*wirepb.RegisterRequest, error) {
	_ = st.SetReadDeadline(time.Now().Add(s.opts.RegisterTimeout))
	defer st.SetReadDeadline(time.Time{})
	f, err := cs.Recv()
	if err != nil {
		return nil, fmt.Errorf("reading registration: %w", err)
	}
	req := f.GetRegisterRequest()
	if req == nil {
		return nil, &transport.ProtocolError{Stream: "control", Err: fmt.Errorf("%w: %T before registration", transport.ErrUnexpectedFrame, f.GetMsg())}
	}
	return req, nil
}

// checkRegister validates a registration against the connection's identity.
func (s *Server) checkRegister(req *wirepb.RegisterRequest, identity string) error {
	if v := req.GetProtocolVersion(); v != quicwire.ProtocolVersion {
		return &refusal{quicwire.CloseRefused, fmt.Sprintf("protocol version %d not supported (edge speaks %d)", v, quicwire.ProtocolVersion)}
	}
	if err := quicwire.ValidateID(req.GetNodeId()); err != nil {
		return &refusal{quicwire.CloseRefused, fmt.Sprintf("invalid node id: %v", err)}
	}
	if s.opts.Managed {
		want := quicwire.NodeIdentity(s.opts.TrustDomain, req.GetNodeId()).String()
		if identity != want {
			return &refusal{quicwire.CloseUnauthenticated, fmt.Sprintf("node id %q does not match the certificate identity %s", req.GetNodeId(), identity)}
		}
	}
	return nil
}
