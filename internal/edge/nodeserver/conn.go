package nodeserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"time"

	"github.com/quic-go/quic-go"
	"golang.org/x/sync/errgroup"

	"github.com/iop-dev/iop/internal/edge/fleet"
	"github.com/iop-dev/iop/internal/transport"
	"github.com/iop-dev/iop/quicwire"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// nodeConn is one registered Node connection: one generation, from the
// registration the Server accepted until the generation is fenced and
// every goroutine of the connection has returned. It owns the QUIC
// connection, its control stream, the heartbeat, the silence watch, the
// credential notice sender, the drain closer, and the registry entry (the
// generation) it published. On the Edge the registry entry is the
// connection's session: it holds the generation and the state bound to it.
//
// Lifetime: Server.handle makes it with newNodeConn once the registration
// checked out and calls run, which returns only when the generation is
// fenced, the connection closed, and every goroutine joined; only then
// does the Server forget the connection (untrack).
//
// Concurrency: every field is set by newNodeConn and never changes after,
// so nodeConn has no mutex of its own; what changes is guarded where it
// lives (the heartbeat's lock, the registry's lock, the control stream's
// writer lock). The registry may call the Link methods (RTT, Close,
// OpenStream) from any goroutine from the moment Register publishes the
// connection, which is before newNodeConn returns: they read only qc and
// hb, which are set before Register.
type nodeConn struct {
	srv *Server // the Edge's options, registry and logger; not owned
	// qc is the QUIC connection. Closing it (Close, or a fence, which
	// calls Close) ends the control loop and with it everything else.
	qc *quic.Conn
	// cs is the control stream. Only the control loop reads it; the loop,
	// the heartbeat and the notice sender write to it (Send serializes).
	cs *transport.ControlStream
	// hb is the Edge's heartbeat on the control stream. It exists before
	// Register publishes the connection, because RTT reads it.
	hb *transport.Heartbeat
	// gen is the registry entry: this connection's generation. Set once
	// Register returns; the Link methods never read it.
	gen *fleet.Conn
	log *slog.Logger
	// clusterAware: the Node takes ClusterUpdate and EdgeStopping frames
	// (RegisterRequest.cluster_aware).
	clusterAware bool
	// renewLog spaces the log lines of refused renewals; only the control
	// loop, which answers them, uses it.
	renewLog logEvery
}

// The registry reaches a Node's connection through its Link.
var _ fleet.Link = (*nodeConn)(nil)

// newNodeConn makes the heartbeat, then publishes the connection to the
// registry as a new generation of req's Node. Nothing runs yet.
func newNodeConn(s *Server, qc *quic.Conn, cs *transport.ControlStream, req *wirepb.RegisterRequest, identity string) *nodeConn {
	c := &nodeConn{srv: s, qc: qc, cs: cs, clusterAware: req.GetClusterAware()}
	// The timeout reads c.gen: it can fire only once run has started the
	// heartbeat, after gen is set.
	c.hb = transport.NewHeartbeat(s.opts.Liveness, cs.Send, func() {
		if c.gen.ReplacedBy() != 0 {
			// Replaced and draining: its silence is why, and
			// drainReplaced's deadline decides its end.
			return
		}
		s.reg.Fence(c.gen, quicwire.CloseHeartbeatTimeout,
			fmt.Sprintf("no heartbeat answer within %v", s.opts.Liveness.ResponseWait))
	})
	// Answers arrive on the control loop, which run starts after gen is set.
	c.hb.OnAnswer(c.answered)
	c.gen = s.reg.Register(fleet.ConnInfo{
		NodeID:     req.GetNodeId(),
		Version:    req.GetNodeVersion(),
		RemoteAddr: qc.RemoteAddr().String(),
		Identity:   identity,
		LeaseKey:   req.GetLeasePublicKey(),
		Labels:     req.GetLabels(),
		Providers:  req.GetProviders(),
		MaxStreams: int(req.GetMaxDispatchedStreams()),
		MaxRequest: int(min(req.GetMaxRequestBytes(), math.MaxInt32)),
		Link:       c,

		WakeTargets: req.GetWakeTargets(),

		DrainPrevious: req.GetDrainPreviousGeneration(),
	})
	c.log = s.log.With("remote", qc.RemoteAddr().String(), "node", c.gen.NodeID(), "generation", c.gen.Generation())
	c.log.Info("node registered", "identity", identity, "version", req.GetNodeVersion())
	sup, superseded := c.gen.Superseded()
	if superseded && sup.Drains {
		c.log.Info("node replaced its silent connection with this one; the old generation drains its streams",
			"previous_generation", sup.Previous)
	}
	if superseded && sup.Warn {
		// One Node identity in two places that keep fencing each other
		// (fleet.ContestWindow): said once a minute per Node, counted
		// every time (iop_edge_node_identity_contested_total).
		c.log.Warn("node identity contested: two connections keep superseding each other; is its certificate stolen or cloned? Revoke it (edged node remove) if the Node is not yours",
			"identity", identity, "addr", sup.Addr, "previous_addr", sup.PreviousAddr,
			"supersedes_last_minute", sup.Recent, "contested_unlogged", sup.Unwarned)
	}
	return c
}

