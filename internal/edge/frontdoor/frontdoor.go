// Package frontdoor bounds what a client of the Edge's HTTP listener can
// make the Edge hold (P3): connections, time, request bodies in memory, and
// a handler blocked writing to a client that stopped reading.
//
//   - Connections: at most Limits.MaxConns open at once; one more is closed
//     as it is accepted, counted, and logged at most once per interval.
//   - Time: a request's header must arrive within ReadHeaderTimeout and its
//     body within BodyTimeout; a keep-alive connection idle for IdleTimeout
//     is closed. (There is no whole-request read timeout: net/http would
//     cancel a streaming response's context when it fires.)
//   - Bodies: ReadBody reads a body up to the endpoint's own cap, and only
//     while the bytes of all bodies being held fit in Limits.BodyMemory; a
//     body that cannot get its share within BodyWait is refused (ErrBusy),
//     the client told to retry. The memory a request's decoding may build
//     is the endpoint's to bound (openaiapi counts messages and parts).
//   - Writes: Deadline gives each write to the client a deadline, so a
//     client that stops reading is ended at its idle timeout and the
//     provider slot it held is freed.
//
// With TLS (api.tls), CertFiles is the listener's certificate, read from
// its files again when they change (certfiles.go).
package frontdoor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/semaphore"
)

// Defaults of Limits.
const (
	DefaultMaxConns          = 4096
	DefaultBodyMemory        = 64 << 20
	DefaultMaxRequest        = 32 << 20
	DefaultReadHeaderTimeout = 10 * time.Second
	DefaultBodyTimeout       = time.Minute
	DefaultIdleTimeout       = 90 * time.Second
	DefaultBodyWait          = 2 * time.Second
	DefaultMaxHeaderBytes    = 64 << 10
	// MaxStreams is how many requests one HTTP/2 connection (api.tls) may
	// carry at once, nginx's default: MaxConns times it bounds the
	// requests in flight, as MaxConns alone does for HTTP/1.1.
	MaxStreams = 128
)

// Limits are the front door's bounds. The zero value of a field means its
// default.
type Limits struct {
	// MaxConns is how many client connections may be open at once.
	MaxConns int
	// BodyMemory is how many bytes of request bodies the Edge holds at
	// once, all requests together.
	BodyMemory int64
	// MaxRequest bounds one request's body, and the work it becomes (an
	// endpoint may bound its bodies lower); at most BodyMemory.
	MaxRequest int64
	// ReadHeaderTimeout bounds the wait for a request's header.
	ReadHeaderTimeout time.Duration
	// BodyTimeout bounds the reading of one request body.
	BodyTimeout time.Duration
	// IdleTimeout closes a keep-alive connection that carries no request.
	IdleTimeout time.Duration
	// BodyWait is how long a body waits for its share of BodyMemory
	// before it is refused with ErrBusy.
	BodyWait time.Duration
	// MaxHeaderBytes bounds a request's header.
	MaxHeaderBytes int
}

func (l Limits) withDefaults() Limits {
	def := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	if l.MaxConns <= 0 {
		l.MaxConns = DefaultMaxConns
	}
	if l.BodyMemory <= 0 {
		l.BodyMemory = DefaultBodyMemory
	}
	if l.MaxRequest <= 0 {
		l.MaxRequest = DefaultMaxRequest
	}
	l.MaxRequest = min(l.MaxRequest, l.BodyMemory)
	if l.MaxHeaderBytes <= 0 {
		l.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	def(&l.ReadHeaderTimeout, DefaultReadHeaderTimeout)
	def(&l.BodyTimeout, DefaultBodyTimeout)
	def(&l.IdleTimeout, DefaultIdleTimeout)
	def(&l.BodyWait, DefaultBodyWait)
	return l
}

// Door is one listener's front door: its limits and the bodies it holds.
// Its methods are safe for concurrent use.
type Door struct {
	limits  Limits
	bodies  *semaphore.Weighted
	refused *Refusals
	conns   atomic.Int64
}

// New returns a door with limits; refused records what it turns away (it
// may be nil).
func New(limits Limits, refused *Refusals) *Door {
	l := limits.withDefaults()
	return &Door{limits: l, bodies: semaphore.NewWeighted(l.BodyMemory), refused: refused}
}

// Limits are the door's limits, defaults filled in.
func (d *Door) Limits() Limits { return d.limits }

// Conns is how many client connections are open now.
func (d *Door) Conns() int { return int(d.conns.Load()) }

// Server returns an HTTP server for h with the door's timeouts. Serve it
// on Listen's listener.
func (d *Door) Server(h http.Handler, log *slog.Logger) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: d.limits.ReadHeaderTimeout,
		IdleTimeout:       d.limits.IdleTimeout,
		MaxHeaderBytes:    d.limits.MaxHeaderBytes,
		HTTP2:             &http.HTTP2Config{MaxConcurrentStreams: MaxStreams},
		// net/http logs TLS and protocol errors of single connections
		// (bad requests from scanners); they are not the Edge's errors.
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
}

