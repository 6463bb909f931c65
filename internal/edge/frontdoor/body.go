package frontdoor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
	"time"
)

// Request bodies (P3). A body is read into memory whole (the model is in
// it, and a run may be sent to a second candidate), and the memory is
// charged as the bytes arrive, never up front: the buffer starts at one
// chunk and doubles as it fills, each growth paid for before it is made,
// up to the declared Content-Length (which only bounds the body, and sizes
// the last growth once half of it has arrived) or, for a chunked body, the
// endpoint's cap. A body therefore holds at most one chunk, or twice what
// has arrived: a connection that declares 32 MiB and sends nothing holds
// 64 KiB, not 32 MiB.
//
// What one caller may hold is bounded three ways: all bodies together
// within BodyMemory; the bodies of one principal within
// PrincipalBodyMemory (half of it by default), so that one key (or all
// callers without one, who are one principal) cannot take what every
// other key needs; the bodies of one connection within MaxRequest, the
// one largest body (HTTP/2 carries many requests on a connection). A
// growth that does not fit waits up to BodyWait for memory to be given
// back, then the body is refused with ErrBusy (503, retry), the share it
// found full named.
//
// A body must keep up MinBodyRate on average from its start, after
// BodyRateGrace; one that falls behind is ended with ErrBodyTooSlow (408):
// a trickle cannot hold its share for the whole body timeout. The time a
// body waits for memory does not count against its rate.

// Errors of ReadBody.
var (
	// ErrTooLarge: the body is larger than the endpoint's cap (413).
	ErrTooLarge = errors.New("request body too large")
	// ErrBusy: the bodies being held leave no room for this one now (503,
	// retry shortly): the Edge's, the principal's or the connection's
	// share of body memory is full.
	ErrBusy = errors.New("too many request bodies in flight")
	// ErrSlowBody: the body did not arrive within the body timeout (408).
	ErrSlowBody = errors.New("request body not received in time")
	// ErrBodyTooSlow: the body arrived slower than the minimum rate (408).
	ErrBodyTooSlow = errors.New("request body slower than the minimum rate")
)

// share is a part of body memory a body draws on.
type share uint8

const (
	shareNone      share = iota // it fits
	shareEdge                   // BodyMemory, all bodies together
	sharePrincipal              // PrincipalBodyMemory, one principal's bodies
	shareConn                   // MaxRequest, one connection's bodies
)

// BodyError is a body ReadBody refused, with the status and the message a
// client API answers it with.
type BodyError struct {
	// Err is ErrTooLarge, ErrBusy, ErrSlowBody, ErrBodyTooSlow, or the
	// read error.
	Err error
	// Status is the HTTP status to answer: 413, 503, 408 or 400.
	Status int
	// Limit is the cap a too-large body broke.
	Limit int64
	// RetryAfter is set for ErrBusy.
	RetryAfter time.Duration

	full      share         // ErrBusy: the share that was full
	principal string        // ErrBusy: whose
	got       int64         // ErrSlowBody, ErrBodyTooSlow: bytes received
	after     time.Duration // ... in this long
	rate      int64         // ErrBodyTooSlow: the minimum, bytes per second
}

func (e *BodyError) Error() string {
	switch {
	case errors.Is(e.Err, ErrTooLarge):
		return fmt.Sprintf("the request body is larger than %d bytes", e.Limit)
	case errors.Is(e.Err, ErrBusy):
		switch e.full {
		case sharePrincipal:
			return fmt.Sprintf("principal %q is sending as many request bodies at once as one principal may "+
				"(limits.body_memory_per_principal_percent of limits.body_memory_mib); retry once one of them is answered", e.principal)
		case shareConn:
			return "this connection is sending as many request bodies at once as one connection may (one of limits.max_request_mib); " +
				"send the next one when this one is answered, or on another connection"
		}
		return "the Edge is holding as many request bodies as it may (limits.body_memory_mib); retry shortly"
	case errors.Is(e.Err, ErrBodyTooSlow):
		return fmt.Sprintf("the request body arrived slower than the minimum of %d KiB/s (limits.min_body_rate_kib): %d bytes in %s",
			e.rate>>10, e.got, e.after.Round(100*time.Millisecond))
	case errors.Is(e.Err, ErrSlowBody):
		return fmt.Sprintf("the request body did not arrive in time: %d bytes in %s", e.got, e.after.Round(100*time.Millisecond))
	}
	return "the request body could not be read: " + e.Err.Error()
}

