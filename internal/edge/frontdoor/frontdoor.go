// Package frontdoor bounds what a client of the Edge's HTTP listener can
// make the Edge hold (P3): connections, time, request bodies in memory, and
// a handler blocked writing to a client that stopped reading.
//
//   - Connections (conns.go): at most Limits.MaxConns open at once, and
//     MaxConnsPerSource from one source address (loopback exempt). At a
//     cap, a new connection takes the place of the one quiet longest
//     (idle between requests, or new with no request yet) if that one has
//     been quiet for QuietGrace; otherwise it is closed as it is accepted,
//     counted, and logged at most once per interval.
//   - Time: a request's header must arrive within ReadHeaderTimeout and its
//     body within BodyTimeout, at MinBodyRate or faster after
//     BodyRateGrace; a keep-alive connection idle for IdleTimeout is
//     closed. (There is no whole-request read timeout: net/http would
//     cancel a streaming response's context when it fires.) A body the
//     handler leaves unread does not hold its connection (drained).
//   - Bodies (body.go): ReadBody reads a body up to the endpoint's own cap,
//     charging its memory as the bytes arrive, within BodyMemory for all
//     bodies, PrincipalBodyMemory for one principal's and MaxRequest for
//     one connection's; a body that cannot get its share within BodyWait
//     is refused (ErrBusy), the client told to retry. The memory a
//     request's decoding may build is the endpoint's to bound (openaiapi
//     counts messages and parts).
//   - Writes: Deadline gives each write to the client a deadline, so a
//     client that stops reading is ended at its idle timeout and the
//     provider slot it held is freed.
//
// With TLS (api.tls), CertFiles is the listener's certificate, read from
// its files again when they change (certfiles.go).
package frontdoor

import (
	"log/slog"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"time"
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
	// DefaultQuietGrace is how long a connection must have been quiet
	// before it may give its slot to a new one at a cap: about the time
	// most clients keep an idle connection themselves (httpx 5 s, undici
	// 4 s).
	DefaultQuietGrace = 5 * time.Second
	// DefaultMinBodyRate is the slowest a body may arrive, on average,
	// after DefaultBodyRateGrace: 64 KiB/s (512 kbit/s) is a slow mobile
	// uplink; a 32 MiB body at it takes over eight minutes.
	DefaultMinBodyRate   = 64 << 10
	DefaultBodyRateGrace = 5 * time.Second
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
	// MaxConnsPerSource is how many of them one source (an IPv4 address,
	// an IPv6 /64) may hold; loopback is not counted. Default MaxConns/8
	// (at least 1); at most MaxConns.
	MaxConnsPerSource int
	// QuietGrace is how long a connection must have been quiet (idle, or
	// new with no request) before a new connection may take its place at
	// a cap.
	QuietGrace time.Duration
	// BodyMemory is how many bytes of request bodies the Edge holds at
	// once, all requests together.
	BodyMemory int64
	// PrincipalBodyMemory is how many of them the requests of one
	// principal may hold. Default half of BodyMemory; at least
	// MaxRequest (one largest body), at most BodyMemory.
	PrincipalBodyMemory int64
	// MaxRequest bounds one request's body, and the work it becomes (an
	// endpoint may bound its bodies lower); at most BodyMemory. It is
	// also what the bodies of one connection may hold at once.
	MaxRequest int64
	// ReadHeaderTimeout bounds the wait for a request's header.
	ReadHeaderTimeout time.Duration
	// BodyTimeout bounds the reading of one request body.
	BodyTimeout time.Duration
	// MinBodyRate is the slowest a body may arrive, in bytes per second
	// on average from its start, once BodyRateGrace has passed; negative:
	// no minimum.
	MinBodyRate int64
	// BodyRateGrace is how long a body may take before MinBodyRate
	// applies (a client's first bytes, a slow start).
	BodyRateGrace time.Duration
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
	if l.MaxConnsPerSource <= 0 {
		l.MaxConnsPerSource = max(l.MaxConns/8, 1)
	}
	l.MaxConnsPerSource = min(l.MaxConnsPerSource, l.MaxConns)
	if l.BodyMemory <= 0 {
		l.BodyMemory = DefaultBodyMemory
	}
	if l.MaxRequest <= 0 {
		l.MaxRequest = DefaultMaxRequest
	}
	l.MaxRequest = min(l.MaxRequest, l.BodyMemory)
	if l.PrincipalBodyMemory <= 0 {
		l.PrincipalBodyMemory = l.BodyMemory / 2
	}
	l.PrincipalBodyMemory = min(max(l.PrincipalBodyMemory, l.MaxRequest), l.BodyMemory)
	if l.MinBodyRate == 0 {
		l.MinBodyRate = DefaultMinBodyRate
	}
	if l.MaxHeaderBytes <= 0 {
		l.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	def(&l.QuietGrace, DefaultQuietGrace)
	def(&l.ReadHeaderTimeout, DefaultReadHeaderTimeout)
	def(&l.BodyTimeout, DefaultBodyTimeout)
	def(&l.BodyRateGrace, DefaultBodyRateGrace)
	def(&l.IdleTimeout, DefaultIdleTimeout)
	def(&l.BodyWait, DefaultBodyWait)
	return l
}

// Door is one listener's front door: its limits, its connections and the
// bodies it holds. Its methods are safe for concurrent use.
type Door struct {
	limits  Limits
	refused *Refusals

	// The connection table (conns.go).
	connsMu sync.Mutex
	open    int
	quiet   quietList // the quiet connections, quiet longest first
	sources map[netip.Prefix]*source

	bodies budget // body.go

	// detached counts the answers written off net/http (detach.go);
	// parked (guarded by connsMu) is their connections waiting idle for
	// the next request.
	detached sync.WaitGroup
	parked   map[*Detached]struct{}
}

// New returns a door with limits; refused records what it turns away (it
// may be nil).
func New(limits Limits, refused *Refusals) *Door {
	l := limits.withDefaults()
	return &Door{
		limits:  l,
		refused: refused,
		quiet:   quietList{which: allList},
		sources: map[netip.Prefix]*source{},
		parked:  map[*Detached]struct{}{},
		bodies: budget{total: l.BodyMemory, perPrincipal: l.PrincipalBodyMemory, perConn: l.MaxRequest,
			byPrincipal: map[string]int64{}},
	}
}

// Limits are the door's limits, defaults filled in.
func (d *Door) Limits() Limits { return d.limits }

// Server returns an HTTP server for h with the door's timeouts, its
// connection table kept up to date and unread bodies drained within
// bounds. Serve it on Listen's listener.
func (d *Door) Server(h http.Handler, log *slog.Logger) *http.Server {
	return &http.Server{
		Handler:           d.drained(h),
		ReadHeaderTimeout: d.limits.ReadHeaderTimeout,
		IdleTimeout:       d.limits.IdleTimeout,
		MaxHeaderBytes:    d.limits.MaxHeaderBytes,
		HTTP2:             &http.HTTP2Config{MaxConcurrentStreams: MaxStreams},
		ConnState:         d.connState,
		ConnContext:       d.connContext,
		// net/http logs TLS and protocol errors of single connections
		// (bad requests from scanners); they are not the Edge's errors.
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
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