// previousDrains reports whether registering this connection left the
// Node's previous generation to drain its streams (issue 26).
func (c *nodeConn) previousDrains() bool {
	sup, ok := c.gen.Superseded()
	return ok && sup.Drains
}

// RTT is the round trip of the last answered heartbeat (fleet.Link).
func (c *nodeConn) RTT() (time.Duration, time.Time) { return c.hb.LastRTT() }

// Close closes the QUIC connection with code (fleet.Link): the registry
// calls it when it fences the generation.
func (c *nodeConn) Close(code quicwire.CloseCode, detail string) { code.Close(c.qc, detail) }

// OpenStream opens a dispatched stream, waiting for a free stream slot for
// up to wait, until ctx is done (fleet.Link). A stream free now (nearly
// always: the scheduler grants no more slots than the limit has room for)
// costs no timer or context of its own.
func (c *nodeConn) OpenStream(ctx context.Context, wait time.Duration) (*quic.Stream, error) {
	st, err := c.qc.OpenStream()
	if !errors.As(err, new(*quic.StreamLimitReachedError)) {
		return st, err
	}
	octx, cancel := context.WithTimeoutCause(ctx, wait, fleet.ErrStreamWait)
	defer cancel()
	st, err = c.qc.OpenStreamSync(octx)
	if err != nil && ctx.Err() == nil && errors.Is(context.Cause(octx), fleet.ErrStreamWait) {
		return nil, fleet.ErrStreamWait
	}
	return st, err
}

// run answers the registration and serves the connection until it ends.
// The control loop, the heartbeat, the silence watch, the credential
// notices and the drain closer run in one errgroup; the control loop
// fences the generation when it ends (which closes the connection and so
// ends the others), and run returns once all of them have.
func (c *nodeConn) run() {
	defer func() {
		code, detail, _ := c.gen.FenceReason()
		c.log.Info("node connection fenced", "reason", code.String(), "detail", detail)
	}()
	edges := c.srv.clusterEdges()
	if err := c.cs.Send(&wirepb.ControlFrame{Msg: &wirepb.ControlFrame_RegisterResponse{RegisterResponse: &wirepb.RegisterResponse{
		Accepted:           true,
		Generation:         c.gen.Generation(),
		EdgeId:             c.srv.opts.EdgeID,
		ProtocolVersion:    quicwire.ProtocolVersion,
		LeaseSigningKey:    c.srv.opts.LeaseSigningKey,
		CertificateRenewal: c.srv.opts.Enrollment != nil && c.srv.opts.Enrollment.Renews(),
		PreviousDrains:     c.previousDrains(),
		ClusterEdges:       edges,
		BusyRefusals:       true,
	}}}); err != nil {
		c.fenceFor(err)
		return
	}

	// ctx ends when the connection closes (the fence closes it) or the
	// control loop returns, whichever comes first.
	g, ctx := errgroup.WithContext(c.qc.Context())
	g.Go(func() error { c.hb.Run(ctx); return nil })
	g.Go(func() error { c.watch(ctx); return nil })
	g.Go(func() error { c.drainReplaced(ctx); return nil })
	if c.srv.opts.Credentials != nil {
		g.Go(func() error { c.sendNotices(ctx); return nil })
	}
	if c.clusterAware {
		g.Go(func() error { c.tellCluster(ctx, edges); return nil })
	}
	g.Go(func() error {
		err := c.controlLoop(g)
		c.fenceFor(err)
		return err
	})
	_ = g.Wait() // the control loop's error, already the fence's reason
}