func (e *BodyError) Unwrap() error { return e.Err }

// Body is a request body read whole. Release gives its bytes back to the
// door's budget once the caller no longer holds them (or anything built
// from them); it is safe to call more than once.
type Body struct {
	Bytes []byte

	d         *Door
	principal string
	conn      *trackedConn // nil: a request not on a door's listener
	n         int64        // the memory charged
	release   sync.Once
}

// Release returns the body's share of the budget.
func (b *Body) Release() {
	b.release.Do(func() { b.d.bodies.give(b) })
}

// BodyChunk is the first buffer of a body, and the most a body that has
// sent nothing holds.
const BodyChunk = 64 << 10

// ReadBody reads r's body, at most limit bytes (0, or more than the
// door's MaxRequest: MaxRequest), for principal (the name the caller
// authenticated as; its bodies share PrincipalBodyMemory), within the body
// timeout and at the minimum rate, charging the memory to the door's
// budget as the bytes arrive. Nothing beyond limit is read. Its error is a
// *BodyError.
func (d *Door) ReadBody(w http.ResponseWriter, r *http.Request, principal string, limit int64) (*Body, error) {
	if limit <= 0 || limit > d.limits.MaxRequest {
		limit = d.limits.MaxRequest
	}
	if r.ContentLength > limit {
		return nil, &BodyError{Err: ErrTooLarge, Status: http.StatusRequestEntityTooLarge, Limit: limit}
	}
	b := &Body{d: d, principal: principal, conn: connOf(r.Context())}
	if r.ContentLength == 0 {
		b.Bytes = []byte{}
		return b, nil
	}
	// size bounds the buffer: the declared length, or the cap.
	size, src, known := limit, io.Reader(r.Body), r.ContentLength > 0
	if known {
		size = r.ContentLength
	} else {
		src = http.MaxBytesReader(w, r.Body, limit)
	}
	clock := d.newBodyClock(time.Now())
	rc := http.NewResponseController(w)
	var buf []byte
	for {
		if len(buf) == cap(buf) && int64(cap(buf)) == size {
			// As large as the body may be. At its declared length it
			// has ended (net/http reads no further); a chunked body
			// must end here.
			if !known {
				if err := atEnd(src, rc, clock, size); err != nil {
					b.Release()
					return nil, d.readError(err, limit, clock, size)
				}
			}
			break
		}
		if len(buf) == cap(buf) {
			grown := min(max(2*int64(cap(buf)), BodyChunk), size)
			waited, err := d.take(r.Context(), b, grown-int64(cap(buf)))
			if err != nil {
				b.Release()
				return nil, err
			}
			clock.pause(waited)
			nb := make([]byte, len(buf), grown)
			copy(nb, buf)
			buf = nb
		}
		clock.arm(rc, int64(len(buf)))
		n, err := src.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF && known && int64(len(buf)) < size {
			err = io.ErrUnexpectedEOF // net/http says so itself; another reader may not
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			b.Release()
			return nil, d.readError(err, limit, clock, int64(len(buf)))
		}
	}
	// Read whole: no deadline on later reads, which net/http makes to
	// notice a client that hangs up while its answer streams (a timeout
	// there would end the answer).
	_ = rc.SetReadDeadline(time.Time{})
	b.Bytes = buf
	return b, nil
}

// errPastBound is a body with more bytes than its declared length or cap.
var errPastBound = errors.New("body longer than its bound")

// atEnd reads what follows a body that has filled its bound: nothing
// (nil), or more (errPastBound, or the read's error).
func atEnd(src io.Reader, rc *http.ResponseController, clock *bodyClock, read int64) error {
	var one [1]byte
	for {
		clock.arm(rc, read)
		n, err := src.Read(one[:])
		switch {
		case n > 0:
			return errPastBound
		case err == io.EOF:
			return nil
		case err != nil:
			return err
		}
	}
}