// Listen listens on addr and caps the connections it accepts at MaxConns.
func (d *Door) Listen(addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	return &capListener{Listener: ln, d: d}, nil
}

// capListener closes each connection accepted beyond the cap at once:
// waiting in Accept instead would leave every new client, the health
// checker's too, hanging in the kernel's backlog behind the flood.
type capListener struct {
	net.Listener
	d *Door
}

func (l *capListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if n := l.d.conns.Add(1); n > int64(l.d.limits.MaxConns) {
			l.d.conns.Add(-1)
			// Counted before the close, so that whoever sees the close
			// also sees the count.
			l.d.refused.Refuse("http_connections", "client connection refused: the connection limit is reached",
				"limit", l.d.limits.MaxConns, "remote", c.RemoteAddr().String())
			c.Close()
			continue
		}
		return &countedConn{Conn: c, d: l.d}, nil
	}
}

type countedConn struct {
	net.Conn
	d    *Door
	once sync.Once
}

func (c *countedConn) Close() error {
	c.once.Do(func() { c.d.conns.Add(-1) })
	return c.Conn.Close()
}

// Errors of ReadBody.
var (
	// ErrTooLarge: the body is larger than the endpoint's cap (413).
	ErrTooLarge = errors.New("request body too large")
	// ErrBusy: the bodies being held leave no room for this one now (503,
	// retry shortly).
	ErrBusy = errors.New("too many request bodies in flight")
	// ErrSlowBody: the body did not arrive within the body timeout (408).
	ErrSlowBody = errors.New("request body not received in time")
)

// BodyError is a body ReadBody refused, with the status and the message a
// client API answers it with.
type BodyError struct {
	Err error // ErrTooLarge, ErrBusy, ErrSlowBody, or the read error
	// Status is the HTTP status to answer: 413, 503, 408 or 400.
	Status int
	// Limit is the cap a too-large body broke.
	Limit int64
	// RetryAfter is set for ErrBusy.
	RetryAfter time.Duration
}

func (e *BodyError) Error() string {
	switch {
	case errors.Is(e.Err, ErrTooLarge):
		return fmt.Sprintf("the request body is larger than %d bytes", e.Limit)
	case errors.Is(e.Err, ErrBusy):
		return "the Edge is holding as many request bodies as it may; retry shortly"
	case errors.Is(e.Err, ErrSlowBody):
		return "the request body did not arrive in time"
	}
	return "the request body could not be read: " + e.Err.Error()
}

func (e *BodyError) Unwrap() error { return e.Err }

// Body is a request body read whole. Release gives its bytes back to the
// door's budget once the caller no longer holds them (or anything built
// from them); it is safe to call more than once.
type Body struct {
	Bytes   []byte
	d       *Door
	n       int64
	release sync.Once
}

// Release returns the body's share of the budget.
func (b *Body) Release() {
	b.release.Do(func() {
		if b.n > 0 {
			b.d.bodies.Release(b.n)
		}
	})
}

// chunk is the first buffer of a body of unknown length.
const chunk = 64 << 10

// ReadBody reads r's body, at most limit bytes (0, or more than the
// door's MaxRequest: MaxRequest), within the body timeout, and only with
// its share of the door's body memory: taken whole up front when the
// request says its length, chunk by chunk as it arrives when not. Nothing
// beyond limit is read. Its error is a *BodyError.
func (d *Door) ReadBody(w http.ResponseWriter, r *http.Request, limit int64) (*Body, error) {
	if limit <= 0 || limit > d.limits.MaxRequest {
		limit = d.limits.MaxRequest
	}
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Now().Add(d.limits.BodyTimeout))
	defer rc.SetReadDeadline(time.Time{})

	b := &Body{d: d}
	if r.ContentLength > limit {
		return nil, &BodyError{Err: ErrTooLarge, Status: http.StatusRequestEntityTooLarge, Limit: limit}
	}
	if r.ContentLength > 0 {
		if err := d.take(r.Context(), b, r.ContentLength); err != nil {
			return nil, err
		}
		buf := make([]byte, r.ContentLength)
		n, err := io.ReadFull(r.Body, buf)
		if err != nil {
			b.Release()
			return nil, d.readError(err, limit)
		}
		b.Bytes = buf[:n]
		return b, nil
	}
	// Unknown length (chunked): the buffer doubles as the body arrives,
	// each growth paid for before it is made.
	var buf []byte
	body := http.MaxBytesReader(w, r.Body, limit)
	for {
		if len(buf) == cap(buf) {
			grown := min(max(2*int64(cap(buf)), chunk), limit+1)
			if err := d.take(r.Context(), b, grown-int64(cap(buf))); err != nil {
				b.Release()
				return nil, err
			}
			nb := make([]byte, len(buf), grown)
			copy(nb, buf)
			buf = nb
		}
		n, err := body.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			b.Bytes = buf
			return b, nil
		}
		if err != nil {
			b.Release()
			return nil, d.readError(err, limit)
		}
	}
}