// controlLoop serves the control stream until it ends, and returns why.
// It runs in g, and starts the drain closer there.
func (c *nodeConn) controlLoop(g *errgroup.Group) error {
	reg := c.srv.reg
	drainClosing := false
	for {
		f, err := c.cs.Recv()
		if err != nil {
			return err
		}
		switch m := f.GetMsg().(type) {
		case *wirepb.ControlFrame_Heartbeat:
			if err := c.cs.Send(transport.AckFor(m.Heartbeat)); err != nil {
				return err
			}
		case *wirepb.ControlFrame_HeartbeatAck:
			c.hb.Acked(m.HeartbeatAck.GetSeq())
		case *wirepb.ControlFrame_ReadyRequest:
			if err := reg.MarkReady(c.gen, m.ReadyRequest.GetGeneration(), m.ReadyRequest.GetProviders()); err != nil {
				return &transport.ProtocolError{Stream: "control", Err: fmt.Errorf("%w: %v", transport.ErrUnexpectedFrame, err)}
			}
			if err := c.cs.Send(&wirepb.ControlFrame{Msg: &wirepb.ControlFrame_ReadyResponse{
				ReadyResponse: &wirepb.NodeReadyResponse{Generation: c.gen.Generation()},
			}}); err != nil {
				return err
			}
			c.log.Info("node ready")
		case *wirepb.ControlFrame_ProviderStatus:
			reg.UpdateProviders(c.gen, m.ProviderStatus.GetProviders(), m.ProviderStatus.GetHealthObservationSeq())
		case *wirepb.ControlFrame_Drain:
			reg.MarkDraining(c.gen)
			c.log.Info("node draining", "reason", m.Drain.GetReason())
			if !drainClosing {
				drainClosing = true
				g.Go(func() error { c.closeWhenDrained(); return nil })
			}
		case *wirepb.ControlFrame_CertificateRequest:
			if err := c.cs.Send(&wirepb.ControlFrame{Msg: &wirepb.ControlFrame_CertificateResponse{
				CertificateResponse: c.renew(m.CertificateRequest.GetCsr()),
			}}); err != nil {
				return err
			}
		default:
			return &transport.ProtocolError{Stream: "control", Err: fmt.Errorf("%w: %T from a node", transport.ErrUnexpectedFrame, m)}
		}
	}
}

// watch suspects the Node when nothing at all has come from it for
// Liveness.SuspectAfter (P4): it gets no new work, and a heartbeat goes out
// at once, whose response wait then decides the fence (R8, R9). When the
// Node is heard from again it stays suspect (issue 26: its packets may
// come back long before its data does) and another heartbeat goes out at
// once; the first answer to a heartbeat sent since the suspicion makes it
// dispatchable again (answered).
func (c *nodeConn) watch(ctx context.Context) {
	w := transport.SilenceWatch{
		After:   c.srv.opts.Liveness.SuspectAfter(),
		Packets: func() uint64 { return c.qc.ConnectionStats().PacketsReceived },
		OnSuspect: func(silent time.Duration) {
			c.srv.reg.MarkSuspect(c.gen, silent)
			c.log.Warn("node suspect", "silent_for", silent.Round(time.Millisecond))
			c.hb.Probe()
		},
		OnHeard: func() {
			if !c.srv.reg.MarkHeard(c.gen) {
				// A heartbeat's answer already ended the suspicion.
				c.log.Info("node heard from again")
				return
			}
			c.log.Info("node heard from again; it gets work once it answers a heartbeat")
			c.hb.ProbeNow()
		},
	}
	w.Run(ctx)
}

// answered handles the answer to a heartbeat the Edge sent at sent: one
// sent since the Node became suspect proves the data path both ways after
// the silence, and ends the suspicion.
func (c *nodeConn) answered(sent time.Time) {
	if c.gen == nil {
		return // an answer before Register returned: nothing is suspect yet
	}
	if c.srv.reg.Answered(c.gen, sent) {
		c.log.Info("node heard from again: it answered a heartbeat sent after its silence, and is dispatchable again")
	}
}

// sendNotices tells the Node the credential state now, and again at every
// change, until ctx ends. It goes out right after registration, before the
// ready handshake, so the Node knows every revocation before its first
// lease.
func (c *nodeConn) sendNotices(ctx context.Context) {
	creds := c.srv.opts.Credentials
	for {
		changed := creds.Changed()
		n := creds.Notice()
		if err := c.cs.Send(&wirepb.ControlFrame{Msg: &wirepb.ControlFrame_CredentialNotice{CredentialNotice: n}}); err != nil {
			return
		}
		c.log.Debug("credential notice sent")
		select {
		case <-ctx.Done():
			return
		case <-changed:
		}
	}
}

