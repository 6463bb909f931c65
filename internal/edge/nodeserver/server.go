// Package nodeserver is the Edge's side of the Edge–Node wire: it accepts
// Node connections over QUIC, runs registration, the ready handshake and
// heartbeats on each control stream, feeds the node registry, and opens
// dispatched streams to ready Nodes.
package nodeserver

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/iop-dev/iop/internal/edge/nodes"
	"github.com/iop-dev/iop/quicwire"
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

// CredentialState is the Edge's credential revocations and disables
// (internal/edge/credentials.Store implements it).
type CredentialState interface {
	Notice() *wirepb.CredentialNotice
	Changed() <-chan struct{}
}

// Server accepts Node connections. Create it with NewServer, run Serve, and
// stop it with Shutdown.
type Server struct {
	opts Options
	reg  *nodes.Registry
	log  *slog.Logger

	mu     sync.Mutex
	conns  map[*quic.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// NewServer returns a server that records Nodes in reg.
func NewServer(opts Options, reg *nodes.Registry) *Server {
	if opts.RegisterTimeout == 0 {
		opts.RegisterTimeout = 10 * time.Second
	}
	if opts.StreamWait == 0 {
		opts.StreamWait = 5 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	return &Server{opts: opts, reg: reg, log: opts.Logger, conns: make(map[*quic.Conn]struct{})}
}

// Registry is the node registry the server feeds.
func (s *Server) Registry() *nodes.Registry { return s.reg }

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
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer s.untrack(qc)
			s.handle(ctx, qc)
		}()
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

// handle runs one connection: registration, then the control loop. When it
// returns, the connection's generation is fenced and the connection closed.
func (s *Server) handle(ctx context.Context, qc *quic.Conn) {
	log := s.log.With("remote", qc.RemoteAddr().String())
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
	cs := quicwire.NewControlStream(st)
	req, err := s.readRegister(st, cs)
	if err == nil {
		err = s.checkRegister(req, identity)
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

	// The heartbeat exists before the registry publishes the connection: a
	// /metrics scrape or an admin read may call RTT the moment Register
	// returns. Its timeout reads conn, which is set before Run starts it.
	var conn *nodes.Conn
	hb := quicwire.NewHeartbeat(s.opts.Liveness, cs.Send, func() {
		s.reg.Fence(conn, quicwire.CloseHeartbeatTimeout,
			fmt.Sprintf("no heartbeat answer within %v", s.opts.Liveness.ResponseWait))
	})
	conn = s.reg.Register(nodes.ConnInfo{
		NodeID:     req.GetNodeId(),
		Version:    req.GetNodeVersion(),
		RemoteAddr: qc.RemoteAddr().String(),
		Identity:   identity,
		LeaseKey:   req.GetLeasePublicKey(),
		Labels:     req.GetLabels(),
		Providers:  req.GetProviders(),
		MaxStreams: int(req.GetMaxDispatchedStreams()),
		Close:      func(code quicwire.CloseCode, detail string) { code.Close(qc, detail) },
		RTT:        hb.LastRTT,
		OpenStream: qc.OpenStreamSync,
	})
	log = log.With("node", conn.NodeID(), "generation", conn.Generation())
	if err := cs.Send(&wirepb.ControlFrame{Msg: &wirepb.ControlFrame_RegisterResponse{RegisterResponse: &wirepb.RegisterResponse{
		Accepted:        true,
		Generation:      conn.Generation(),
		EdgeId:          s.opts.EdgeID,
		ProtocolVersion: quicwire.ProtocolVersion,
		LeaseSigningKey: s.opts.LeaseSigningKey,
	}}}); err != nil {
		s.fenceFor(conn, err)
		return
	}
	log.Info("node registered", "identity", identity, "version", req.GetNodeVersion())

	// Everything started here lives as long as the connection and is
	// joined before handle returns.
	hctx, stop := context.WithCancel(qc.Context())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stop()
	wg.Go(func() { hb.Run(hctx) })
	wg.Go(func() { s.watchNode(hctx, qc, conn, hb, log) })
	if s.opts.Credentials != nil {
		wg.Go(func() { s.sendNotices(hctx, conn, cs) })
	}
	err = s.controlLoop(conn, cs, hb)
	s.fenceFor(conn, err)
	code, detail, _ := conn.FenceReason()
	log.Info("node connection fenced", "reason", code.String(), "detail", detail)
}

// watchNode suspects the Node when nothing at all has come from it for
// Liveness.SuspectAfter (P4): it gets no new work, and a heartbeat goes out
// at once, whose response wait then decides the fence (R8, R9). When the
// Node is heard from again it is dispatchable again at once.
func (s *Server) watchNode(ctx context.Context, qc *quic.Conn, conn *nodes.Conn, hb *quicwire.Heartbeat, log *slog.Logger) {
	w := quicwire.SilenceWatch{
		After:   s.opts.Liveness.SuspectAfter(),
		Packets: func() uint64 { return qc.ConnectionStats().PacketsReceived },
		OnSuspect: func(silent time.Duration) {
			s.reg.MarkSuspect(conn, silent)
			log.Warn("node suspect", "silent_for", silent.Round(time.Millisecond))
			hb.Probe()
		},
		OnHeard: func() {
			s.reg.ClearSuspect(conn)
			log.Info("node heard from again")
		},
	}
	w.Run(ctx)
}

// sendNotices tells the Node the credential state now, and again at every
// change, until ctx ends. It goes out right after registration, before the
// ready handshake, so the Node knows every revocation before its first
// lease.
func (s *Server) sendNotices(ctx context.Context, conn *nodes.Conn, cs *quicwire.ControlStream) {
	for {
		changed := s.opts.Credentials.Changed()
		n := s.opts.Credentials.Notice()
		if err := cs.Send(&wirepb.ControlFrame{Msg: &wirepb.ControlFrame_CredentialNotice{CredentialNotice: n}}); err != nil {
			return
		}
		s.log.Debug("credential notice sent", "node", conn.NodeID(), "generation", conn.Generation())
		select {
		case <-ctx.Done():
			return
		case <-changed:
		}
	}
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

func (s *Server) readRegister(st *quic.Stream, cs *quicwire.ControlStream) (*wirepb.RegisterRequest, error) {
	_ = st.SetReadDeadline(time.Now().Add(s.opts.RegisterTimeout))
	defer st.SetReadDeadline(time.Time{})
	f, err := cs.Recv()
	if err != nil {
		return nil, fmt.Errorf("reading registration: %w", err)
	}
	req := f.GetRegisterRequest()
	if req == nil {
		return nil, &quicwire.ProtocolError{Stream: "control", Err: fmt.Errorf("%w: %T before registration", quicwire.ErrUnexpectedFrame, f.GetMsg())}
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

// controlLoop serves the control stream of a registered connection until it
// ends, and returns why.
func (s *Server) controlLoop(conn *nodes.Conn, cs *quicwire.ControlStream, hb *quicwire.Heartbeat) error {
	for {
		f, err := cs.Recv()
		if err != nil {
			return err
		}
		switch m := f.GetMsg().(type) {
		case *wirepb.ControlFrame_Heartbeat:
			if err := cs.Send(quicwire.AckFor(m.Heartbeat)); err != nil {
				return err
			}
		case *wirepb.ControlFrame_HeartbeatAck:
			hb.Acked(m.HeartbeatAck.GetSeq())
		case *wirepb.ControlFrame_ReadyRequest:
			if err := s.reg.MarkReady(conn, m.ReadyRequest.GetGeneration(), m.ReadyRequest.GetProviders()); err != nil {
				return &quicwire.ProtocolError{Stream: "control", Err: fmt.Errorf("%w: %v", quicwire.ErrUnexpectedFrame, err)}
			}
			if err := cs.Send(&wirepb.ControlFrame{Msg: &wirepb.ControlFrame_ReadyResponse{
				ReadyResponse: &wirepb.NodeReadyResponse{Generation: conn.Generation()},
			}}); err != nil {
				return err
			}
			s.log.Info("node ready", "node", conn.NodeID(), "generation", conn.Generation())
		case *wirepb.ControlFrame_ProviderStatus:
			s.reg.UpdateProviders(conn, m.ProviderStatus.GetProviders(), m.ProviderStatus.GetHealthObservationSeq())
		case *wirepb.ControlFrame_Drain:
			s.reg.MarkDraining(conn)
			s.log.Info("node draining", "node", conn.NodeID(), "generation", conn.Generation(), "reason", m.Drain.GetReason())
			go s.closeWhenDrained(conn)
		default:
			return &quicwire.ProtocolError{Stream: "control", Err: fmt.Errorf("%w: %T from a node", quicwire.ErrUnexpectedFrame, m)}
		}
	}
}

// fenceFor fences conn for the error that ended its control loop.
func (s *Server) fenceFor(conn *nodes.Conn, err error) {
	var pe *quicwire.ProtocolError
	switch {
	case errors.As(err, &pe):
		s.reg.Fence(conn, quicwire.CloseProtocolError, pe.Error())
	case errors.Is(err, io.EOF):
		s.reg.Fence(conn, quicwire.CloseProtocolError, "node closed the control stream")
	default:
		if cc, ok := quicwire.CloseReason(err); ok {
			detail := cc.Detail
			if cc.Transport != nil {
				detail = cc.Transport.Error()
			}
			s.reg.Fence(conn, cc.Code, detail)
			return
		}
		s.reg.Fence(conn, quicwire.CloseInternal, err.Error())
	}
}

// closeWhenDrained closes a draining generation with shutdown once every
// stream dispatched on it is finished. The Edge closes, not the Node,
// because the Edge is the side that has read every last frame: a close by
// the Node could discard results still in flight.
func (s *Server) closeWhenDrained(conn *nodes.Conn) {
	select {
	case <-conn.StreamsIdle():
		s.reg.Fence(conn, quicwire.CloseShutdown, "drained")
	case <-conn.Fenced():
	}
}