// take adds n bytes to b's share of the budget, waiting up to BodyWait.
func (d *Door) take(ctx context.Context, b *Body, n int64) error {
	if n > d.limits.BodyMemory {
		return &BodyError{Err: ErrTooLarge, Status: http.StatusRequestEntityTooLarge, Limit: d.limits.BodyMemory}
	}
	if !d.bodies.TryAcquire(n) {
		wctx, cancel := context.WithTimeout(ctx, d.limits.BodyWait)
		err := d.bodies.Acquire(wctx, n)
		cancel()
		if err != nil {
			d.refused.Refuse("body_memory", "request body refused: the body memory limit is reached", "limit", d.limits.BodyMemory, "size", n)
			return &BodyError{Err: ErrBusy, Status: http.StatusServiceUnavailable, RetryAfter: time.Second}
		}
	}
	b.n += n
	return nil
}

func (d *Door) readError(err error, limit int64) error {
	var tooBig *http.MaxBytesError
	var ne net.Error
	switch {
	case errors.As(err, &tooBig):
		return &BodyError{Err: ErrTooLarge, Status: http.StatusRequestEntityTooLarge, Limit: limit}
	case errors.As(err, &ne) && ne.Timeout():
		d.refused.Refuse("slow_body", "request body timed out", "timeout", d.limits.BodyTimeout)
		return &BodyError{Err: ErrSlowBody, Status: http.StatusRequestTimeout}
	case errors.Is(err, io.ErrUnexpectedEOF):
		return &BodyError{Err: fmt.Errorf("the body ended before its Content-Length: %w", err), Status: http.StatusBadRequest}
	}
	return &BodyError{Err: err, Status: http.StatusBadRequest}
}

// RetryAfterHeader formats d as a Retry-After value: whole seconds, at
// least 1.
func RetryAfterHeader(d time.Duration) string {
	return strconv.FormatInt(max(int64((d+time.Second-1)/time.Second), 1), 10)
}

// WriteDeadline keeps a deadline on a response's writes: a write that
// cannot finish within After (the client stopped reading and the socket
// buffers are full) fails instead of blocking the handler, and with it the
// run and the provider slot it holds, forever.
type WriteDeadline struct {
	rc    *http.ResponseController
	after time.Duration
	set   time.Time // when the deadline was last moved
}

// NewWriteDeadline returns the write deadline of w; after is the client
// response-idle timeout of the request.
func NewWriteDeadline(w http.ResponseWriter, after time.Duration) *WriteDeadline {
	return &WriteDeadline{rc: http.NewResponseController(w), after: after}
}

// Extend moves the deadline to After from now, before a write. It touches
// the connection at most once per second (or per quarter of After, if that
// is shorter): the deadline is then at least three quarters of After away,
// which is all a timeout needs, and a token stream does not pay a timer
// reset per token.
func (wd *WriteDeadline) Extend() {
	if wd == nil || wd.after <= 0 {
		return
	}
	now := time.Now()
	if now.Sub(wd.set) < min(time.Second, wd.after/4) {
		return
	}
	wd.set = now
	_ = wd.rc.SetWriteDeadline(now.Add(wd.after))
}

// IdleTimer is a request's client response-idle timeout (SPEC S5): it
// runs from admission (Start; the queue wait before it is the queue
// timeout's alone), every byte sent to the client starts it over (Reset),
// and when it fires it calls fire, which ends the request. Its methods are
// called from the request's goroutine; fire runs on the timer's.
type IdleTimer struct {
	after time.Duration
	fire  func()
	t     *time.Timer
}

// NewIdleTimer returns a stopped timer of after (none if after <= 0).
func NewIdleTimer(after time.Duration, fire func()) *IdleTimer {
	return &IdleTimer{after: after, fire: fire}
}

// Start starts the timer, once; later calls do nothing.
func (it *IdleTimer) Start() {
	if it.after > 0 && it.t == nil {
		it.t = time.AfterFunc(it.after, it.fire)
	}
}

// Reset starts the timer over, if it runs.
func (it *IdleTimer) Reset() {
	if it.t != nil {
		it.t.Reset(it.after)
	}
}

// Stop stops the timer.
func (it *IdleTimer) Stop() {
	if it.t != nil {
		it.t.Stop()
	}
}
