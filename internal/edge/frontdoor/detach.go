package frontdoor

import (
	"bufio"
	"context"
	"errors"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/iop-dev/iop/internal/netpeek"
)

// A request that waits long for its answer (a run in a model's prefill,
// for minutes under load) need not hold what net/http keeps for a
// connection while its handler runs: a goroutine whose stack grew with the
// whole handler chain, a 4 KiB reader, a 4 KiB writer and a 2 KiB
// response buffer, ~20 KiB a request (P3: ten thousand waiting requests
// are ten thousand of them). Detach takes such a request's connection from
// net/http once its body is read: the request goes on in a goroutine of
// its own, which holds only what its work needs, and writes its answer as
// HTTP/1.1 itself (Detached). When the answer ends, the connection goes
// back to the server through the door's listener, as if newly accepted,
// and its next request is net/http's again: keep-alive is kept, and the
// connection stays counted against the caps all along.
//
// Only a plain HTTP/1.1 request that asks to keep its connection is
// detached, and only on a connection the door accepted. HTTP/2 multiplexes
// its streams over one connection and cannot give one away; a TLS
// connection is served by net/http's own TLS listener, which a connection
// cannot be given back to; HTTP/1.0 and "Connection: close" gain nothing.
// Those are served by net/http as before.

// ErrClientGone is the cause a detached request's context is cancelled
// with when its client closes the connection.
var ErrClientGone = errors.New("client closed the connection")

// Detached is a request taken from net/http (Door.Detach): its context and
// its response writer, an http.ResponseWriter and http.Flusher that writes
// HTTP/1.1 on the connection, with the write deadline of
// http.ResponseController. Its methods are for one goroutine, as a
// handler's are; Finish ends the response and gives the connection back.
type Detached struct {
	d    *Door
	tc   *trackedConn
	req  *http.Request
	stop context.CancelCauseFunc

	header  http.Header
	status  int  // the status WriteHeader set; 0 before
	sent    bool // the status line and header are written
	chunked bool // the body goes in chunks (no Content-Length)
	left    int64
	sized   bool   // the header set Content-Length: left is what remains
	pending []byte // body written before the header went
	bw      *bufio.Writer
	err     error // the first write error: the connection is not reused
	keep    bool  // the connection may serve another request
	ended   bool  // Finish or Abort ran

	// The watch of the connection (connPoller): mu orders its events
	// against Finish, the idle timer and the door's stop.
	poller  *connPoller
	watch   int32 // the registration id
	mu      sync.Mutex
	watched bool        // registered, and its event not yet taken
	gone    bool        // the client's end came before the answer's
	phase   detachPhase // answering, then parked, then done
	idle    *time.Timer // while parked: the idle timeout
}

// detachPhase is where a detached connection is: its answer being
// written, then parked (idle, waiting for its next request), then done
// (given back to the server, or closed).
type detachPhase uint8

const (
	answering detachPhase = iota
	parked
	done
)

// Detach takes r's connection from net/http, if r may be detached (see
// above), and returns the request and its writer; nil leaves r with
// net/http. r's body must have been read to its end, and nothing written
// to w yet; the headers already set on w are kept. After Detach returns
// non-nil the handler must return at once without touching w, and the
// request goes on with Detached: its Request's context is cancelled with
// ErrClientGone when the client closes the connection, and its body is
// empty. r itself must not be kept: its body holds net/http's buffer.
func (d *Door) Detach(w http.ResponseWriter, r *http.Request) *Detached {
	tc := connOf(r.Context())
	hj, ok := w.(http.Hijacker)
	if tc == nil || !ok || r.TLS != nil || r.ProtoMajor != 1 || r.ProtoMinor < 1 || r.Close || r.Method == http.MethodHead || !readWhole(r) {
		return nil
	}
	poller := newConnPoller() // made at the first detach, not in a test's bubble that never detaches
	if poller == nil {
		return nil
	}
	d.connsMu.Lock()
	if tc.state == connGone {
		d.connsMu.Unlock()
		return nil
	}
	tc.detached = true // counted on through the hijack (connState)
	d.connsMu.Unlock()
	nc, brw, err := hj.Hijack()
	if err != nil {
		d.connsMu.Lock()
		tc.detached = false
		d.connsMu.Unlock()
		return nil
	}
	if nc != net.Conn(tc) {
		// Not the door's connection after all (a wrapped one): served
		// to its end here, and closed.
		tc = &trackedConn{Conn: nc, d: d, state: connGone}
	}
	if n := brw.Reader.Buffered(); n > 0 {
		// The client sent its next request already: it is read first
		// when the connection is served again.
		b, _ := brw.Reader.Peek(n)
		tc.early = append([]byte(nil), b...)
	}
	ctx, stop := context.WithCancelCause(context.WithoutCancel(r.Context()))
	req := r.WithContext(ctx)
	req.Body = http.NoBody // read whole; net/http's reads through the connection's buffer, which must not stay
	dt := &Detached{d: d, tc: tc, req: req, stop: stop, header: w.Header(), keep: tc.state != connGone, poller: poller}
	d.detached.Add(1)
	if len(tc.early) == 0 { // as net/http: a client that sent more is not watched
		dt.watched = true
		if err := dt.poller.add(dt); err != nil {
			dt.watched, dt.keep = false, false // not watched: closed after its answer
		}
	}
	return dt
}

