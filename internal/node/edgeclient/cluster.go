package edgeclient

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/iop-dev/iop/quicwire"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// Several Edges (issue 22): a Node keeps one connection (one Client) to
// every Edge of its cluster. It starts from the addresses it was configured
// with (its seeds), learns the cluster's Edge list at each registration and
// at each change an Edge announces, dials the Edges it is not connected to,
// and drops the ones it learned that a later list leaves out.
// The seeds are never dropped: each keeps being dialled with backoff, and
// serves whichever Edge answers there. One Edge is one connection: an
// Edge reached through a seed is not dialled again at its listed address,
// and a connection that finds its Edge already reached through another one
// ends before it registers (managed mode, where the certificate names the
// Edge; in loopback mode, right after). Every connection serves the same
// providers, whose slots are the Node's own (the handler refuses a call
// past them busy, whichever Edge sent it), and reports their status to its
// Edge.

// ErrDuplicateEdge ends a connection that reached an Edge this Node is
// already connected to through another address.
var ErrDuplicateEdge = errors.New("already connected to this edge")

// ClusterOptions configure a Cluster.
type ClusterOptions struct {
	// Seeds are the configured Edge addresses, host:port; at least one.
	Seeds []string
	// TLS returns the TLS configuration that dials addr, accepting only a
	// certificate for edgeID when it is not "" (an Edge learned from a
	// list), any Edge the identity mode admits otherwise (a seed). An
	// error: this Node may not dial addr (loopback mode and an address
	// that is not loopback); a listed Edge is then left out.
	TLS func(addr, edgeID string) (*tls.Config, error)
	// Client is every connection's options; the Cluster sets EdgeAddr,
	// TLS, PacketConn, Handler, Leases, Edge and Cluster.
	Client Options
	// PerEdge makes what each connection has of its own: its stream
	// handler and its lease opener (each Edge signs leases with its own key
	// and sends its own credential notices). status reads that
	// connection's state. Nil: Client.Handler and Client.Leases for all.
	PerEdge func(status func() Status) (Handler, Leases)
	// PacketConn, if set, gives each connection its endpoint (tests use
	// quic-go's simnet); nil: a new UDP socket each.
	PacketConn func() net.PacketConn
	Logger     *slog.Logger
}

// EdgeStatus is one Edge connection of a Cluster, for health endpoints,
// status and tests.
type EdgeStatus struct {
	// Addr is the address the connection dials.
	Addr string
	// Seed: a configured address, never dropped.
	Seed bool
	// ListedID is the Edge id the list gave for Addr ("" for a seed).
	ListedID string
	Status
}

// Cluster keeps a Node connected to every Edge of its cluster. Run it with
// Run; stop it by cancelling Run's context, after Drain for a graceful
// stop.
type Cluster struct {
	opts ClusterOptions
	log  *slog.Logger

	mu sync.Mutex
	// ctx is Run's, while it runs: members start in it. Guarded by mu.
	ctx      context.Context
	members  []*member // seeds first, in configuration order
	draining bool
	changed  chan struct{}
	wg       sync.WaitGroup // every member's Run
	// renew lets one connection at a time renew the Node's certificate.
	renew sync.Mutex
	// list is the last non-empty Edge list an Edge told. Guarded by mu.
	list []*wirepb.ClusterEdge
	// claims are the Edges connections are on their way to register with
	// (claim), and since when. Guarded by mu.
	claims map[string]pendingClaim
}

// pendingClaim is a connection's claim of an Edge before it registers.
type pendingClaim struct {
	m  *member
	at time.Time
}

// claimPending is how long a claim holds an Edge for a connection that has
// not registered yet: the register wait and the registration's own.
const claimPending = 2 * quicwire.HandshakeTimeout

// member is one Edge connection of the Cluster.
type member struct {
	addr     string
	seed     bool
	listedID string
	client   *Client
	cancel   context.CancelFunc
}

