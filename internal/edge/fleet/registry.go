// Package fleet is the Edge's registry of Nodes and their connections. It
// owns the generation fence: every accepted connection of a Node is a new
// generation, at most one generation per Node is current, and only a current
// generation that completed the ready handshake is dispatchable (R1, R9).
package fleet

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/iop-dev/iop/internal/transport"
	"github.com/iop-dev/iop/quicwire"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// State is where one connection (generation) of a Node is in its life.
type State string

// Connection states, in the order a connection moves through them.
const (
	// Registering: registered, ready handshake not complete. Gets no work.
	Registering State = "registering"
	// Ready: registered and ready; the only dispatchable state (R1).
	Ready State = "ready"
	// Draining: the Node finishes in-flight work and takes nothing new.
	Draining State = "draining"
	// Fenced: the generation has ended. Nothing bound to it is accepted.
	Fenced State = "fenced"
)

// ErrNotDispatchable is returned for a Node that cannot take work now;
// the *NotDispatchableError says why.
var ErrNotDispatchable = errors.New("node not dispatchable")

// ErrStreamWait is a dispatch that found every stream its Node's
// connection accepts in use for the wait it was given (Link.OpenStream).
var ErrStreamWait = errors.New("no stream free on the node's connection")

// NotDispatchableError says why a Node cannot take work.
type NotDispatchableError struct {
	NodeID string
	// State is the current generation's state, or "" for an unknown Node.
	State State
	// Suspect: the generation is ready but its Node has not been heard
	// from since SilentSince (suspect.go).
	Suspect     bool
	SilentSince time.Time
}

func (e *NotDispatchableError) Error() string {
	switch {
	case e.State == "":
		return fmt.Sprintf("node %q is not connected", e.NodeID)
	case e.Suspect:
		return fmt.Sprintf("node %q is suspect: not heard from since %s", e.NodeID, e.SilentSince.Format(time.RFC3339Nano))
	}
	return fmt.Sprintf("node %q is %s", e.NodeID, e.State)
}

// Is makes errors.Is(err, ErrNotDispatchable) hold.
func (e *NotDispatchableError) Is(target error) bool { return target == ErrNotDispatchable }

// Link is the live connection behind a generation: what the registry and
// its readers ask of it. The Edge's node server implements it with its
// per-connection type; tests use fakes.
//
// Register publishes the Link: from that moment any goroutine may call it
// (a /metrics scrape, an admin read, a dispatch, a newer generation
// fencing this one), so everything its methods read must exist before
// Register is called.
type Link interface {
	// OpenStream opens a dispatched stream on the connection, waiting for
	// a free stream slot for up to wait (then ErrStreamWait), or until ctx
	// is done.
	OpenStream(ctx context.Context, wait time.Duration) (*quic.Stream, error)
	// Close ends the connection with code. The registry calls it when it
	// fences the generation, without holding its lock.
	Close(code quicwire.CloseCode, detail string)
	// RTT is the round trip of the last answered heartbeat and when the
	// answer came; the zero time before the first.
	RTT() (time.Duration, time.Time)
}

// ConnInfo describes a connection that has just registered: what its Node
// said of itself, and the Link that reaches it.
type ConnInfo struct {
	NodeID     string
	Version    string
	RemoteAddr string
	// Identity is the verified workload identity (spiffe URI), or
	// "loopback" in the single-machine mode.
	Identity  string
	LeaseKey  []byte
	Labels    map[string]string
	Providers []*wirepb.Provider
	// MaxStreams is how many dispatched streams the Node accepts open at
	// once (RegisterRequest.max_dispatched_streams); 0 for an older Node,
	// which accepts quicwire.LegacyDispatchedStreams.
	MaxStreams int
	// DrainPrevious is the generation of this Node that the connection
	// replaces but lets drain (RegisterRequest.drain_previous_generation,
	// issue 26); 0 or any other generation: the previous one is fenced.
	DrainPrevious uint64
	// MaxRequest is the largest stream header (a run or embedding request)
	// the Node takes, in parts (RegisterRequest.max_request_bytes); 0 for
	// an older Node, which takes one frame.
	MaxRequest int
	// WakeTargets are the machines the Node can wake
	// (RegisterRequest.wake_targets, issue 23; internal/edge/wake).
	WakeTargets []*wirepb.WakeTarget
	// Link is the connection itself. Nil only in tests of the registry's
	// bookkeeping, which never dispatch: such a generation reports no
	// round trip and has nothing to close.
	Link Link
}

