package nodeserver_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/testutils/simnet"

	"github.com/iop-dev/iop/internal/edge/fleet"
	"github.com/iop-dev/iop/internal/edge/nodeserver"
	"github.com/iop-dev/iop/internal/edge/registrar"
	nodetransport "github.com/iop-dev/iop/internal/node/edgeclient"
	"github.com/iop-dev/iop/internal/transport"
	"github.com/iop-dev/iop/quicwire"
	wireenroll "github.com/iop-dev/iop/quicwire/enroll"
	"github.com/iop-dev/iop/quicwire/pki"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// The harness runs a real Edge transport and real Node clients in one
// process. Inside a testing/synctest bubble it uses quic-go's in-memory
// simnet, so the real 30 s / 45 s liveness profile runs deterministically
// in fake time (ARCHITECTURE.md decision 8); outside, real UDP on 127.0.0.1.

// faultRouter is a simnet router whose link can be black-holed.
type faultRouter struct {
	simnet.PerfectRouter
	blackhole atomic.Bool
	// sent counts the packets sent, and bytes their payload.
	sent, bytes atomic.Int64
}

func (r *faultRouter) SendPacket(p simnet.Packet) error {
	r.sent.Add(1)
	r.bytes.Add(int64(len(p.Data)))
	if r.blackhole.Load() {
		return nil
	}
	return r.PerfectRouter.SendPacket(p)
}

type harness struct {
	t        *testing.T
	sim      bool
	live     quicwire.Liveness
	router   *faultRouter
	nextPort int

	edgeAddr string
	edgeLog  *syncBuffer

	// edgeQUIC overrides the Edge's QUIC configuration (for the control
	// experiment that shows why windows are fixed).
	edgeQUIC *quic.Config
	// resetKey is every Edge instance's stateless reset key; nil: a new
	// random key per instance, as an Edge without a stable key has.
	resetKey *quic.StatelessResetKey

	// managed-mode material (nil in loopback mode)
	ca          *pki.CA
	trustDomain string
	// seedEdgeID is the Edge id a cluster Node accepts at its seed
	// addresses (noded's identity.edge_id); "": any Edge.
	seedEdgeID string
	// enrollDir, if set (managed mode), is the data_dir of an enrollment
	// store: each Edge instance opens it and takes joins, renews
	// certificates for certLifetime, and revokes.
	enrollDir    string
	certLifetime time.Duration

	mu   sync.Mutex
	edge *edgeInstance
}

type edgeInstance struct {
	enrolled *registrar.Service // nil unless h.enrollDir
	store    *registrar.Store
	reg      *fleet.Registry
	srv      *nodeserver.Server
	ln       *quic.Listener
	tr       *quic.Transport
	pc       net.PacketConn
	cancel   context.CancelFunc
	done     chan struct{}
	// listen opens another listener of this Edge on pc (an address the
	// same Edge also answers at).
	listen func(pc net.PacketConn) (*quic.Listener, error)
}

type harnessOpt func(*harness)

// managed switches the harness to mutual TLS against a test CA (S3).
func managed(h *harness) {
	ca, err := pki.NewCA("iop.test", pki.Options{NotBefore: notBefore, Validity: 100 * 365 * 24 * time.Hour})
	if err != nil {
		h.t.Fatal(err)
	}
	h.ca, h.trustDomain = ca, "iop.test"
}

// notBefore predates the synctest bubble's clock (which starts in 2000).
var notBefore = time.Date(1999, 1, 1, 0, 0, 0, 0, time.UTC)

// newSimHarness must be called inside synctest.Test.
func newSimHarness(t *testing.T, opts ...harnessOpt) *harness {
	h := &harness{t: t, sim: true, live: quicwire.DefaultLiveness, router: &faultRouter{}, nextPort: 9000, edgeLog: new(syncBuffer)}
	for _, o := range opts {
		o(h)
	}
	return h
}

// newUDPHarness runs over real UDP on 127.0.0.1 with a scaled profile.
func newUDPHarness(t *testing.T, opts ...harnessOpt) *harness {
	h := &harness{t: t, live: quicwire.DefaultLiveness.Scaled(30), edgeLog: new(syncBuffer)}
	for _, o := range opts {
		o(h)
	}
	return h
}

// packetConn returns a new endpoint: a simnet endpoint on 127.0.0.1 (one
// port each) or a real UDP socket.
func (h *harness) packetConn() net.PacketConn {
	if h.sim {
		h.nextPort++
		return h.packetConnAt(&net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: h.nextPort})
	}
	return h.packetConnAt(&net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
}