// closeWhenDrained closes a draining generation with shutdown once every
// stream dispatched on it is finished. The Edge closes, not the Node,
// because the Edge is the side that has read every last frame: a close by
// the Node could discard results still in flight. It returns at the fence,
// whatever its cause; the control loop fences before it returns, so this
// never outlives the connection.
func (c *nodeConn) closeWhenDrained() {
	select {
	case <-c.gen.StreamsIdle():
		c.srv.reg.Fence(c.gen, quicwire.CloseShutdown, "drained")
	case <-c.gen.Fenced():
	}
}

// drainReplaced fences the generation with superseded once a newer one
// replaced it and let it drain (fleet.Conn.Replaced; issue 26) and its
// streams are done, or when the heartbeat response wait has passed since
// the replacement: the old connection's sender resumes within its
// retransmission backoff (quic-go caps it at 60 s), well within that after
// a cut shorter than the wait. Until then its heartbeat's verdict is not
// what ends it. It returns at the connection's end, whatever its cause.
func (c *nodeConn) drainReplaced(ctx context.Context) {
	select {
	case <-ctx.Done():
		return
	case <-c.gen.Replaced():
	}
	by, wait := c.gen.ReplacedBy(), c.srv.opts.Liveness.ResponseWait
	c.log.Info("node connection replaced by a fresh one; its streams drain", "by_generation", by, "drain_wait", wait)
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-c.gen.StreamsIdle():
		c.srv.reg.Fence(c.gen, quicwire.CloseSuperseded, fmt.Sprintf("superseded by generation %d; its streams drained", by))
	case <-t.C:
		c.srv.reg.Fence(c.gen, quicwire.CloseSuperseded, fmt.Sprintf("superseded by generation %d; streams still open %v later", by, wait))
	case <-ctx.Done():
	}
}

// fenceFor fences the generation for the error that ended its control
// loop.
func (c *nodeConn) fenceFor(err error) {
	reg := c.srv.reg
	var pe *transport.ProtocolError
	switch {
	case errors.As(err, &pe):
		reg.Fence(c.gen, quicwire.CloseProtocolError, pe.Error())
	case errors.Is(err, io.EOF):
		reg.Fence(c.gen, quicwire.CloseProtocolError, "node closed the control stream")
	default:
		if cc, ok := quicwire.CloseReason(err); ok {
			detail := cc.Detail
			if cc.Transport != nil {
				detail = cc.Transport.Error()
			}
			reg.Fence(c.gen, cc.Code, detail)
			return
		}
		reg.Fence(c.gen, quicwire.CloseInternal, err.Error())
	}
}

// renew answers a Node's certificate request on its control stream: a new
// certificate of the connection's own identity, or why not. The connection
// goes on either way.
func (c *nodeConn) renew(csr []byte) *wirepb.CertificateResponse {
	e := c.srv.opts.Enrollment
	if e == nil || !e.Renews() {
		return &wirepb.CertificateResponse{Refusal: "this Edge does not renew certificates"}
	}
	chain, err := e.Renew(c.gen.NodeID(), csr)
	if err != nil {
		resp := &wirepb.CertificateResponse{Refusal: err.Error()}
		var later interface{ RetryTime() time.Time }
		if errors.As(err, &later) {
			resp.RetryAfterMs = uint64(max(time.Until(later.RetryTime()), 0).Milliseconds())
		}
		// A Node that asks again and again is told each time, and logged
		// at most once a minute per connection.
		if n, ok := c.renewLog.Allow(time.Now()); ok {
			c.log.Warn("certificate renewal refused", "err", err, "refused_since_last_log", n)
		}
		return resp
	}
	return &wirepb.CertificateResponse{Chain: chain}
}

// logEvery lets one log line through per minute, and counts the ones it
// held back in between. Not safe for concurrent use.
type logEvery struct {
	last    time.Time
	skipped int
}

// Allow reports whether a line may be logged at now, and how many were held
// back since the last one.
func (l *logEvery) Allow(now time.Time) (skipped int, ok bool) {
	if !l.last.IsZero() && now.Sub(l.last) < time.Minute {
		l.skipped++
		return 0, false
	}
	skipped, l.last, l.skipped = l.skipped, now, 0
	return skipped, true
}