// Conn is one generation of one Node: one accepted, registered connection.
type Conn struct {
	info        ConnInfo
	generation  uint64
	connectedAt time.Time
	reg         *Registry

	// Guarded by reg.mu.
	state       State
	providers   []*wirepb.Provider
	fenceCode   quicwire.CloseCode
	fenceDetail string
	fencedAt    time.Time
	fenced      chan struct{}
	// The health overlay (health.go).
	health          map[targetKey]*targetHealth
	lastObservation uint64
	// Suspicion (suspect.go): zero while the Node is heard from. heardAt
	// is when a suspect Node was heard from again, waiting for a
	// heartbeat's answer; zero while it is silent.
	suspectSince, silentSince, heardAt time.Time
	onSuspect                          map[uint64]func()

	streams streamCount // dispatched streams not yet finished
	// superseded is what Register did to the previous live generation;
	// set before Register returns, never changed.
	superseded *Supersede
	// replaced is closed when a newer generation replaced this one but
	// let it drain (Replaced); replacedBy is that generation. Guarded by
	// reg.mu.
	replaced   chan struct{}
	replacedBy uint64
}

// streamCount counts a generation's open dispatched streams and tells when
// none are left.
type streamCount struct {
	mu   sync.Mutex
	n    int
	idle chan struct{} // closed while n == 0; nil until first needed
}

func (s *streamCount) add(d int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.n == 0 && d > 0 && s.idle != nil {
		s.idle = nil
	}
	s.n += d
	if s.n == 0 && s.idle != nil {
		close(s.idle)
	}
}

func (s *streamCount) wait() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.idle == nil {
		s.idle = make(chan struct{})
		if s.n == 0 {
			close(s.idle)
		}
	}
	return s.idle
}

// NodeID is the Node this connection belongs to.
func (c *Conn) NodeID() string { return c.info.NodeID }

// Generation is the connection's generation.
func (c *Conn) Generation() uint64 { return c.generation }

// ConnectedAt is when the generation registered.
func (c *Conn) ConnectedAt() time.Time { return c.connectedAt }

// FencedAt is when the generation was fenced; zero while it is not.
func (c *Conn) FencedAt() time.Time {
	c.reg.mu.Lock()
	defer c.reg.mu.Unlock()
	return c.fencedAt
}

// Identity is the connection's verified workload identity (a SPIFFE URI),
// or "loopback" for an unauthenticated single-machine connection.
func (c *Conn) Identity() string { return c.info.Identity }

// Verified reports whether the Node's identity was verified by mutual TLS
// (S3): only such a connection is issued credential leases.
func (c *Conn) Verified() bool { return c.info.Identity != "" && c.info.Identity != "loopback" }

// WakeTargets are the machines the Node said it can wake.
func (c *Conn) WakeTargets() []*wirepb.WakeTarget { return c.info.WakeTargets }

// LeaseKey is the X25519 key the Node registered for sealed leases.
func (c *Conn) LeaseKey() []byte { return c.info.LeaseKey }

// Slots is how many capacity slots the scheduler may grant on this
// generation at once: its stream limit less quicwire.StreamHeadroom, which
// is kept for metadata calls and commands and for streams still closing.
// A Node offers no more capacity than that (internal/node/nodeconfig), so this binds
// only a Node that misreports; then the excess waits in the queue, visible
// and bounded by the queue timeout, instead of inside a stream open.
func (c *Conn) Slots() int {
	n := c.info.MaxStreams
	if n == 0 {
		n = quicwire.LegacyDispatchedStreams
	}
	return max(0, n-quicwire.StreamHeadroom)
}

// MaxRequest is the largest stream header the Node takes, in bytes: what
// it registered, or one frame for a Node that registered nothing.
func (c *Conn) MaxRequest() int {
	if c.info.MaxRequest > 0 {
		return c.info.MaxRequest
	}
	return transport.OneFrameHeader
}

// OpenStream opens a dispatched stream on this generation's connection.
func (c *Conn) OpenStream(ctx context.Context, wait time.Duration) (*quic.Stream, error) {
	return c.info.Link.OpenStream(ctx, wait)
}

// StreamOpened counts a dispatched stream against the generation until the
// matching StreamDone. The Edge finishes a drain when the count is zero.
func (c *Conn) StreamOpened() { c.streams.add(1) }