// packetConnAt returns an endpoint bound to addr (to restart the Edge on
// the same address).
func (h *harness) packetConnAt(addr *net.UDPAddr) net.PacketConn {
	if h.sim {
		// One simulated link per endpoint, started at once (simnet.Simnet
		// starts only the links that exist when it starts).
		link := &simnet.SimulatedLink{Latency: 2 * time.Millisecond, UploadPacket: h.router}
		c := simnet.NewBlockingSimConn(addr, link)
		link.Start()
		h.router.AddNode(addr, link) // routable only once started
		h.t.Cleanup(func() {
			c.Close()
			link.Close()
		})
		return c
	}
	c, err := net.ListenUDP("udp", addr)
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { c.Close() })
	return c
}

// startEdge starts an Edge (again, after stopEdge) on the harness's
// address, with a registry whose generations start above genBase.
func (h *harness) startEdge(genBase uint64) *edgeInstance {
	h.t.Helper()
	var pc net.PacketConn
	if h.edgeAddr == "" {
		pc = h.packetConn()
		h.edgeAddr = pc.LocalAddr().String()
	} else {
		addr, err := net.ResolveUDPAddr("udp", h.edgeAddr)
		if err != nil {
			h.t.Fatal(err)
		}
		pc = h.packetConnAt(addr)
	}
	e := h.edgeOn(pc, genBase, "edge-1", nil)
	h.mu.Lock()
	h.edge = e
	h.mu.Unlock()
	return e
}

// edgeOn starts an Edge named id on pc, with a registry whose generations
// start above genBase, telling its Nodes the cluster's Edge list dir
// (nil: an Edge alone).
func (h *harness) edgeOn(pc net.PacketConn, genBase uint64, id string, dir nodeserver.EdgeDirectory) *edgeInstance {
	h.t.Helper()
	var tlsConf *tls.Config
	reg := fleet.New(fleet.Options{GenerationBase: genBase})
	e := &edgeInstance{reg: reg, done: make(chan struct{})}
	log := slog.New(slog.NewTextHandler(h.edgeLog, &slog.HandlerOptions{Level: slog.LevelDebug}))
	if h.ca != nil {
		cert, err := h.ca.IssueTLS(quicwire.EdgeIdentity(h.trustDomain, id), pki.Options{NotBefore: notBefore, Validity: 100 * 365 * 24 * time.Hour})
		if err != nil {
			h.t.Fatal(err)
		}
		tlsConf = quicwire.EdgeTLSConfig(h.ca.Pool(), cert, h.trustDomain, nil, func(remote string, err error) {
			log.Warn("refused node connection", "remote", remote, "err", err)
		})
		if h.enrollDir != "" {
			if e.store, err = registrar.OpenStore(h.enrollDir, 5*time.Second, time.Now()); err != nil {
				h.t.Fatal(err)
			}
			e.enrolled = registrar.New(e.store, registrar.Options{EdgeID: id, TrustDomain: h.trustDomain, CACert: h.ca.Cert, CA: h.ca,
				Lifetime: h.certLifetime, Registry: reg, Logger: log})
			tlsConf = wireenroll.WithJoin(tlsConf, wireenroll.EdgeJoinTLSConfig(cert, h.ca.Cert))
		}
	} else {
		var err error
		if tlsConf, err = quicwire.LoopbackEdgeTLSConfig(); err != nil {
			h.t.Fatal(err)
		}
	}
	qconf := transport.EdgeQUICConfig(h.live)
	if h.edgeQUIC != nil {
		qconf = h.edgeQUIC
	}
	key := h.resetKey
	if key == nil {
		key = new(quic.StatelessResetKey)
		rand.Read(key[:])
	}
	e.listen = func(pc net.PacketConn) (*quic.Listener, error) {
		return transport.EdgeTransport(pc, key).Listen(tlsConf, qconf)
	}
	tr := transport.EdgeTransport(pc, key)
	ln, err := tr.Listen(tlsConf, qconf)
	if err != nil {
		h.t.Fatal(err)
	}
	opts := nodeserver.Options{
		EdgeID: id, Liveness: h.live, Managed: h.ca != nil, TrustDomain: h.trustDomain, Logger: log, Directory: dir,
	}
	if e.enrolled != nil {
		opts.Enrollment = e.enrolled
	}
	srv := nodeserver.NewServer(opts, reg)
	ctx, cancel := context.WithCancel(context.Background())
	e.srv, e.ln, e.tr, e.pc, e.cancel = srv, ln, tr, pc, cancel
	go func() {
		defer close(e.done)
		srv.Serve(ctx, ln)
	}()
	h.t.Cleanup(func() { h.stopEdge(e) })
	return e
}