// readWhole reports whether r's body was read to its end (see drained):
// what is left of it would be read as the next request.
func readWhole(r *http.Request) bool {
	if r.ContentLength == 0 {
		return true
	}
	b, ok := r.Body.(*eofWatch)
	return ok && b.eof
}

// ready takes an event of the watch (on the poller's goroutine). While
// the answer is written, the client sends nothing: its end is the client
// gone, and bytes are its next request begun early (no longer watched, as
// net/http watches no further). Once parked, bytes are the next request:
// the connection goes back to the server; its end closes it.
func (dt *Detached) ready(r netpeek.Readiness) {
	dt.mu.Lock()
	if !dt.watched {
		dt.mu.Unlock()
		return
	}
	if r == netpeek.Nothing {
		if err := dt.poller.rearm(dt); err == nil {
			dt.mu.Unlock()
			return
		}
		r = netpeek.Ended
	}
	dt.unwatchLocked(true)
	phase := dt.phase
	if phase == answering {
		dt.gone = r == netpeek.Ended
		dt.mu.Unlock()
		if r == netpeek.Ended {
			dt.stop(ErrClientGone)
		}
		return
	}
	dt.phase = done
	if dt.idle != nil {
		dt.idle.Stop()
	}
	dt.mu.Unlock()
	dt.nextFromPoller(r == netpeek.Bytes)
}

// expire closes a parked connection: its idle timeout passed, or the door
// stops.
func (dt *Detached) expire() {
	dt.mu.Lock()
	if dt.phase != parked {
		dt.mu.Unlock()
		return
	}
	dt.phase = done
	if dt.idle != nil {
		dt.idle.Stop()
	}
	dt.unwatchLocked(false)
	dt.mu.Unlock()
	dt.next(false)
}

// next gives the connection back to the server for its next request, or
// closes it. It waits for the server's Accept.
func (dt *Detached) next(again bool) {
	if dt.unpark(again) {
		dt.handBack()
	}
}

// handBack gives an unparked connection to the server, waiting for its
// Accept; the connection is closed if the server is gone.
func (dt *Detached) handBack() {
	if dt.d.giveBack(dt.tc, true) != handed {
		_ = dt.tc.Close()
	}
}

// nextFromPoller is next on the poller's goroutine, which must not wait
// for the server's Accept. The server is nearly always waiting in Accept,
// and then takes the connection at once, here: the next request starts
// without a goroutine started and scheduled to hand it over (issue 25:
// no hand-off between goroutines that a direct call can replace). When
// Accept is busy, a goroutine of its own waits for it.
func (dt *Detached) nextFromPoller(again bool) {
	if !dt.unpark(again) {
		return
	}
	switch dt.d.giveBack(dt.tc, false) {
	case refused:
		_ = dt.tc.Close()
	case busy:
		go dt.handBack()
	}
}

// unpark takes a parked connection out of the door's list, and reports
// whether it can serve again: if not (again false, or its deadline cannot
// be cleared), it is closed.
func (dt *Detached) unpark(again bool) bool {
	tc, d := dt.tc, dt.d
	d.connsMu.Lock()
	delete(d.parked, dt)
	d.connsMu.Unlock()
	if !again || tc.Conn.SetDeadline(time.Time{}) != nil {
		_ = tc.Close()
		return false
	}
	return true
}

// Request is the request, with its detached context.
func (dt *Detached) Request() *http.Request { return dt.req }

// Header is the response's header map, as http.ResponseWriter's.
func (dt *Detached) Header() http.Header { return dt.header }

// WriteHeader sets the response's status; the header goes with the first
// flush of the body (or at Finish), as net/http's does. Only the first
// call counts; informational statuses (1xx) are not supported and ignored.
func (dt *Detached) WriteHeader(code int) {
	if dt.status != 0 || code < 200 || code > 999 {
		return
	}
	dt.status = code
	if cl := dt.header.Get("Content-Length"); cl != "" {
		if n, err := strconv.ParseInt(cl, 10, 64); err == nil && n >= 0 {
			dt.left, dt.sized = n, true
		} else {
			dt.header.Del("Content-Length")
		}
	}
}