// StreamDone ends what StreamOpened started.
func (c *Conn) StreamDone() { c.streams.add(-1) }

// StreamsIdle is closed when no dispatched stream of the generation is open.
func (c *Conn) StreamsIdle() <-chan struct{} { return c.streams.wait() }

// Fenced is closed when the generation is fenced.
func (c *Conn) Fenced() <-chan struct{} { return c.fenced }

// Replaced is closed when a newer generation of the Node replaced this one
// and let it drain (Register): it takes no new work, and whoever serves it
// fences it with CloseSuperseded once its streams are done. It is never
// closed for a generation fenced at once.
func (c *Conn) Replaced() <-chan struct{} { return c.replaced }

// ReplacedBy is the generation that replaced this one and let it drain; 0
// while none has.
func (c *Conn) ReplacedBy() uint64 {
	c.reg.mu.Lock()
	defer c.reg.mu.Unlock()
	return c.replacedBy
}

// State is the connection's current state.
func (c *Conn) State() State {
	c.reg.mu.Lock()
	defer c.reg.mu.Unlock()
	return c.state
}

// FenceReason is why the generation was fenced; ok is false while it is not.
func (c *Conn) FenceReason() (code quicwire.CloseCode, detail string, ok bool) {
	c.reg.mu.Lock()
	defer c.reg.mu.Unlock()
	return c.fenceCode, c.fenceDetail, c.state == Fenced
}

// Providers returns the providers the Node last reported on this generation.
func (c *Conn) Providers() []*wirepb.Provider {
	c.reg.mu.Lock()
	defer c.reg.mu.Unlock()
	return slices.Clone(c.providers)
}

// Registry holds every Node the Edge knows and its current generation.
// It is safe for concurrent use.
type Registry struct {
	now func() time.Time

	mu        sync.Mutex
	nodes     map[string]*Conn  // current (or last, if fenced) generation
	lastGen   map[string]uint64 // survives fencing
	genBase   uint64
	changed   chan struct{}
	retention time.Duration
	seq       uint64                   // ids of AfterSuspect callbacks
	contest   map[string]*contestState // supersede.go; by Node id
}

// Options configure a Registry.
type Options struct {
	// GenerationBase is what a Node's generations start above; they
	// increase by one per accepted connection. Daemons pass the Edge's
	// start time in Unix milliseconds, so generations also increase across
	// Edge restarts (a lease or stream of a previous Edge process never
	// matches).
	GenerationBase uint64
	// Now is the clock; nil is time.Now.
	Now func() time.Time
}

// New returns an empty registry.
func New(opts Options) *Registry {
	now := opts.Now
	if now == nil {
		now = time.Now
	}
	return &Registry{
		now:       now,
		nodes:     make(map[string]*Conn),
		lastGen:   make(map[string]uint64),
		genBase:   opts.GenerationBase,
		changed:   make(chan struct{}),
		retention: 15 * time.Minute,
	}
}

// Register records a newly registered connection as the Node's current
// generation, in the registering state. A previous generation of the same
// Node is fenced with CloseSuperseded (R9); Conn.Superseded says what that
// was, and whether the Node's identity looks contested (supersede.go).
//
// Unless the Node asked for it to drain (ConnInfo.DrainPrevious names it),
// it is live, and the new connection comes from its address (the same
// path, which the new handshake just proved; from another, the old path
// is likely gone, as after a NAT rebinding): then the previous generation
// is replaced, not fenced.
// It is no longer the Node's and takes no new work, but the streams it
// carries run on; Replaced is closed, and its owner fences it once they
// are done or a deadline passes (issue 26: a connection whose link healed
// while its QUIC sender still backs off keeps its streams).
func (r *Registry) Register(info ConnInfo) *Conn {
	r.mu.Lock()
	gen := max(r.lastGen[info.NodeID], r.genBase) + 1
	r.lastGen[info.NodeID] = gen
	c := &Conn{
		info:        info,
		generation:  gen,
		connectedAt: r.now(),
		reg:         r,
		state:       Registering,
		providers:   info.Providers,
		fenced:      make(chan struct{}),
		replaced:    make(chan struct{}),
	}
	c.applyReportedHealthLocked(info.Providers, 0)
	old := r.nodes[info.NodeID]
	r.nodes[info.NodeID] = c
	var closeOld func()
	if old != nil && old.state != Fenced {
		c.superseded = r.supersededLocked(c, old, c.connectedAt)
	}
	switch {
	case old != nil && old.state != Fenced && info.DrainPrevious != 0 && info.DrainPrevious == old.generation &&
		info.RemoteAddr == old.info.RemoteAddr:
		c.superseded.Drains = true
		old.state, old.replacedBy = Draining, gen
		close(old.replaced)
	case old != nil:
		closeOld = r.fenceLocked(old, quicwire.CloseSuperseded, fmt.Sprintf("superseded by generation %d", gen))
	}
	r.notifyLocked()
	r.mu.Unlock()
	if closeOld != nil {
		closeOld()
	}
	return c
}