// NewCluster checks opts and returns a cluster with a client for each
// seed; Run starts them.
func NewCluster(opts ClusterOptions) (*Cluster, error) {
	if len(opts.Seeds) == 0 {
		return nil, errors.New("node transport: no edge address")
	}
	if opts.TLS == nil {
		return nil, errors.New("node transport: no TLS configuration")
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	c := &Cluster{opts: opts, log: opts.Logger, changed: make(chan struct{})}
	for _, addr := range opts.Seeds {
		if slices.ContainsFunc(c.members, func(m *member) bool { return m.addr == addr }) {
			continue
		}
		m, err := c.newMember(addr, "", true)
		if err != nil {
			return nil, err
		}
		c.members = append(c.members, m)
	}
	return c, nil
}

// newMember makes the client of one Edge connection.
func (c *Cluster) newMember(addr, listedID string, seed bool) (*member, error) {
	tlsConf, err := c.opts.TLS(addr, listedID)
	if err != nil {
		return nil, err
	}
	m := &member{addr: addr, seed: seed, listedID: listedID}
	o := c.opts.Client
	o.EdgeAddr, o.TLS = addr, tlsConf
	o.Logger = c.log.With("edge_addr", addr)
	if c.opts.PacketConn != nil {
		o.PacketConn = c.opts.PacketConn()
	}
	if c.opts.PerEdge != nil {
		o.Handler, o.Leases = c.opts.PerEdge(func() Status { return m.client.Status() })
	}
	o.RenewGate = &c.renew
	o.Edge = func(id string) error { return c.claim(m, id) }
	o.Cluster = func(edges []*wirepb.ClusterEdge) { c.learn(m, edges) }
	if m.client, err = New(o); err != nil {
		return nil, err
	}
	return m, nil
}

// Run keeps the Node connected to every Edge until ctx is done, and returns
// once every connection has ended.
func (c *Cluster) Run(ctx context.Context) error {
	c.mu.Lock()
	if c.ctx != nil {
		c.mu.Unlock()
		return errors.New("node transport: cluster already running")
	}
	c.ctx = ctx
	for _, m := range c.members {
		c.startLocked(m)
	}
	c.mu.Unlock()
	<-ctx.Done()
	c.wg.Wait()
	return nil
}

// startLocked runs m's client until Run's context ends or m is dropped.
func (c *Cluster) startLocked(m *member) {
	ctx, cancel := context.WithCancel(c.ctx)
	m.cancel = cancel
	c.wg.Go(func() {
		defer cancel()
		_ = m.client.Run(ctx)
	})
	c.notifyLocked()
}

func (c *Cluster) notifyLocked() {
	close(c.changed)
	c.changed = make(chan struct{})
}

// claim lets m's connection go on to the Edge id, unless another
// connection of this Node holds that Edge (registered, ready or draining
// there). A listed connection that finds its Edge held is dropped; a seed
// keeps trying with its backoff (its address may lead to another Edge
// next time).
func (c *Cluster) claim(m *member, id string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if m.listedID != "" && id != m.listedID {
		// Managed mode checks the certificate against the listed id in
		// the handshake; loopback mode only has the registration's word.
		c.dropLocked(m, "its address answers as another edge")
		return fmt.Errorf("edge at %s is %q, not %q as listed", m.addr, id, m.listedID)
	}
	holder := ""
	for _, o := range c.members {
		if o == m {
			continue
		}
		if st := o.client.Status(); st.EdgeID == id && holds(st.State) {
			holder = o.addr
		} else if p, ok := c.claims[id]; ok && p.m == o && time.Since(p.at) < claimPending {
			// On its way to register there: two connections that
			// reach one Edge at once must not both register.
			holder = o.addr
		}
		if holder != "" {
			if !m.seed {
				c.dropLocked(m, "its edge is reached through "+holder)
			} else {
				// A seed in front of several Edges (a load balancer) that
				// lands on one already reached: the Edge it reached before
				// may now be reached by none.
				c.dialListedLocked(nil)
			}
			return fmt.Errorf("%w: %s through %s", ErrDuplicateEdge, id, holder)
		}
	}
	if c.claims == nil {
		c.claims = make(map[string]pendingClaim)
	}
	c.claims[id] = pendingClaim{m: m, at: time.Now()}
	return nil
}

// holds reports whether a connection in state holds its Edge.
func holds(s State) bool {
	return s == StateRegistering || s == StateReady || s == StateDraining
}

// learn takes the cluster's Edge list as m's Edge told it: it dials every
// Edge no connection reaches yet (not one that is stopping), and drops the
// listed connections whose Edge the list leaves out. An empty list (an
// Edge alone, or one that does not know its cluster) changes nothing.
func (c *Cluster) learn(from *member, edges []*wirepb.ClusterEdge) {
	if len(edges) == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ctx == nil || c.ctx.Err() != nil || c.draining {
		return
	}
	// A connection made from a list stays while a list names its Edge at
	// its address.
	listed := make(map[[2]string]bool, len(edges))
	for _, e := range edges {
		listed[[2]string{e.GetEdgeId(), e.GetQuicAddress()}] = true
	}
	ids := make(map[string]bool, len(edges))
	for _, e := range edges {
		ids[e.GetEdgeId()] = true
	}
	for _, m := range slices.Clone(c.members) {
		switch {
		case !m.seed && !listed[[2]string{m.listedID, m.addr}]:
			c.dropLocked(m, "no longer in the cluster's edge list")
		case m.seed && m != from:
			// A seed's Edge the list leaves out is gone (killed, or
			// taken out of the cluster): its connection ends now, with
			// the runs its clients can no longer read, and the seed is
			// dialled again with backoff.
			if id := m.client.registeredEdge(); id != "" && !ids[id] {
				m.client.closeCurrent("edge " + id + " is no longer in the cluster's edge list")
			}
		}
	}
	c.list = edges
	c.dialListedLocked(from)
}

// dialListedLocked dials every Edge of the last list that no connection
// reaches, except one that is stopping; from is the connection whose Edge
// told the list, nil for none.
func (c *Cluster) dialListedLocked(from *member) {
	if c.ctx == nil || c.ctx.Err() != nil || c.draining {
		return
	}
	for _, e := range c.list {
		id, addr := e.GetEdgeId(), e.GetQuicAddress()
		if id == "" || addr == "" || e.GetStopping() || c.reachedLocked(from, id, addr) {
			continue
		}
		m, err := c.newMember(addr, id, false)
		if err != nil {
			c.log.Warn("not dialling a listed edge", "edge", id, "edge_addr", addr, "err", err)
			continue
		}
		c.log.Info("dialling an edge of the cluster", "edge", id, "edge_addr", addr)
		c.members = append(c.members, m)
		c.startLocked(m)
	}
}

// reachedLocked reports whether a connection already reaches (or dials)
// the Edge id at addr: a seed to addr, one listed as id, or one registered
// there (from, whose registration may not show in its status yet, is the
// Edge that sent the list when id is its own).
func (c *Cluster) reachedLocked(from *member, id, addr string) bool {
	for _, m := range c.members {
		if (m.seed && m.addr == addr) || m.listedID == id {
			return true
		}
		st := m.client.Status()
		if st.EdgeID == id && holds(st.State) {
			return true
		}
	}
	return from != nil && from.client.registeredEdge() == id
}

// dropLocked stops m and forgets it. Its Edge is out of the cluster's
// list, which the other Edges keep: it died (kill -9, a lost machine) or
// was taken out. Nobody is left to read the streams it carries, so they
// end now (their provider calls cancelled, the slots freed for the Edges
// that are left) rather than at the heartbeat's verdict. An Edge that
// stops in a planned way stays listed, as stopping, and closes its
// connections itself once its streams are done.
func (c *Cluster) dropLocked(m *member, why string) {
	i := slices.Index(c.members, m)
	if i < 0 || m.seed {
		return
	}
	c.members = slices.Delete(c.members, i, i+1)
	c.notifyLocked()
	c.log.Info("dropping an edge connection", "edge_addr", m.addr, "edge", m.listedID, "why", why)
	if m.cancel != nil {
		m.cancel() // Run closes the connection (shutdown) and returns
	}
}

// Edges returns the state of every Edge connection, seeds first.
func (c *Cluster) Edges() []EdgeStatus {
	c.mu.Lock()
	ms := slices.Clone(c.members)
	c.mu.Unlock()
	out := make([]EdgeStatus, 0, len(ms))
	for _, m := range ms {
		out = append(out, EdgeStatus{Addr: m.addr, Seed: m.seed, ListedID: m.listedID, Status: m.client.Status()})
	}
	return out
}

// Changed returns a channel closed at the next change of the connections
// (one added or dropped); each connection's own changes show in its
// Client's Changed.
func (c *Cluster) Changed() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.changed
}