// bodyAllowed reports whether the status may have a body (RFC 9110 6.4.1).
func (dt *Detached) bodyAllowed() bool {
	return dt.status != http.StatusNoContent && dt.status != http.StatusNotModified
}

// Write writes p to the body: held until the first flush (or 2 KiB), so
// that an answer written whole goes with its Content-Length; chunked after.
func (dt *Detached) Write(p []byte) (int, error) {
	if dt.status == 0 {
		dt.WriteHeader(http.StatusOK)
	}
	if !dt.bodyAllowed() {
		return 0, http.ErrBodyNotAllowed
	}
	if dt.sized {
		if int64(len(p)) > dt.left {
			return 0, http.ErrContentLength
		}
		dt.left -= int64(len(p))
	}
	if dt.err != nil {
		return 0, dt.err
	}
	if !dt.sent {
		if len(dt.pending)+len(p) <= heldBody {
			dt.pending = append(dt.pending, p...)
			return len(p), nil
		}
		dt.sendHeader(-1)
	}
	dt.writeBody(p)
	if dt.err != nil {
		return 0, dt.err
	}
	return len(p), nil
}

// heldBody is how much of a body is held before its header goes: net/http's
// bufferBeforeChunkingSize.
const heldBody = 2048

// Flush sends the header, if it has not gone, and what was written.
func (dt *Detached) Flush() { _ = dt.FlushError() }

// FlushError is Flush, with its error (http.ResponseController).
func (dt *Detached) FlushError() error {
	if dt.status == 0 {
		dt.WriteHeader(http.StatusOK)
	}
	if !dt.sent {
		dt.sendHeader(-1)
	}
	if dt.err == nil && dt.bw != nil {
		dt.err = dt.bw.Flush()
	}
	dt.putWriter()
	return dt.err
}

// writer is the answer's write buffer, taken from the pool when a write
// needs one: it is held from a write to the flush that follows, not
// between flushes, so a stream waiting for its next token holds none.
func (dt *Detached) writer() *bufio.Writer {
	if dt.bw == nil {
		dt.bw = writers.Get().(*bufio.Writer)
		dt.bw.Reset(dt.tc.Conn)
	}
	return dt.bw
}

// putWriter gives the write buffer back, flushed (or failed).
func (dt *Detached) putWriter() {
	if dt.bw != nil {
		dt.bw.Reset(nil)
		writers.Put(dt.bw)
		dt.bw = nil
	}
}

// SetWriteDeadline sets the deadline of writes to the client
// (http.ResponseController).
func (dt *Detached) SetWriteDeadline(t time.Time) error { return dt.tc.Conn.SetWriteDeadline(t) }

// sendHeader writes the status line and header, and the body held so far.
// length is the whole body's, when it is known (Finish), or -1.
func (dt *Detached) sendHeader(length int) {
	dt.sent = true
	bw := dt.writer()
	h := dt.header
	if h.Get("Date") == "" {
		h.Set("Date", time.Now().UTC().Format(http.TimeFormat))
	}
	allowed := dt.bodyAllowed()
	if allowed && h.Get("Content-Type") == "" && len(dt.pending) > 0 {
		h.Set("Content-Type", http.DetectContentType(dt.pending))
	}
	if connectionClose(h) {
		dt.keep = false
	}
	switch {
	case !allowed || dt.sized:
	case length >= 0:
		h.Set("Content-Length", strconv.Itoa(length))
	default:
		dt.chunked = true
		h.Set("Transfer-Encoding", "chunked")
	}
	b := make([]byte, 0, 64)
	b = append(b, "HTTP/1.1 "...)
	b = strconv.AppendInt(b, int64(dt.status), 10)
	b = append(b, ' ')
	if text := http.StatusText(dt.status); text != "" {
		b = append(b, text...)
	} else {
		b = append(b, "status code "...)
		b = strconv.AppendInt(b, int64(dt.status), 10)
	}
	b = append(b, "\r\n"...)
	_, _ = bw.Write(b)
	if err := h.Write(bw); err != nil {
		dt.err = err
		return
	}
	_, _ = bw.WriteString("\r\n")
	pending := dt.pending
	dt.pending = nil
	if allowed && len(pending) > 0 {
		dt.writeBody(pending)
	}
}

// writeBody writes p as the body's next part: a chunk, or as it is.
func (dt *Detached) writeBody(p []byte) {
	if dt.err != nil || len(p) == 0 {
		return
	}
	bw := dt.writer()
	if dt.chunked {
		var size [18]byte
		b := strconv.AppendUint(size[:0], uint64(len(p)), 16)
		b = append(b, '\r', '\n')
		_, _ = bw.Write(b)
	}
	_, dt.err = bw.Write(p)
	if dt.chunked && dt.err == nil {
		_, dt.err = bw.WriteString("\r\n")
	}
}