// MarkReady completes the ready handshake of c (R1). It fails unless c is
// its Node's current generation, still registering, and gen is c's
// generation.
func (r *Registry) MarkReady(c *Conn, gen uint64, providers []*wirepb.Provider) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case gen != c.generation:
		return fmt.Errorf("ready for generation %d on connection of generation %d", gen, c.generation)
	case r.nodes[c.info.NodeID] != c || c.state == Fenced:
		return fmt.Errorf("generation %d is fenced", c.generation)
	case c.state != Registering:
		return fmt.Errorf("ready handshake repeated in state %s", c.state)
	}
	c.state = Ready
	if providers != nil {
		c.providers = providers
		c.applyReportedHealthLocked(providers, 0)
	}
	r.notifyLocked()
	return nil
}

// UpdateProviders replaces the providers of c (a ProviderStatusUpdate).
// seq is the update's health_observation_seq: the targets' reported health
// overrides the overlay only where no later observation stands.
func (r *Registry) UpdateProviders(c *Conn, providers []*wirepb.Provider, seq uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if c.state == Fenced {
		return
	}
	c.providers = providers
	c.applyReportedHealthLocked(providers, seq)
	r.notifyLocked()
}

// MarkDraining moves c to draining: it takes no new work.
func (r *Registry) MarkDraining(c *Conn) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if c.state == Fenced {
		return
	}
	c.state = Draining
	r.notifyLocked()
}

// Fence ends generation c: it is no longer dispatchable, its connection is
// closed with code (which ends all its streams with a disconnect outcome),
// and its providers go offline. Fencing is idempotent: the first reason
// wins.
func (r *Registry) Fence(c *Conn, code quicwire.CloseCode, detail string) {
	r.mu.Lock()
	closeConn := r.fenceLocked(c, code, detail)
	r.notifyLocked()
	r.mu.Unlock()
	if closeConn != nil {
		closeConn()
	}
}

// fenceLocked marks c fenced and returns the function that closes its
// connection, to be called without the lock. Callers hold r.mu.
func (r *Registry) fenceLocked(c *Conn, code quicwire.CloseCode, detail string) func() {
	if c.state == Fenced {
		return nil
	}
	c.state = Fenced
	c.fenceCode = code
	c.fenceDetail = detail
	c.fencedAt = r.now()
	close(c.fenced)
	return func() {
		if c.info.Link != nil {
			c.info.Link.Close(code, detail)
		}
	}
}

// Dispatchable returns the Node's current generation if it is ready (R1)
// and not suspect (P4).
func (r *Registry) Dispatchable(nodeID string) (*Conn, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := r.nodes[nodeID]
	if c == nil {
		return nil, &NotDispatchableError{NodeID: nodeID}
	}
	if c.state != Ready {
		return nil, &NotDispatchableError{NodeID: nodeID, State: c.state}
	}
	if !c.suspectSince.IsZero() {
		return nil, &NotDispatchableError{NodeID: nodeID, State: c.state, Suspect: true, SilentSince: c.silentSince}
	}
	return c, nil
}

// NodeReady reports whether nodeID's current generation has completed its
// ready handshake (it may be suspect; it is not registering, draining or
// fenced).
func (r *Registry) NodeReady(nodeID string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := r.nodes[nodeID]
	return c != nil && c.state == Ready
}

// Current returns the Node's current (or last, if fenced) generation.
func (r *Registry) Current(nodeID string) (*Conn, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c, ok := r.nodes[nodeID]
	return c, ok
}

// Changed returns a channel that is closed at the next change of any
// Node's state or providers. Schedulers wait on it to re-evaluate queued
// work (R9).
func (r *Registry) Changed() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.changed
}

func (r *Registry) notifyLocked() {
	close(r.changed)
	r.changed = make(chan struct{})
}