func (d *Door) readError(err error, limit int64, clock *bodyClock, got int64) error {
	var tooBig *http.MaxBytesError
	var ne net.Error
	switch {
	case errors.As(err, &tooBig), errors.Is(err, errPastBound):
		return &BodyError{Err: ErrTooLarge, Status: http.StatusRequestEntityTooLarge, Limit: limit}
	case errors.As(err, &ne) && ne.Timeout():
		after := time.Since(clock.began)
		if clock.rateDue {
			d.refused.Refuse("slow_body", "request body ended: slower than the minimum rate",
				"min_rate_kib", clock.rate>>10, "bytes", got, "after", after.Round(time.Millisecond))
			return &BodyError{Err: ErrBodyTooSlow, Status: http.StatusRequestTimeout, got: got, after: after, rate: clock.rate}
		}
		d.refused.Refuse("slow_body", "request body timed out", "timeout", d.limits.BodyTimeout, "bytes", got)
		return &BodyError{Err: ErrSlowBody, Status: http.StatusRequestTimeout, got: got, after: after}
	case errors.Is(err, io.ErrUnexpectedEOF):
		return &BodyError{Err: fmt.Errorf("the body ended before its Content-Length: %w", err), Status: http.StatusBadRequest}
	}
	return &BodyError{Err: err, Status: http.StatusBadRequest}
}

// bodyClock is when a body's next byte is due: by the body timeout from
// its start, and, with a minimum rate, by the time the bytes so far would
// have taken at that rate after the grace.
type bodyClock struct {
	began time.Time // when the read began
	start time.Time // began, moved on by the waits for memory
	end   time.Time // the body timeout
	grace time.Duration
	rate  int64 // bytes per second; 0: no minimum

	set     time.Time // the deadline set last
	rateDue bool      // whether that is the rate's
}

func (d *Door) newBodyClock(now time.Time) *bodyClock {
	return &bodyClock{began: now, start: now, end: now.Add(d.limits.BodyTimeout), grace: d.limits.BodyRateGrace, rate: max(d.limits.MinBodyRate, 0)}
}

// pause moves the rate's start on by the time the body waited for memory
// (it read nothing meanwhile, through no fault of its own). The body
// timeout stays.
func (c *bodyClock) pause(waited time.Duration) { c.start = c.start.Add(waited) }

// due is when the byte after read is due.
func (c *bodyClock) due(read int64) (time.Time, bool) {
	if c.rate <= 0 {
		return c.end, false
	}
	// (read+1)/rate seconds, without overflow for any body size: whole
	// seconds, and the rest (below rate, at most ~1e9) in nanoseconds.
	n := read + 1
	at := time.Duration(n/c.rate)*time.Second + time.Duration(n%c.rate*int64(time.Second)/c.rate)
	// Rounded up to a whole second past the start: lenient by under a
	// second, and the deadline moves at most once per second of rate
	// time (each move is a message to the connection's goroutine on
	// HTTP/2).
	at = (c.grace + at + time.Second - 1).Truncate(time.Second)
	if due := c.start.Add(at); due.Before(c.end) {
		return due, true
	}
	return c.end, false
}

// arm sets the read deadline for the byte after read, if it moved.
func (c *bodyClock) arm(rc *http.ResponseController, read int64) {
	due, rate := c.due(read)
	if due.Equal(c.set) {
		return
	}
	c.set, c.rateDue = due, rate
	_ = rc.SetReadDeadline(due)
}

// budget is the door's body memory and its shares (see the top of this
// file). Growths are granted first-fit in arrival order: a growth that
// does not fit does not hold back smaller ones behind it, since every
// body grows step by step and the bodies it would hold back are the ones
// that, once whole, give memory back.
type budget struct {
	total, perPrincipal, perConn int64

	mu          sync.Mutex
	used        int64
	byPrincipal map[string]int64
	waiters     []*bodyWaiter
}

// bodyWaiter is a growth waiting for memory.
type bodyWaiter struct {
	b       *Body
	n       int64
	ready   chan struct{} // closed when granted
	granted bool
	full    share // why it waits, as of the last look
}

// fits says which share n more bytes for b would overflow, or shareNone.
func (bu *budget) fits(b *Body, n int64) share {
	switch {
	case bu.byPrincipal[b.principal]+n > bu.perPrincipal:
		return sharePrincipal
	case b.conn != nil && b.conn.bodies+n > bu.perConn:
		return shareConn
	case bu.used+n > bu.total:
		return shareEdge
	}
	return shareNone
}

func (bu *budget) chargeLocked(b *Body, n int64) {
	bu.used += n
	bu.byPrincipal[b.principal] += n
	if b.conn != nil {
		b.conn.bodies += n
	}
	b.n += n
}

