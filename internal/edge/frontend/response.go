package frontend

import (
	"errors"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// Response is the client's answer, as the request's life and its API's
// writer put it together. It is committed (status and headers) at the
// first byte, so that work that fails before any is answered with an HTTP
// error instead; every write has the idle timeout as its deadline, so a
// client that stops reading cannot hold the handler; and a streamed event
// is flushed at once unless the work's next piece has arrived already,
// when one flush carries both (Exchange.flush), but for the answer's first
// piece, which is never held (Exchange.coalesceAfterFirst).
//
// Writes are the handler goroutine's, but for keep-alives, which a timer
// writes while the handler waits for a slot or a silent prefill: mu orders
// them. Only an answer with keep-alives takes it (shared), so a
// relayed body or an answer without keep-alives pays for no lock and no
// clock read per event.
type Response struct {
	x  *Exchange
	rc *http.ResponseController
	// shared: keep-alives are written too. Set before their timer starts,
	// never unset.
	shared bool

	mu          sync.Mutex
	status      int               // the status to commit with (0: 200)
	contentType string            // the Content-Type of a stream
	preamble    func() []byte     // written right after the commit, under mu
	header      func(http.Header) // sets the headers of a relayed answer at commit
	committed   bool              // status and headers have gone
	ended       bool              // the stream's end (last event or error) went: nothing more
	first       bool              // the first byte of the answer went (time to first token)
	lastWrite   time.Time
}

func newResponse(x *Exchange) *Response {
	return &Response{x: x, rc: http.NewResponseController(x.w)}
}

// Stream makes the answer a stream of contentType: an event stream
// ("text/event-stream") or NDJSON ("application/x-ndjson"), told to
// proxies not to buffer or cache. preamble, if not nil, is written right
// after the commit, whoever commits (an answer event or a keep-alive): a
// stream's opening event that says what is coming (Anthropic's
// message_start). It runs under the response's lock.
func (r *Response) Stream(contentType string, preamble func() []byte) {
	r.mu.Lock()
	r.contentType, r.preamble = contentType, preamble
	r.mu.Unlock()
}

// Relay makes the answer a provider's own (a raw tunnel): it is committed
// with status and the headers header sets.
func (r *Response) Relay(status int, header func(http.Header)) {
	r.mu.Lock()
	r.status, r.header = status, header
	r.mu.Unlock()
}

// Committed reports whether the answer has started: from then on an error
// can only be told in the stream, in the API's shape.
func (r *Response) Committed() bool {
	if r.shared {
		r.mu.Lock()
		defer r.mu.Unlock()
	}
	return r.committed
}

// Progress notes that the work made progress toward an answer sent whole
// (an event gathered, not yet written): the idle timer starts over.
func (r *Response) Progress() { r.x.Wrote() }

// Commit sends the status and headers now, if nothing has gone yet: the
// answer's first byte (a relayed head without a body). It reports false
// when the client could not be written to.
func (r *Response) Commit() bool {
	if r.shared {
		r.mu.Lock()
		defer r.mu.Unlock()
	}
	if r.committed {
		return true
	}
	r.first = true
	r.x.firstByte()
	r.x.beforeWrite()
	return r.commitLocked()
}

// Event writes one piece of a streamed answer: an event, a line, a read
// of a relayed body. The first commits the response and is the answer's
// first byte. It reports false when the client could not be written to.
func (r *Response) Event(p []byte) bool {
	if r.shared {
		r.mu.Lock()
		defer r.mu.Unlock()
	}
	if !r.first {
		r.first = true
		r.x.firstByte()
	}
	if !r.writeLocked(p, true) {
		return false
	}
	r.x.Wrote()
	return true
}

// End writes the last piece of a stream, flushed at once: its final event
// or the error it ends with. Nothing is written after it, keep-alives
// included. It reports false when the client could not be written to.
func (r *Response) End(p []byte) bool {
	if r.shared {
		r.mu.Lock()
		defer r.mu.Unlock()
	}
	r.ended = true
	return r.writeLocked(p, false)
}

// Whole writes an answer sent whole: status, contentType and body, with
// its length. It reports false when the client could not be written to.
func (r *Response) Whole(status int, contentType string, body []byte) bool {
	if r.shared {
		r.mu.Lock()
		defer r.mu.Unlock()
	}
	r.x.firstByte()
	r.first, r.committed, r.ended = true, true, true
	h := r.x.w.Header()
	h.Set("Content-Type", contentType)
	h.Set("Content-Length", strconv.Itoa(len(body)))
	r.x.beforeWrite()
	r.x.w.WriteHeader(status)
	_, err := r.x.w.Write(body)
	return err == nil
}

// Write writes p of an answer sent whole in pieces (a large one, through
// a buffer), committing contentType's status 200 first: the io.Writer of
// WriteWhole. Each write resets the idle timer.
func (r *Response) Write(p []byte) (int, error) {
	if r.shared {
		r.mu.Lock()
		defer r.mu.Unlock()
	}
	if !r.first {
		r.first = true
		r.x.firstByte()
	}
	r.x.beforeWrite()
	if !r.committed {
		r.commitLocked()
	}
	n, err := r.x.w.Write(p)
	if n > 0 {
		r.x.Wrote()
	}
	return n, err
}

// writeLocked writes p, committing first; event says whether its flush may
// wait for the work's next piece. Callers hold mu.
func (r *Response) writeLocked(p []byte, event bool) bool {
	r.x.beforeWrite()
	if !r.committed {
		if !r.commitLocked() {
			return false
		}
	}
	if _, err := r.x.w.Write(p); err != nil {
		return false
	}
	var err error
	if event {
		err = r.x.flush(r.rc)
	} else {
		err = r.rc.Flush()
	}
	if err != nil && !errors.Is(err, http.ErrNotSupported) {
		return false
	}
	if r.shared {
		r.lastWrite = time.Now()
	}
	return true
}

// commitLocked sends the status and headers, and a stream's preamble.
// Callers hold mu.
func (r *Response) commitLocked() bool {
	r.committed = true
	h := r.x.w.Header()
	switch {
	case r.header != nil:
		r.header(h)
	case r.contentType != "":
		h.Set("Content-Type", r.contentType)
		h.Set("Cache-Control", "no-cache")
		h.Set("X-Accel-Buffering", "no") // tell proxies not to buffer
	}
	r.x.w.WriteHeader(max(r.status, http.StatusOK))
	if r.preamble != nil {
		if _, err := r.x.w.Write(r.preamble()); err != nil {
			return false
		}
	}
	return true
}

// keepAlive writes line whenever nothing has gone to the client for
// interval, until the returned stop is called (after which none is
// written): a comment or a ping the API's clients skip. The first one
// commits the response, so a request waiting in the queue or in a silent
// prefill gets its headers and a line now and then, and proxies with a
// first-byte limit do not cut it. They are not answer bytes: the idle
// timer does not hear of them.
//
// The keep-alives are a timer, due interval after the last write, not a
// goroutine: a streamed request waiting through a prefill holds no stack
// for them (issue 25), and an answer that is flowing costs one wake-up per
// interval.
func (r *Response) keepAlive(interval time.Duration, line []byte) (stop func()) {
	if interval <= 0 || line == nil {
		return func() {}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.shared, r.lastWrite = true, time.Now()
	k := &keepAlives{r: r, interval: interval, line: line}
	k.timer = time.AfterFunc(interval, k.due)
	return k.stop
}

// keepAlives is a response's keep-alive timer (keepAlive).
type keepAlives struct {
	r        *Response
	interval time.Duration
	line     []byte
	timer    *time.Timer
	stopped  bool // under r.mu: no more keep-alives
}

// due writes a keep-alive if nothing went for the interval, and sets the
// timer for the next.
func (k *keepAlives) due() {
	r := k.r
	r.mu.Lock()
	defer r.mu.Unlock()
	if k.stopped || r.ended {
		return
	}
	next := k.interval - time.Since(r.lastWrite)
	if next <= 0 {
		r.writeLocked(k.line, false)
		next = k.interval
	}
	k.timer.Reset(next)
}

// stop ends the keep-alives: once it returns none is written, as a due
// one waiting for the lock finds them stopped.
func (k *keepAlives) stop() {
	k.r.mu.Lock()
	k.stopped = true
	k.r.mu.Unlock()
	k.timer.Stop()
}
