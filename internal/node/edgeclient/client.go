// Package edgeclient is the Node's side of the Edge–Node wire: it dials the
// Edge over QUIC, registers, completes the ready handshake, runs heartbeats,
// serves the streams the Edge dispatches, reconnects under a supervisor with
// backoff, and drains on shutdown.
package edgeclient

import (
	"context"
	"crypto/ed25519"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/iop-dev/iop/internal/transport"
	"github.com/iop-dev/iop/quicwire"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// Handler serves the dispatched streams of a connection. ServeStream runs on
// its own goroutine; ctx is cancelled when the connection ends (handler
// lifetimes are bound to the connection) and the handler must then return
// promptly. The client finishes both halves of st after ServeStream returns.
type Handler interface {
	ServeStream(ctx context.Context, sess *transport.Session, hdr *wirepb.StreamHeader, st *transport.Stream)
}

// Providers is what the Node reports about its providers.
type Providers interface {
	// Snapshot returns the providers as they are now.
	Snapshot() []*wirepb.Provider
	// WaitReady blocks until the providers are up, or ctx is done. The
	// ready handshake waits for it (R1).
	WaitReady(ctx context.Context) error
	// Changed returns a channel closed at the next change of Snapshot.
	Changed() <-chan struct{}
}

// Leases is the Node's lease opener as the transport feeds it: the Edge's
// lease signing key, learned at each registration over the authenticated
// connection, and the Edge's credential notices (revocations and
// disables). *lease.Opener implements it.
type Leases interface {
	SetEdgeKey(key ed25519.PublicKey)
	Apply(n *wirepb.CredentialNotice)
}

// Faults make a healthy Node misbehave on purpose, for tests of the Edge's
// liveness handling. Production code leaves Options.Faults nil.
type Faults struct {
	// SilenceHeartbeatAcks stops answering the Edge's heartbeats while
	// QUIC and everything else keep working.
	SilenceHeartbeatAcks atomic.Bool
}

// Options configure a Client.
type Options struct {
	NodeID  string
	Version string
	// EdgeAddr is the Edge's QUIC address, host:port.
	EdgeAddr string
	TLS      *tls.Config
	Liveness quicwire.Liveness
	Backoff  Backoff
	// LeasePublicKey is the X25519 key leases are sealed to.
	LeasePublicKey []byte
	// Capacity is the sum of the providers' capacities: the connection
	// accepts quicwire.DispatchedStreams(Capacity) dispatched streams at
	// once, and the Edge is told so at registration. 0: only the headroom
	// (a Node with no providers).
	Capacity int
	// MaxRequest is the largest stream header (a run or embedding request
	// with its images) the Node takes, in as many frames as it needs; the
	// Edge is told at registration and sends no larger. 0:
	// DefaultMaxRequest.
	MaxRequest int
	Labels     map[string]string
	// WakeTargets are the machines this Node can wake (issue 23), told to
	// the Edge at registration (RegisterRequest.wake_targets).
	WakeTargets []*wirepb.WakeTarget
	Providers   Providers
	Handler     Handler
	// Leases, if set, learns the Edge's signing key and credential notices.
	Leases Leases
	// Certificates, if set, is renewed on the control stream before it
	// expires, when the Edge says it renews.
	Certificates Certificates
	// RenewGate, if set, is shared by the Node's connections to several
	// Edges (cluster.go): one renews the certificate at a time, and the
	// others find it renewed.
	RenewGate *sync.Mutex
	// PacketConn, if set, carries QUIC instead of a new UDP socket (tests
	// use quic-go's simnet). The client does not close it.
	PacketConn net.PacketConn
	Logger     *slog.Logger
	Faults     *Faults
	// Edge, if set, is asked about the Edge a connection reaches, by the
	// id its certificate names (managed mode) once the handshake is done,
	// and by the id its registration answer names: an error (another
	// connection of this Node already reaches that Edge) ends the
	// connection before it registers, or right after, and the attempt
	// fails with it (cluster.go keeps one connection per Edge).
	Edge func(edgeID string) error
	// Cluster, if set, is told the cluster's Edge list at each
	// registration and at each change the Edge announces
	// (RegisterResponse.cluster_edges, ClusterUpdate).
	Cluster func(edges []*wirepb.ClusterEdge)
}

// DefaultMaxRequest is the largest request a Node takes unless configured
// (noded's limits.max_request_mib): above the Edge's default request
// limit, so the Edge's is the one a client meets.
const DefaultMaxRequest = 64 << 20

// State is where the Node's connection to the Edge is.
type State string

// Client states.
const (
	StateConnecting  State = "connecting"
	StateRegistering State = "registering"
	StateReady       State = "ready"
	StateDraining    State = "draining"
	StateStopped     State = "stopped"
)

// Status is a snapshot of the client, for health endpoints and tests.
type Status struct {
	State      State
	Generation uint64
	// Connects counts connections that registered.
	Connects int
	// LastError is why the last connection or attempt ended.
	LastError   error
	LastRTT     time.Duration
	ConnectedAt time.Time
	// EdgeID is the id of the Edge the last registration reached.
	EdgeID string
	// Stopping: the Edge said it is stopping (EdgeStopping), on the
	// current connection; its reason in StoppingReason.
	Stopping       bool
	StoppingReason string
}

// Client keeps one Node connected to the Edge. Run it with Run; stop it by
// cancelling Run's context, after Drain for a graceful stop.
type Client struct {
	opts Options
	log  *slog.Logger

	draining atomic.Bool
	// inflight counts the dispatched streams being served, for Drain's
	// log and InFlight; acceptStreams joins them.
	inflight atomic.Int64
	// winding joins connections replaced by a fresh one that drain their
	// streams in the background (serve); Run waits for them.
	winding sync.WaitGroup

	mu      sync.Mutex
	status  Status
	current *connection
	changed chan struct{}
	// lastEdge is the Edge id of the last registration (cluster.go).
	lastEdge string
}

// connection is one live connection (one generation).
type connection struct {
	qc   *quic.Conn
	cs   *transport.ControlStream
	sess *transport.Session
	hb   *transport.Heartbeat
	// streams counts the dispatched streams being served on this
	// connection: one with none left is closed at once when a fresh
	// connection replaces it, one with some drains (race.go).
	streams atomic.Int64
	// certAnswers carries the Edge's answers to certificate requests from
	// the control loop to the renewal (one request at a time).
	certAnswers chan *wirepb.CertificateResponse
	// busyRefusals: the Edge reads StreamBusy (RegisterResponse.
	// busy_refusals); the handler learns it from its stream's context.
	busyRefusals bool
}

// New checks opts and returns a client.
func New(opts Options) (*Client, error) {
	if err := quicwire.ValidateID(opts.NodeID); err != nil {
		return nil, fmt.Errorf("node transport: node id: %w", err)
	}
	if opts.EdgeAddr == "" {
		return nil, errors.New("node transport: no edge address")
	}
	if opts.TLS == nil {
		return nil, errors.New("node transport: no TLS configuration")
	}
	if opts.Liveness == (quicwire.Liveness{}) {
		opts.Liveness = quicwire.DefaultLiveness
	}
	if err := opts.Liveness.Validate(); err != nil {
		return nil, fmt.Errorf("node transport: %w", err)
	}
	if streams := quicwire.DispatchedStreams(opts.Capacity); opts.Capacity < 0 || streams > quicwire.MaxDispatchedStreams {
		return nil, fmt.Errorf("node transport: total capacity %d: a Node accepts at most %d streams", opts.Capacity, quicwire.MaxDispatchedStreams)
	}
	switch {
	case opts.MaxRequest == 0:
		opts.MaxRequest = DefaultMaxRequest
	case opts.MaxRequest < transport.OneFrameHeader:
		return nil, fmt.Errorf("node transport: max request %d bytes: a Node takes at least one frame (%d bytes)", opts.MaxRequest, transport.OneFrameHeader)
	}
	if opts.Backoff == (Backoff{}) {
		opts.Backoff = DefaultBackoff
	}
	if opts.Providers == nil {
		opts.Providers = StaticProviders(nil)
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Faults == nil {
		opts.Faults = new(Faults)
	}
	return &Client{
		opts:    opts,
		log:     opts.Logger,
		status:  Status{State: StateConnecting},
		changed: make(chan struct{}),
	}, nil
}

// Status returns the client's state now.
func (c *Client) Status() Status {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.status
	if c.current != nil {
		s.LastRTT, _ = c.current.hb.LastRTT()
	}
	return s
}

// Changed returns a channel closed at the next change of Status.
func (c *Client) Changed() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.changed
}

func (c *Client) update(f func(*Status)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	f(&c.status)
	close(c.changed)
	c.changed = make(chan struct{})
}

// Run keeps the Node connected until ctx is done: dial, register, ready,
// serve; when a connection ends, wait a backoff and dial again (R9). A
// connection that falls silent is raced by a fresh one (race.go): when the
// fresh one wins, it is served at once, with no backoff. It returns nil
// when ctx is done.
func (c *Client) Run(ctx context.Context) error {
	pc := c.opts.PacketConn
	if pc == nil {
		udp, err := net.ListenUDP("udp", nil)
		if err != nil {
			return fmt.Errorf("node transport: %w", err)
		}
		defer udp.Close()
		pc = udp
	}
	tr := &quic.Transport{Conn: pc}
	defer tr.Close()
	// Replaced connections still draining end with ctx (serve closes them
	// when it is done), before the transport closes.
	defer c.winding.Wait()

	defer c.update(func(s *Status) { s.State = StateStopped })
	attempt := 0
	var next *registered
	for ctx.Err() == nil && !c.draining.Load() {
		var (
			ready bool
			err   error
		)
		if next == nil {
			next, err = c.establish(ctx, tr, quicwire.HandshakeTimeout)
		}
		if next != nil {
			ready, next, err = c.serve(ctx, tr, next)
		}
		c.update(func(s *Status) { s.LastError = err })
		if ctx.Err() != nil || c.draining.Load() {
			if next != nil {
				quicwire.CloseShutdown.Close(next.qc, "node stopping")
			}
			break
		}
		if ready || next != nil {
			attempt = 0
		}
		if next != nil {
			// A fresh connection replaced this one: no backoff.
			continue
		}
		delay := c.opts.Backoff.Delay(attempt)
		attempt++
		c.update(func(s *Status) { s.State = StateConnecting })
		if errors.Is(err, ErrDuplicateEdge) {
			// Expected of an address in front of several Edges (cluster.go).
			c.log.Debug("edge reached through another connection; trying this address again later", "err", err, "backoff", delay)
		} else {
			c.log.Warn("edge connection ended; reconnecting", "err", err, "backoff", delay)
		}
		select {
		case <-ctx.Done():
		case <-time.After(delay):
		}
	}
	return nil
}

// RefusedError is the Edge's refusal of a registration.
type RefusedError struct {
	Code   quicwire.CloseCode
	Reason string
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("edge refused registration (%s): %s", e.Code, e.Reason)
}

// registered is a connection that completed its handshake and its
// registration, not yet served.
type registered struct {
	qc      *quic.Conn
	cs      *transport.ControlStream
	gen     uint64
	edgeKey ed25519.PublicKey
	renews  bool
	// previousDrains: the Edge lets the generation named by the
	// registration's drain_previous_generation drain (race.go).
	previousDrains bool
	edgeID         string
	busyRefusals   bool
}

// dial makes one handshake attempt, bounded by wait.
func (c *Client) dial(ctx context.Context, tr *quic.Transport, wait time.Duration) (*quic.Conn, error) {
	addr, err := net.ResolveUDPAddr("udp", c.opts.EdgeAddr)
	if err != nil {
		return nil, fmt.Errorf("resolve edge address: %w", err)
	}
	dctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	qc, err := tr.Dial(dctx, addr, c.opts.TLS, transport.NodeQUICConfig(c.opts.Liveness, c.streams()))
	if err != nil {
		return nil, fmt.Errorf("dial edge %s: %w", c.opts.EdgeAddr, quicwire.DescribeHandshakeError(err))
	}
	if c.opts.Edge != nil {
		// Managed mode: the certificate names the Edge, before this Node
		// registers there (and would supersede its other connection).
		if certs := qc.ConnectionState().TLS.PeerCertificates; len(certs) > 0 {
			if id, ierr := quicwire.IdentityFromCert(certs[0]); ierr == nil && id.Kind == quicwire.KindEdge {
				if err := c.opts.Edge(id.ID); err != nil {
					quicwire.CloseNormal.Close(qc, "")
					return nil, err
				}
			}
		}
	}
	return qc, nil
}

// registerOn registers on a connection whose handshake is done; a non-zero
// drainPrevious asks the Edge to let that generation drain rather than
// fence it (race.go). On failure it closes the connection.
func (c *Client) registerOn(ctx context.Context, qc *quic.Conn, drainPrevious uint64) (*registered, error) {
	st, err := qc.OpenStreamSync(ctx)
	if err != nil {
		quicwire.CloseNormal.Close(qc, "")
		return nil, fmt.Errorf("open control stream: %w", quicwire.DescribeHandshakeError(err))
	}
	cs := transport.NewControlStream(st)
	resp, err := c.register(st, cs, drainPrevious)
	if err != nil {
		var pe *transport.ProtocolError
		if errors.As(err, &pe) {
			quicwire.CloseProtocolError.Close(qc, pe.Error())
		} else {
			quicwire.CloseNormal.Close(qc, "")
		}
		return nil, err
	}
	if c.opts.Edge != nil && resp.GetEdgeId() != "" {
		// Loopback mode names the Edge only here.
		if err := c.opts.Edge(resp.GetEdgeId()); err != nil {
			quicwire.CloseNormal.Close(qc, "")
			return nil, err
		}
	}
	c.mu.Lock()
	c.lastEdge = resp.GetEdgeId()
	c.mu.Unlock()
	if c.opts.Cluster != nil {
		c.opts.Cluster(resp.GetClusterEdges())
	}
	return &registered{qc: qc, cs: cs, gen: resp.GetGeneration(), edgeKey: resp.GetLeaseSigningKey(),
		renews: resp.GetCertificateRenewal(), previousDrains: resp.GetPreviousDrains(),
		edgeID: resp.GetEdgeId(), busyRefusals: resp.GetBusyRefusals()}, nil
}

// establish dials and registers one connection.
func (c *Client) establish(ctx context.Context, tr *quic.Transport, wait time.Duration) (*registered, error) {
	qc, err := c.dial(ctx, tr, wait)
	if err != nil {
		return nil, err
	}
	return c.registerOn(ctx, qc, 0)
}

// serve runs a registered connection until it ends, or until a fresh
// connection replaced it. It reports whether the connection reached ready,
// why it ended, and the fresh connection that replaced it, if one did (the
// race in race.go). A replaced connection with streams in flight, whose
// link is back, drains them in the background (joined by c.winding) while
// Run serves the fresh one; otherwise it was closed at once, and its
// streams ended with it.
func (c *Client) serve(ctx context.Context, tr *quic.Transport, r *registered) (ready bool, next *registered, err error) {
	qc, cs, gen := r.qc, r.cs, r.gen
	if c.opts.Leases != nil {
		// A lease is bound to this generation: one signed by a previous
		// Edge process (another key) is refused as it should be.
		c.opts.Leases.SetEdgeKey(r.edgeKey)
	}
	conn := &connection{qc: qc, cs: cs, sess: transport.NewSession(c.opts.NodeID, gen, time.Now()), certAnswers: make(chan *wirepb.CertificateResponse, 1),
		busyRefusals: r.busyRefusals}
	conn.hb = transport.NewHeartbeat(c.opts.Liveness, cs.Send, func() {
		quicwire.CloseHeartbeatTimeout.Close(qc, fmt.Sprintf("no heartbeat answer within %v", c.opts.Liveness.ResponseWait))
	})
	log := c.log.With("generation", gen)
	log.Info("registered with edge", "edge_addr", c.opts.EdgeAddr)

	// Everything below lives as long as the connection: when it ends,
	// cctx is cancelled and so are the stream handlers (bound lifetimes).
	// What speaks for the connection (heartbeat, silence watch, provider
	// reports, renewal) lives on actx, which also ends when a fresh
	// connection replaces this one; the streams it carries do not.
	cctx, stop := context.WithCancel(ctx)
	actx, stopSpeaking := context.WithCancel(cctx)
	defer stopSpeaking()
	var wg sync.WaitGroup
	// The race for a fresh connection outlives this one's end (a link cut
	// past the heartbeat wait ends it; the race still wins at the heal);
	// it is owned by Run's ctx and joined by outcome.
	race := newRace(ctx, c, tr, conn, log)
	// The Node stopping closes the connection; the connection ending, for
	// whatever reason, stops what lives on it.
	unwatchStop := context.AfterFunc(ctx, func() { quicwire.CloseShutdown.Close(qc, "node stopping") })
	unwatchEnd := context.AfterFunc(qc.Context(), stop)
	c.mu.Lock()
	c.current = conn
	c.mu.Unlock()
	c.update(func(s *Status) {
		s.State, s.Generation, s.ConnectedAt = StateRegistering, gen, conn.sess.ConnectedAt()
		s.EdgeID, s.Stopping, s.StoppingReason = r.edgeID, false, ""
		s.Connects++
	})

	wg.Go(func() { conn.hb.Run(actx) })
	wg.Go(func() { c.acceptStreams(cctx, conn) }) // and joins the stream handlers
	wg.Go(func() { c.announce(actx, conn) })
	wg.Go(func() { c.watchEdge(actx, conn, race, log) })
	if r.renews && c.opts.Certificates != nil {
		wg.Go(func() { c.renew(actx, conn, log) })
	}
	var reached atomic.Bool
	loopDone := make(chan error, 1)
	go func() { loopDone <- c.controlLoop(conn, &reached) }()

	// end finishes the connection once its control loop returned err, and
	// says why it ended.
	end := func(err error) error {
		var pe *transport.ProtocolError
		if errors.As(err, &pe) {
			quicwire.CloseProtocolError.Close(qc, pe.Error())
		}
		if cause := quicwire.ConnCause(qc); cause != nil {
			err = cause
		}
		log.Info("edge connection ended", "err", err)
		stop()
		wg.Wait()
		quicwire.CloseNormal.Close(qc, "")
		unwatchStop()
		unwatchEnd()
		c.mu.Lock()
		if c.current == conn {
			c.current = nil
		}
		c.mu.Unlock()
		return err
	}
	select {
	case err := <-loopDone:
		// The connection is over; if a race is on, its outcome is the
		// next connection (no backoff), else nil.
		err = end(err)
		return reached.Load(), race.outcome(), err
	case won := <-race.drains:
		// Replaced, with streams to finish: the Edge closes this
		// connection once they are done (or after its heartbeat wait); the
		// backstop is for an Edge that does not.
		backstop := c.opts.Liveness.ResponseWait + c.opts.Liveness.SuspectAfter()
		log.Info("a fresh connection replaced this one; its streams drain", "streams", conn.streams.Load(), "new_generation", won.gen)
		c.winding.Go(func() {
			t := time.AfterFunc(backstop, func() {
				quicwire.CloseSuperseded.Close(qc, fmt.Sprintf("replaced by generation %d; streams not drained within %v", won.gen, backstop))
			})
			defer t.Stop()
			_ = end(<-loopDone)
		})
		return true, won, nil
	}
}

// streams is how many dispatched streams the connection accepts at once.
func (c *Client) streams() int { return quicwire.DispatchedStreams(c.opts.Capacity) }

// registerError explains why sending the registration or reading its answer
// failed. TLS 1.3: the Edge verifies this Node's certificate after the
// Node's handshake is done, so its refusal surfaces here, on the send or on
// the read, whichever the connection's end reaches first.
func registerError(err error) error {
	if cc, ok := quicwire.CloseReason(err); ok && cc.Remote && cc.Transport == nil {
		return &RefusedError{Code: cc.Code, Reason: cc.Detail}
	}
	return fmt.Errorf("register: %w", quicwire.DescribeHandshakeError(err))
}

// register sends the RegisterRequest and reads the answer.
func (c *Client) register(st *quic.Stream, cs *transport.ControlStream, drainPrevious uint64) (*wirepb.RegisterResponse, error) {
	err := cs.Send(&wirepb.ControlFrame{Msg: &wirepb.ControlFrame_RegisterRequest{RegisterRequest: &wirepb.RegisterRequest{
		NodeId:               c.opts.NodeID,
		NodeVersion:          c.opts.Version,
		ProtocolVersion:      quicwire.ProtocolVersion,
		Providers:            c.opts.Providers.Snapshot(),
		LeasePublicKey:       c.opts.LeasePublicKey,
		Labels:               c.opts.Labels,
		MaxDispatchedStreams: uint32(c.streams()),
		MaxRequestBytes:      uint64(c.opts.MaxRequest),
		ClusterAware:         true,
		WakeTargets:          c.opts.WakeTargets,

		DrainPreviousGeneration: drainPrevious,
	}}})
	if err != nil {
		return nil, registerError(err)
	}
	_ = st.SetReadDeadline(time.Now().Add(quicwire.HandshakeTimeout))
	defer st.SetReadDeadline(time.Time{})
	f, err := cs.Recv()
	if err != nil {
		return nil, registerError(err)
	}
	resp := f.GetRegisterResponse()
	switch {
	case resp == nil:
		return nil, &transport.ProtocolError{Stream: "control", Err: fmt.Errorf("%w: %T instead of RegisterResponse", transport.ErrUnexpectedFrame, f.GetMsg())}
	case !resp.GetAccepted():
		return nil, &RefusedError{Code: quicwire.CloseCode(resp.GetRefusalCode()), Reason: resp.GetRefusalReason()}
	case resp.GetGeneration() == 0:
		return nil, &transport.ProtocolError{Stream: "control", Err: fmt.Errorf("%w: accepted registration without a generation", transport.ErrUnexpectedFrame)}
	}
	return resp, nil
}

// announce waits for the providers to be up, sends the ready request, and
// then reports provider changes for as long as the connection lives.
func (c *Client) announce(ctx context.Context, conn *connection) {
	if err := c.opts.Providers.WaitReady(ctx); err != nil {
		return
	}
	for {
		changed := c.opts.Providers.Changed()
		if err := conn.cs.Send(&wirepb.ControlFrame{Msg: &wirepb.ControlFrame_ReadyRequest{ReadyRequest: &wirepb.NodeReadyRequest{
			Generation: conn.sess.Generation(),
			Providers:  c.opts.Providers.Snapshot(),
		}}}); err != nil {
			return
		}
		sentAt := time.Now()
		for {
			select {
			case <-ctx.Done():
				return
			case <-changed:
			}
			// Slots in use change with every call: at most one update per
			// statusEvery, the last state always sent.
			if wait := statusEvery - time.Since(sentAt); wait > 0 {
				select {
				case <-ctx.Done():
					return
				case <-time.After(wait):
				}
			}
			changed = c.opts.Providers.Changed()
			// The sequence is read before the providers: every observation
			// up to it already shows in them (runtime's Observed hook).
			seq := conn.sess.HealthObservationSeq()
			if err := conn.cs.Send(&wirepb.ControlFrame{Msg: &wirepb.ControlFrame_ProviderStatus{ProviderStatus: &wirepb.ProviderStatusUpdate{
				Providers:            c.opts.Providers.Snapshot(),
				HealthObservationSeq: seq,
			}}}); err != nil {
				return
			}
			sentAt = time.Now()
		}
	}
}

// statusEvery spaces the Node's provider status updates: each carries the
// slots in use (Provider.in_use), which change with every call, for the
// schedulers of every Edge (issue 22). A hint, so a few a second is enough.
const statusEvery = 200 * time.Millisecond

// controlLoop serves the control stream until it ends and returns why.
func (c *Client) controlLoop(conn *connection, ready *atomic.Bool) error {
	for {
		f, err := conn.cs.Recv()
		if err != nil {
			return err
		}
		switch m := f.GetMsg().(type) {
		case *wirepb.ControlFrame_Heartbeat:
			if c.opts.Faults.SilenceHeartbeatAcks.Load() {
				continue
			}
			if err := conn.cs.Send(transport.AckFor(m.Heartbeat)); err != nil {
				return err
			}
		case *wirepb.ControlFrame_HeartbeatAck:
			conn.hb.Acked(m.HeartbeatAck.GetSeq())
		case *wirepb.ControlFrame_ReadyResponse:
			if m.ReadyResponse.GetGeneration() != conn.sess.Generation() {
				return &transport.ProtocolError{Stream: "control", Err: fmt.Errorf("%w: ready response for generation %d on generation %d",
					transport.ErrUnexpectedFrame, m.ReadyResponse.GetGeneration(), conn.sess.Generation())}
			}
			ready.Store(true)
			c.update(func(s *Status) {
				if s.State == StateRegistering {
					s.State = StateReady
				}
			})
			c.log.Info("ready", "generation", conn.sess.Generation())
		case *wirepb.ControlFrame_CredentialNotice:
			// Revocations and disables take effect before the next lease
			// is opened (S4).
			if c.opts.Leases != nil {
				c.opts.Leases.Apply(m.CredentialNotice)
			}
			c.log.Info("credential notice", "revisions", len(m.CredentialNotice.GetCredentialRevisions()),
				"disabled_profiles", m.CredentialNotice.GetDisabledProfiles(), "disabled_credentials", m.CredentialNotice.GetDisabledCredentials())
		case *wirepb.ControlFrame_CertificateResponse:
			select {
			case conn.certAnswers <- m.CertificateResponse:
			default:
				return &transport.ProtocolError{Stream: "control", Err: fmt.Errorf("%w: certificate response not asked for", transport.ErrUnexpectedFrame)}
			}
		case *wirepb.ControlFrame_ClusterUpdate:
			if c.opts.Cluster != nil {
				c.opts.Cluster(m.ClusterUpdate.GetEdges())
			}
		case *wirepb.ControlFrame_EdgeStopping:
			// The Edge closes the connection once its streams are done;
			// until then they go on, and new work goes to the Node's
			// other Edges (the Edge takes none).
			reason := m.EdgeStopping.GetReason()
			c.update(func(s *Status) { s.Stopping, s.StoppingReason = true, reason })
			c.log.Info("edge stopping", "reason", reason, "edge", c.opts.EdgeAddr)
		default:
			return &transport.ProtocolError{Stream: "control", Err: fmt.Errorf("%w: %T from the edge", transport.ErrUnexpectedFrame, m)}
		}
	}
}
