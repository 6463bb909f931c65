package frontdoor

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"
)

// The connection cap (P3). Every accepted connection is tracked in one
// table: how many are open, how many per source, and, in the order they
// fell quiet, those that are quiet: idle between requests (HTTP/1.1
// keep-alive, or HTTP/2 with no stream open) or new with no request read
// yet (a TLS handshake or a first header under way). net/http tells the
// door each change (http.Server.ConnState).
//
// At a cap, a new connection takes the place of the connection that has
// been quiet longest, if that one has been quiet for QuietGrace; otherwise
// the new one is closed as it is accepted, and counted. Holding a slot
// therefore costs a request in flight, or a request every QuietGrace per
// connection: one GET /healthz no longer buys a slot for the whole idle
// timeout, and new clients and health probes get in while the slots are
// held by idle connections. The grace keeps a client between two
// requests, or in the middle of its handshake, from losing its connection
// to a burst; most clients drop an idle connection themselves after 4 to
// 5 s (httpx, undici). Eviction happens only when a new connection needs
// the slot, never ahead of need: an idle connection nobody needs stays
// open for its client.
//
// Per source (an IPv4 address, or an IPv6 /64, which one host gets
// whole), at most MaxConnsPerSource connections; the next takes the place
// of that source's own quiet-longest connection, or is closed. Loopback
// is exempt: a reverse proxy on the Edge's host carries every client from
// one loopback address, and a local user already shares the host.

// connState is where a connection is in its life, as the door sees it.
type connState uint8

const (
	connNew    connState = iota // accepted; no request read yet
	connActive                  // a request (or an HTTP/2 stream) in progress
	connIdle                    // between requests
	connGone                    // closed or hijacked: no longer counted
)

// quiet reports whether a connection in s may give its slot to a new one.
func (s connState) quiet() bool { return s == connNew || s == connIdle }

// Lists a connection is on while quiet: the door's, and its source's.
const (
	allList = iota
	sourceList
)

// trackedConn is an accepted connection, counted until it closes or is
// hijacked.
type trackedConn struct {
	net.Conn
	d   *Door
	src *source // nil: not capped per source (loopback)

	// Guarded by d.connsMu.
	state connState
	since time.Time // when it entered state
	links [2]struct{ prev, next *trackedConn }

	// bodies is the body memory its requests hold; guarded by
	// d.bodies.mu (body.go).
	bodies int64

	// ln is the listener that accepted it, which takes it back after a
	// detached answer (detach.go); detached (guarded by d.connsMu) keeps it
	// counted while net/http has given it away; early is what net/http had
	// read of its next request when it was detached, read first.
	ln       *capListener
	detached bool
	early    []byte
}

// Read reads what was read of the next request ahead (early) first.
func (c *trackedConn) Read(p []byte) (int, error) {
	if len(c.early) > 0 {
		n := copy(p, c.early)
		if c.early = c.early[n:]; len(c.early) == 0 {
			c.early = nil
		}
		return n, nil
	}
	return c.Conn.Read(p)
}

// quietList is the quiet connections of the door or of one source, quiet
// longest first. A connection goes to the back when it falls quiet, so
// the list stays in that order.
type quietList struct {
	head, tail *trackedConn
	which      int // allList or sourceList: which of a connection's links
}

func (l *quietList) pushBack(c *trackedConn) {
	ln := &c.links[l.which]
	ln.prev, ln.next = l.tail, nil
	if l.tail != nil {
		l.tail.links[l.which].next = c
	} else {
		l.head = c
	}
	l.tail = c
}

func (l *quietList) remove(c *trackedConn) {
	ln := &c.links[l.which]
	if ln.prev != nil {
		ln.prev.links[l.which].next = ln.next
	} else {
		l.head = ln.next
	}
	if ln.next != nil {
		ln.next.links[l.which].prev = ln.prev
	} else {
		l.tail = ln.prev
	}
	ln.prev, ln.next = nil, nil
}

// source is the connections of one source address.
type source struct {
	key   netip.Prefix
	open  int
	quiet quietList
}