// give returns b's memory and grants the growths it makes room for.
func (bu *budget) give(b *Body) {
	if b.n == 0 {
		return
	}
	bu.mu.Lock()
	defer bu.mu.Unlock()
	bu.used -= b.n
	if left := bu.byPrincipal[b.principal] - b.n; left > 0 {
		bu.byPrincipal[b.principal] = left
	} else {
		delete(bu.byPrincipal, b.principal)
	}
	if b.conn != nil {
		b.conn.bodies -= b.n
	}
	b.n = 0
	for i := 0; i < len(bu.waiters); {
		w := bu.waiters[i]
		if w.full = bu.fits(w.b, w.n); w.full != shareNone {
			i++
			continue
		}
		bu.chargeLocked(w.b, w.n)
		w.granted = true
		close(w.ready)
		bu.waiters = slices.Delete(bu.waiters, i, i+1)
	}
}

// take adds n bytes to b's charge, waiting up to BodyWait for room; it
// returns how long it waited.
func (d *Door) take(ctx context.Context, b *Body, n int64) (time.Duration, error) {
	bu := &d.bodies
	bu.mu.Lock()
	full := bu.fits(b, n)
	if full == shareNone {
		bu.chargeLocked(b, n)
		bu.mu.Unlock()
		return 0, nil
	}
	w := &bodyWaiter{b: b, n: n, ready: make(chan struct{}), full: full}
	bu.waiters = append(bu.waiters, w)
	bu.mu.Unlock()

	began := time.Now()
	t := time.NewTimer(d.limits.BodyWait)
	defer t.Stop()
	select {
	case <-w.ready:
	case <-t.C:
	case <-ctx.Done():
	}
	bu.mu.Lock()
	granted, full := w.granted, w.full
	if !granted {
		if i := slices.Index(bu.waiters, w); i >= 0 {
			bu.waiters = slices.Delete(bu.waiters, i, i+1)
		}
	}
	bu.mu.Unlock()
	if granted {
		return time.Since(began), nil
	}
	switch full {
	case sharePrincipal:
		d.refused.Refuse("body_memory_principal", "request body refused: its principal holds its share of body memory",
			"principal", b.principal, "share", bu.perPrincipal)
	case shareConn:
		d.refused.Refuse("body_memory_connection", "request body refused: its connection holds as much body memory as one connection may",
			"share", bu.perConn)
	default:
		d.refused.Refuse("body_memory", "request body refused: the body memory limit is reached", "limit", bu.total, "size", n)
	}
	return 0, &BodyError{Err: ErrBusy, Status: http.StatusServiceUnavailable, RetryAfter: time.Second, full: full, principal: b.principal}
}

// drainWindow is how long net/http may go on reading, after the handler,
// what the handler left unread of a body: the rest of a body a client is
// sending (at most 256 KiB) arrives within it at any usable rate, and the
// connection is kept.
const drainWindow = 2 * time.Second

// drained bounds what net/http reads, after the handler, of a body the
// handler left unread (HTTP/1.x; HTTP/2 resets the stream instead). To
// keep the connection, net/http reads up to 256 KiB of it before it
// writes the answer, with no deadline of its own: a request refused
// before its body (401, a body the front end refused) that declares a body
// and sends none would hold its connection, active, forever, and its
// answer with it. A deadline drainWindow away ends that read; the answer
// is then written and the connection closed. A body read to its end (by
// ReadBody) leaves nothing to read and no deadline is set.
//
// The handler gets a shallow copy of the request with the body wrapped:
// net/http decides how to treat an unread body by the type of its own
// request's Body (a body past 256 KiB is not read at all, and the
// connection is closed after a pause that lets the client read the
// answer), so that must stay its own.
func (d *Door) drained(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ProtoMajor != 1 || r.ContentLength == 0 {
			h.ServeHTTP(w, r)
			return
		}
		body := &eofWatch{ReadCloser: r.Body}
		watched := *r
		watched.Body = body
		h.ServeHTTP(w, &watched)
		if !body.eof {
			_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(drainWindow))
		}
	})
}

// eofWatch is a request body that remembers whether it was read to its
// end.
type eofWatch struct {
	io.ReadCloser
	eof bool
}

func (b *eofWatch) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.eof = true
	}
	return n, err
}