// connectionClose reports whether h says the connection closes after this
// response.
func connectionClose(h http.Header) bool {
	for _, v := range h["Connection"] {
		for t := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), "close") {
				return true
			}
		}
	}
	return false
}

// Finish ends the response: the header, if it has not gone (with the
// body's length, if it was written whole), and the last chunk. The
// connection then waits for its next request (watch) and goes back to the
// server with it; it is closed instead when it cannot serve one (a write
// failed, the client went, the body is shorter than its Content-Length, or
// the answer said Connection: close). The context of the request is
// released.
func (dt *Detached) Finish() {
	if dt.ended {
		return
	}
	dt.ended = true
	defer dt.d.detached.Done()
	defer dt.stop(nil)
	if dt.status == 0 {
		dt.WriteHeader(http.StatusOK)
	}
	if !dt.sent {
		dt.sendHeader(len(dt.pending))
	} else if dt.chunked && dt.err == nil {
		_, dt.err = dt.writer().WriteString("0\r\n\r\n")
	}
	if dt.err == nil && dt.bw != nil {
		dt.err = dt.bw.Flush()
	}
	dt.putWriter()
	dt.req, dt.header, dt.pending = nil, nil, nil // the idle wait holds none of the request

	keep := dt.keep && dt.err == nil && (!dt.sized || dt.left == 0)
	if keep {
		_ = dt.tc.Conn.SetWriteDeadline(time.Time{})
	}
	dt.mu.Lock()
	switch {
	case !keep || dt.gone:
		dt.mu.Unlock()
		dt.Abort()
	case dt.watched:
		// Idle until its next request; parked first, so that an event
		// that comes at once finds it so.
		dt.phase = parked
		dt.d.park(dt)
		if t := dt.d.limits.IdleTimeout; t > 0 {
			dt.idle = time.AfterFunc(t, dt.expire)
		}
		dt.mu.Unlock()
	default:
		// Its next request began during the answer: served now.
		dt.phase = done
		dt.mu.Unlock()
		dt.next(true)
	}
}

// Abort ends the response where it is and closes the connection, as
// net/http does when a handler panics: the client sees the answer cut
// off, never a connection that seems to carry a whole one. It is for a
// request whose goroutine could not get to Finish.
func (dt *Detached) Abort() {
	if !dt.ended {
		dt.ended = true
		defer dt.d.detached.Done()
		defer dt.stop(nil)
	}
	dt.mu.Lock()
	dt.phase = done
	dt.unwatchLocked(false)
	dt.mu.Unlock()
	_ = dt.tc.Close()
}

// unwatchLocked stops the watch, if it runs; fired says its one-shot
// event came, which disarmed it. dt.mu is held.
func (dt *Detached) unwatchLocked(fired bool) {
	if dt.watched {
		dt.watched = false
		dt.poller.remove(dt, fired)
	}
}

// park records dt's connection as idle, waiting for its next request off
// the server: quiet, so that a new connection may take its place, and
// closed by WaitDetached when the Edge stops.
func (d *Door) park(dt *Detached) {
	d.setState(dt.tc, connIdle)
	d.connsMu.Lock()
	defer d.connsMu.Unlock()
	if dt.tc.state != connGone {
		d.parked[dt] = struct{}{}
	}
}

// writers are the buffers of detached answers, taken for a write and
// given back at the flush that follows: a waiting request, and a stream
// between two tokens, holds none.
var writers = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, 4<<10) }}

// giveBack hands c, whose detached answer ended, to the server again
// through the listener that accepted it: idle, as between two requests.
// If wait, it waits for the server's Accept; if not, it is busy unless
// Accept is waiting now. Refused: c is gone, or the listener closed.
func (d *Door) giveBack(c *trackedConn, wait bool) handBack {
	d.connsMu.Lock()
	c.detached = false
	gone := c.state == connGone
	d.connsMu.Unlock()
	if gone || c.ln == nil {
		return refused
	}
	return c.ln.giveBack(c, wait)
}

// WaitDetached waits until every detached answer has ended, or ctx is
// done, and closes the connections waiting idle for their next request. A
// stopping Edge calls it after the server's Shutdown, which does not know
// the connections it gave away.
func (d *Door) WaitDetached(ctx context.Context) error {
	defer func() {
		d.connsMu.Lock()
		parked := make([]*Detached, 0, len(d.parked))
		for dt := range d.parked {
			parked = append(parked, dt)
		}
		d.connsMu.Unlock()
		for _, dt := range parked {
			dt.expire()
		}
	}()
	done := make(chan struct{})
	go func() {
		d.detached.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