// sourceKey is the source a remote address counts against: its IPv4
// address, or its IPv6 /64; false for loopback and for addresses that are
// not TCP (which are not capped per source).
func sourceKey(a net.Addr) (netip.Prefix, bool) {
	ta, ok := a.(*net.TCPAddr)
	if !ok {
		return netip.Prefix{}, false
	}
	ip := ta.AddrPort().Addr().Unmap()
	if !ip.IsValid() || ip.IsLoopback() {
		return netip.Prefix{}, false
	}
	bits := 64
	if ip.Is4() {
		bits = 32
	}
	p, err := ip.Prefix(bits)
	return p, err == nil
}

// admit counts c in, making room by closing a connection quiet past the
// grace if a cap is reached; nil when there is no room (c is then closed
// and the refusal counted).
func (d *Door) admit(c net.Conn) *trackedConn {
	key, capped := sourceKey(c.RemoteAddr())
	now := time.Now()
	var victims [2]*trackedConn
	d.connsMu.Lock()
	var src *source
	if capped {
		if src = d.sources[key]; src == nil {
			src = &source{key: key, quiet: quietList{which: sourceList}}
		}
		if src.open >= d.limits.MaxConnsPerSource {
			if victims[0] = d.quietPast(&src.quiet, now); victims[0] == nil {
				d.connsMu.Unlock()
				d.refuse(c, "http_connections_per_source", "client connection refused: its source holds as many connections as one source may (limits.max_connections_per_source)",
					"limit", d.limits.MaxConnsPerSource, "source", key.String())
				return nil
			}
			d.forgetLocked(victims[0])
		}
	}
	if d.open >= d.limits.MaxConns {
		if victims[1] = d.quietPast(&d.quiet, now); victims[1] == nil {
			d.connsMu.Unlock()
			d.refuse(c, "http_connections", "client connection refused: the connection limit is reached (limits.max_connections), and no connection has been idle for the grace",
				"limit", d.limits.MaxConns, "remote", c.RemoteAddr().String())
			return nil
		}
		d.forgetLocked(victims[1])
	}
	tc := &trackedConn{Conn: c, d: d, src: src, state: connNew, since: now}
	d.open++
	d.quiet.pushBack(tc)
	if src != nil {
		if src.open == 0 {
			d.sources[key] = src
		}
		src.open++
		src.quiet.pushBack(tc)
	}
	d.connsMu.Unlock()
	for _, v := range victims {
		if v != nil {
			// Counted, so whoever sees the close also sees why.
			d.refused.Refuse("http_idle_closed", "closed the client connection quiet longest to admit a new one: a connection cap is reached",
				"idle_for", now.Sub(v.since).Round(time.Millisecond), "remote", v.RemoteAddr().String())
			v.Conn.Close()
		}
	}
	return tc
}

// quietPast is the connection of l quiet longest, if it has been quiet
// for the grace; nil otherwise.
func (d *Door) quietPast(l *quietList, now time.Time) *trackedConn {
	if c := l.head; c != nil && now.Sub(c.since) >= d.limits.QuietGrace {
		return c
	}
	return nil
}

// refuse closes c, accepted past a cap, and counts it first (so whoever
// sees the close also sees the count).
func (d *Door) refuse(c net.Conn, kind, msg string, args ...any) {
	d.refused.Refuse(kind, msg, args...)
	c.Close()
}

// setState records that c entered s (from net/http's ConnState).
func (d *Door) setState(c *trackedConn, s connState) {
	d.connsMu.Lock()
	defer d.connsMu.Unlock()
	if c.state == connGone || c.state == s {
		return
	}
	if c.state.quiet() {
		d.unlistLocked(c)
	}
	c.state, c.since = s, time.Now()
	if s.quiet() {
		d.quiet.pushBack(c)
		if c.src != nil {
			c.src.quiet.pushBack(c)
		}
	}
}

// forget uncounts c, once, whoever closes it first.
func (d *Door) forget(c *trackedConn) {
	d.connsMu.Lock()
	d.forgetLocked(c)
	d.connsMu.Unlock()
}

func (d *Door) forgetLocked(c *trackedConn) {
	if c.state == connGone {
		return
	}
	if c.state.quiet() {
		d.unlistLocked(c)
	}
	c.state = connGone
	d.open--
	if c.src != nil {
		if c.src.open--; c.src.open == 0 {
			delete(d.sources, c.src.key)
		}
	}
}

// unlistLocked takes quiet c off the quiet lists.
func (d *Door) unlistLocked(c *trackedConn) {
	d.quiet.remove(c)
	if c.src != nil {
		c.src.quiet.remove(c)
	}
}