// Ready reports whether the Node serves through at least one Edge: a
// connection ready, on an Edge that is not stopping.
func (c *Cluster) Ready() bool {
	for _, e := range c.Edges() {
		if e.State == StateReady && !e.Stopping {
			return true
		}
	}
	return false
}

// InFlight is the number of dispatched streams being served, over every
// connection.
func (c *Cluster) InFlight() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, m := range c.members {
		n += m.client.InFlight()
	}
	return n
}

// Drain stops taking new work on every connection and tells every Edge,
// each of which closes its connection once its streams are done (see
// Client.Drain); no Edge is dialled anew. It returns when all are closed,
// or when ctx ends (cutting what still runs), with the first error.
func (c *Cluster) Drain(ctx context.Context, reason string) error {
	c.mu.Lock()
	c.draining = true
	ms := slices.Clone(c.members)
	c.mu.Unlock()
	errs := make([]error, len(ms))
	var wg sync.WaitGroup
	for i, m := range ms {
		wg.Go(func() { errs[i] = m.client.Drain(ctx, reason) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// registeredEdge is the Edge id of the registration being served or just
// made (the Cluster asks while a registration's list is being learned,
// before Status shows it).
func (c *Client) registeredEdge() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lastEdge
}

// closeCurrent closes the connection the client holds now, if any, with
// why; Run then dials again with its backoff.
func (c *Client) closeCurrent(why string) {
	c.mu.Lock()
	conn := c.current
	c.mu.Unlock()
	if conn != nil {
		c.log.Info("closing the edge connection", "why", why)
		quicwire.CloseShutdown.Close(conn.qc, why)
	}
}
