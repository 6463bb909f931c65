package execution

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/iop-dev/iop/internal/netpeek"
	"github.com/iop-dev/iop/internal/shallow"
)

// relayTransport is the HTTP/1.1 client of the Node's own tunnel relay to
// a model server over plain HTTP (issue 25). net/http's Transport keeps a
// read loop and a write loop goroutine on every connection, and a relay
// holds one connection per request in flight, so each tunnel waiting
// through a silent prefill cost the Node two goroutine stacks besides its
// own. Here the request is written, and its answer read, on the goroutine
// that calls: a waiting request costs that goroutine and its connection.
//
// What it leaves to fallback (net/http's Transport): https (TLS and
// HTTP/2), and a request the environment's proxy settings send through a
// proxy. What it does not do that net/http does: retry a request whose
// reused connection turned out closed (an idle connection the server
// closed is found before reuse instead, see alive), 100-continue, and
// protocol upgrades (a 101 answer is relayed and its connection not
// reused). The request's body is written before its answer is read: a
// server that answers before reading all of it (an early 413) is heard
// once the body has ended or the call's context has.
type relayTransport struct {
	fallback http.RoundTripper
	proxy    func(*http.Request) (*url.URL, error)
	dialer   net.Dialer
	maxIdle  int

	mu   sync.Mutex
	idle map[string][]*relayConn // by host:port, the most recent last
}

// relayConn is one connection with its read buffer, which it holds only
// while an answer is read: not while it waits for one (a prefill), nor
// while idle (issue 25).
type relayConn struct {
	net.Conn
	br *bufio.Reader
}

// alive reports whether an idle connection is still open: the server has
// neither closed it nor sent anything on it since its last answer. It
// peeks without waiting, so a connection the server closed while idle (a
// keep-alive timeout) is found before a request is written on it. Where
// it cannot peek, an idle connection is not reused.
func alive(c net.Conn) bool { return netpeek.Peek(c) == netpeek.Nothing }

// relayReaders are the read buffers of answers being read.
var relayReaders = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, relayBufSize) }}

// reading gives c its read buffer, once the answer's first byte is here.
func (c *relayConn) reading() error {
	if err := netpeek.WaitReadable(c.Conn); err != nil {
		return err
	}
	c.br = relayReaders.Get().(*bufio.Reader)
	c.br.Reset(c.Conn)
	return nil
}

// idle gives c's read buffer back when the answer was read whole and
// nothing follows it; false when something does (the connection cannot be
// reused).
func (c *relayConn) idle() bool {
	if c.br == nil {
		return true
	}
	if c.br.Buffered() > 0 {
		return false
	}
	c.br.Reset(nil)
	relayReaders.Put(c.br)
	c.br = nil
	return true
}

// relayBufSize is the size of each connection's read buffer, and of the
// write buffers: a request head and an answer's line, as newRelayClient
// sizes net/http's.
const relayBufSize = 1 << 10

// relayWriters are the write buffers requests are written through, each
// held only while one is written: a request waiting for its answer (a
// prefill) holds its connection's read buffer alone (issue 25).
var relayWriters = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, relayBufSize) }}

// writeRequest writes req, its body included, to c through a pooled
// buffer: one write when the head and the body fit the buffer together.
//
// http.Request.Write flushes the head on its own when it writes to a
// *bufio.Writer and the body is not in memory, in case the body waits on
// something (issue 22088 of Go). A tunnel's body never does: the Edge has
// read it whole before the tunnel opens, and sends it right behind the
// head, so that write would cost a syscall, and a second segment that the
// model server reads the body from, for nothing (issue 25: one write per
// hop for what arrived together). Given the buffer in a type of its own,
// Write leaves the flushing to the buffer: a body larger than it is still
// written as it is read, from the first buffer-full on.
func writeRequest(c net.Conn, req *http.Request) error {
	bw := relayWriters.Get().(*bufio.Writer)
	bw.Reset(c)
	err := req.Write(headWithBody{bw})
	if err == nil {
		err = bw.Flush()
	}
	bw.Reset(nil)
	relayWriters.Put(bw)
	return err
}

// headWithBody is a request's write buffer that http.Request.Write does
// not recognise as one, so the head is not flushed ahead of the body. It
// is still an io.ByteWriter (Write adds no buffer of its own) and an
// io.ReaderFrom (the body is copied straight into it).
type headWithBody struct{ *bufio.Writer }

// headRequest stands for any HEAD request when an answer is read: the
// method is all http.ReadResponse looks at.
var headRequest = &http.Request{Method: http.MethodHead}

// aLongTimeAgo is a deadline that has passed: setting it unblocks a read
// or write in progress on the connection.
var aLongTimeAgo = time.Unix(1, 0)

// newRelayTransport returns the relay's transport: plain-HTTP requests
// are its own, with up to maxIdle connections kept per server; the rest
// go to fallback, whose proxy settings decide which requests are proxied.
func newRelayTransport(fallback *http.Transport, maxIdle int) *relayTransport {
	return &relayTransport{fallback: fallback, proxy: fallback.Proxy, maxIdle: maxIdle,
		idle: map[string][]*relayConn{}}
}