// Close uncounts the connection and closes it.
func (c *trackedConn) Close() error {
	c.d.forget(c)
	return c.Conn.Close()
}

// tracked is the door's connection under nc (a *tls.Conn over one, with
// api.tls), or nil.
func tracked(nc net.Conn) *trackedConn {
	if tc, ok := nc.(*tls.Conn); ok {
		nc = tc.NetConn()
	}
	c, _ := nc.(*trackedConn)
	return c
}

// connState is http.Server.ConnState: it keeps each connection's state in
// the table. HTTP/2 reports active when its first stream opens and idle
// when its last one ends.
func (d *Door) connState(nc net.Conn, s http.ConnState) {
	c := tracked(nc)
	if c == nil {
		return
	}
	switch s {
	case http.StateActive:
		d.setState(c, connActive)
	case http.StateIdle:
		d.setState(c, connIdle)
	case http.StateHijacked:
		d.connsMu.Lock()
		if !c.detached {
			d.forgetLocked(c)
		}
		d.connsMu.Unlock()
	case http.StateClosed:
		d.forget(c)
	}
}

// connKey is the context key of a request's connection.
type connKey struct{}

// connContext is http.Server.ConnContext: each request's context carries
// its connection, so that ReadBody can charge its body to it.
func (d *Door) connContext(ctx context.Context, nc net.Conn) context.Context {
	if c := tracked(nc); c != nil {
		return context.WithValue(ctx, connKey{}, c)
	}
	return ctx
}

// connOf is the connection ctx's request arrived on, or nil.
func connOf(ctx context.Context) *trackedConn {
	c, _ := ctx.Value(connKey{}).(*trackedConn)
	return c
}

// capListener admits each accepted connection through the door. One
// refused is closed at once: waiting in Accept instead would leave every
// new client, the health checker's too, hanging in the kernel's backlog
// behind the flood. It also hands the server the connections whose
// detached answer ended (giveBack), for their next request.
type capListener struct {
	net.Listener
	d *Door

	accepted chan accepted     // from the accepting goroutine
	back     chan *trackedConn // connections given back
	done     chan struct{}     // closed by Close
	close    sync.Once
}

// accepted is one result of the inner listener's Accept.
type accepted struct {
	c   net.Conn
	err error
}

func newCapListener(ln net.Listener, d *Door) *capListener {
	l := &capListener{Listener: ln, d: d, accepted: make(chan accepted), back: make(chan *trackedConn), done: make(chan struct{})}
	go l.accept()
	return l
}

// accept runs the inner listener's Accept until it is closed, so that the
// server's Accept can wait for a new connection and a given-back one at
// once.
func (l *capListener) accept() {
	for {
		c, err := l.Listener.Accept()
		select {
		case l.accepted <- accepted{c, err}:
		case <-l.done:
			if c != nil {
				c.Close()
			}
			return
		}
		if errors.Is(err, net.ErrClosed) {
			return
		}
	}
}

func (l *capListener) Accept() (net.Conn, error) {
	for {
		select {
		case c := <-l.back:
			return c, nil
		case a := <-l.accepted:
			if a.err != nil {
				return nil, a.err
			}
			if tc := l.d.admit(a.c); tc != nil {
				tc.ln = l
				return tc, nil
			}
		case <-l.done:
			return nil, net.ErrClosed
		}
	}
}

// handBack is how a giveBack went.
type handBack uint8

const (
	handed  handBack = iota // the server's Accept has the connection
	refused                 // the listener is closed (or the connection gone)
	busy                    // Accept is not waiting, and the caller would not wait
)

// giveBack hands c to the server's next Accept, waiting for it if wait;
// refused once the listener is closed.
func (l *capListener) giveBack(c *trackedConn, wait bool) handBack {
	if !wait {
		select {
		case l.back <- c:
			return handed
		case <-l.done:
			return refused
		default:
			return busy
		}
	}
	select {
	case l.back <- c:
		return handed
	case <-l.done:
		return refused
	}
}

func (l *capListener) Close() error {
	l.close.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// Conns is how many client connections are open now.
func (d *Door) Conns() int {
	d.connsMu.Lock()
	defer d.connsMu.Unlock()
	return d.open
}

// Listen listens on addr and admits the connections it accepts within the
// door's caps.
func (d *Door) Listen(addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	return newCapListener(ln, d), nil
}