// stopEdge shuts an Edge down the way the daemon does.
func (h *harness) stopEdge(e *edgeInstance) {
	select {
	case <-e.done:
		return
	default:
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	e.srv.Shutdown(ctx)
	e.cancel()
	e.ln.Close()
	<-e.done
	e.tr.Close()
	e.pc.Close()
	e.closeStore()
}

func (e *edgeInstance) closeStore() {
	if e.store != nil {
		e.store.Close()
	}
}

// crashEdge ends an Edge as kill -9 does: its socket goes first, so not a
// packet more leaves it (no CONNECTION_CLOSE), then its state is dropped.
func (h *harness) crashEdge(e *edgeInstance) {
	e.pc.Close()
	e.tr.Close()
	e.cancel()
	e.ln.Close()
	<-e.done
	e.closeStore()
}

type nodeInstance struct {
	c      *nodetransport.Client
	log    *syncBuffer
	faults *nodetransport.Faults
	cancel context.CancelFunc
	done   chan struct{}
}

type nodeOpt func(*nodetransport.Options)

// startNode starts a Node client named id.
func (h *harness) startNode(id string, opts ...nodeOpt) *nodeInstance {
	h.t.Helper()
	n := &nodeInstance{log: new(syncBuffer), faults: new(nodetransport.Faults), done: make(chan struct{})}
	o := nodetransport.Options{
		NodeID:   id,
		Version:  "test",
		EdgeAddr: h.edgeAddr,
		Liveness: h.live,
		Backoff:  nodetransport.Backoff{Initial: time.Second, Max: 4 * time.Second},
		Providers: nodetransport.StaticProviders([]*wirepb.Provider{{
			Name: "sim", Adapter: "simulator", Capacity: 4, State: wirepb.ProviderState_PROVIDER_STATE_ONLINE,
			Targets: []*wirepb.Target{{Name: "sim-small"}},
		}}),
		PacketConn: h.packetConn(),
		Logger:     slog.New(slog.NewTextHandler(n.log, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Faults:     n.faults,
		TLS:        quicwire.LoopbackNodeTLSConfig(),
	}
	if !h.sim {
		o.Backoff = nodetransport.Backoff{Initial: 20 * time.Millisecond, Max: 100 * time.Millisecond}
	}
	if h.ca != nil {
		o.TLS = h.nodeTLS(id, pki.Options{NotBefore: notBefore, Validity: 100 * 365 * 24 * time.Hour}, h.ca)
	}
	for _, f := range opts {
		f(&o)
	}
	c, err := nodetransport.New(o)
	if err != nil {
		h.t.Fatal(err)
	}
	n.c = c
	ctx, cancel := context.WithCancel(context.Background())
	n.cancel = cancel
	go func() {
		defer close(n.done)
		c.Run(ctx)
	}()
	h.t.Cleanup(n.stop)
	return n
}

func (n *nodeInstance) stop() {
	n.cancel()
	<-n.done
}

// nodeTLS is a managed-mode Node TLS config with a certificate for id
// issued by ca.
func (h *harness) nodeTLS(id string, o pki.Options, ca *pki.CA) *tls.Config {
	cert, err := ca.IssueTLS(quicwire.NodeIdentity(h.trustDomain, id), o)
	if err != nil {
		h.t.Fatal(err)
	}
	return quicwire.NodeTLSConfig(h.ca.Pool(), cert, h.trustDomain, "", nil)
}

func (h *harness) current() *edgeInstance {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.edge
}

// waitFor polls cond until it holds or within passes. In a synctest bubble
// the polling runs in fake time: deterministic, and free.
func (h *harness) waitFor(what string, within time.Duration, cond func() bool) {
	h.t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			h.t.Fatalf("timed out after %v waiting for %s\nedge log:\n%s", within, what, h.edgeLog)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitReady waits until node id is dispatchable and returns its generation.
func (h *harness) waitReady(id string) *fleet.Conn {
	h.t.Helper()
	var conn *fleet.Conn
	h.waitFor(id+" ready", 30*time.Second, func() bool {
		c, err := h.current().reg.Dispatchable(id)
		conn = c
		return err == nil
	})
	return conn
}

// syncBuffer is a goroutine-safe log sink.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// handlerFunc adapts a function to nodetransport.Handler.
type handlerFunc func(ctx context.Context, sess *transport.Session, hdr *wirepb.StreamHeader, st *transport.Stream)

func (f handlerFunc) ServeStream(ctx context.Context, sess *transport.Session, hdr *wirepb.StreamHeader, st *transport.Stream) {
	f(ctx, sess, hdr, st)
}

func withHandler(h nodetransport.Handler) nodeOpt {
	return func(o *nodetransport.Options) { o.Handler = h }
}

func runHeader(id string) *wirepb.StreamHeader {
	return &wirepb.StreamHeader{Kind: &wirepb.StreamHeader_Run{Run: &wirepb.RunRequest{RunId: id, Target: "sim-small"}}}
}

func textEvent(seq uint64, text string) *wirepb.RunEvent {
	return &wirepb.RunEvent{Seq: seq, Type: wirepb.RunEventType_RUN_EVENT_TYPE_TEXT_DELTA, Text: text}
}