// RoundTrip implements http.RoundTripper.
func (t *relayTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Scheme != "http" || t.proxied(req) {
		return t.fallback.RoundTrip(req)
	}
	ctx := req.Context()
	addr := req.URL.Host
	if req.URL.Port() == "" {
		addr = net.JoinHostPort(req.URL.Hostname(), "80")
	}
	var (
		c    *relayConn
		stop func() bool
		err  error
	)
	// Taking a connection (a dial) and writing the request go deep, and
	// this goroutine then waits for the answer, through a prefill for
	// minutes: they run on a goroutine of their own, so this one stays as
	// small as its own frames (package shallow).
	shallow.Call(func() { c, stop, err = t.send(ctx, addr, req) })
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*http.Response, error) {
		stop()
		c.Close()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	// From here on the request is not referred to: a call waiting for its
	// answer (a prefill) holds its connection, not the request's headers
	// and URL, nor a read buffer before the answer's first byte (issue 25). Reading the answer needs only
	// whether it was a HEAD (an answer without a body); resp.Request stays
	// nil, as nothing reads it.
	closeReq, asked := req.Close, (*http.Request)(nil)
	if req.Method == http.MethodHead {
		asked = headRequest
	}
	if err := c.reading(); err != nil {
		return fail(fmt.Errorf("waiting for the answer: %w", err))
	}
	var resp *http.Response
	for {
		resp, err = http.ReadResponse(c.br, asked)
		if err != nil {
			return fail(fmt.Errorf("reading the answer: %w", err))
		}
		// An informational answer (100 Continue, 103 Early Hints) is
		// followed by the real one; a 101 switches protocols.
		if resp.StatusCode < 100 || resp.StatusCode > 199 || resp.StatusCode == http.StatusSwitchingProtocols {
			break
		}
	}
	resp.Request = nil // never the shared headRequest
	reuse := !resp.Close && !closeReq && resp.ProtoAtLeast(1, 1) && resp.StatusCode != http.StatusSwitchingProtocols
	hold := headHoldOf(ctx)
	if hold != nil {
		hold.enabled = true // the body says when a read would wait
	}
	resp.Body = &relayBody{t: t, c: c, addr: addr, body: resp.Body, stop: stop, reuse: reuse, hold: hold}
	return resp, nil
}

// send writes req on a connection to addr, idle or dialled, and returns
// it with the stop of the watch that unblocks it when ctx ends; on an
// error the connection is closed.
func (t *relayTransport) send(ctx context.Context, addr string, req *http.Request) (*relayConn, func() bool, error) {
	c, err := t.conn(ctx, addr)
	if err != nil {
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, nil, err
	}
	// The context's end unblocks whatever waits on the connection; no
	// goroutine waits for it meanwhile.
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(aLongTimeAgo) })
	if err := writeRequest(c, req); err != nil {
		stop()
		c.Close()
		if ctx.Err() != nil {
			return nil, nil, ctx.Err()
		}
		return nil, nil, fmt.Errorf("writing the request: %w", err)
	}
	return c, stop, nil
}

// proxied reports whether the environment's proxy settings send req
// through a proxy.
func (t *relayTransport) proxied(req *http.Request) bool {
	if t.proxy == nil {
		return false
	}
	u, err := t.proxy(req)
	return err != nil || u != nil
}

// conn returns an idle connection to addr that is still open, or dials
// one.
func (t *relayTransport) conn(ctx context.Context, addr string) (*relayConn, error) {
	for {
		t.mu.Lock()
		l := t.idle[addr]
		if len(l) == 0 {
			t.mu.Unlock()
			break
		}
		c := l[len(l)-1]
		t.idle[addr] = l[:len(l)-1]
		t.mu.Unlock()
		if alive(c.Conn) {
			return c, nil
		}
		c.Close()
	}
	nc, err := t.dialer.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	return &relayConn{Conn: nc}, nil
}

// put keeps c for the next request to addr, or closes it if enough are
// kept.
func (t *relayTransport) put(addr string, c *relayConn) {
	t.mu.Lock()
	if l := t.idle[addr]; len(l) < t.maxIdle {
		t.idle[addr] = append(l, c)
		c = nil
	}
	t.mu.Unlock()
	if c != nil {
		c.Close()
	}
}

// CloseIdleConnections closes the kept connections, the fallback's too.
func (t *relayTransport) CloseIdleConnections() {
	t.mu.Lock()
	idle := t.idle
	t.idle = map[string][]*relayConn{}
	t.mu.Unlock()
	for _, l := range idle {
		for _, c := range l {
			c.Close()
		}
	}
	if ci, ok := t.fallback.(interface{ CloseIdleConnections() }); ok {
		ci.CloseIdleConnections()
	}
}

// relayBody is an answer's body: read on the caller's goroutine; its
// connection goes back to be reused once the body was read to its end,
// and is closed otherwise.
type relayBody struct {
	t     *relayTransport
	c     *relayConn
	addr  string
	body  io.ReadCloser // http.ReadResponse's
	stop  func() bool   // the context's watch on the connection
	reuse bool
	// hold, until the first read that waits for the server, is told
	// before it (see headHold): a head held for the body's first part
	// goes then.
	hold *headHold

	mu   sync.Mutex
	done bool
}

// Read implements io.Reader.
func (b *relayBody) Read(p []byte) (int, error) {
	if b.hold != nil && (b.c.br == nil || b.c.br.Buffered() == 0) {
		b.hold.flush()
		b.hold = nil
	}
	n, err := b.body.Read(p)
	if err != nil {
		b.finish(errors.Is(err, io.EOF) && b.reuse)
	}
	return n, err
}

// Close closes the body. An answer not read to its end closes its
// connection: reading out the rest could wait on a silent server.
func (b *relayBody) Close() error {
	b.finish(false)
	return nil
}

// finish releases the connection once: kept if keep, closed otherwise.
func (b *relayBody) finish(keep bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.done {
		return
	}
	b.done = true
	// A context that ended in the meantime has set the deadline already:
	// that connection is not kept.
	if !b.stop() || !keep || !b.c.idle() {
		b.c.Close()
		return
	}
	b.t.put(b.addr, b.c)
}
