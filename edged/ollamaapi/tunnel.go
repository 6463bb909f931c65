package ollamaapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/textproto"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/iop-dev/iop/edged/auth"
	"github.com/iop-dev/iop/edged/frontdoor"
	"github.com/iop-dev/iop/quicwire"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// maxRequestBody bounds a tunnelled request's body, which is held in
// memory (the gateway may send it to a second candidate). Images go in
// chat requests as base64, so it is generous; how many such bodies are
// held at once is the front door's body memory to bound (P3).
const maxRequestBody = 32 << 20

// bufPool holds relay buffers of one tunnel body frame: a Read returns at
// most one frame, so each frame is one write and one flush.
var bufPool = sync.Pool{New: func() any { b := make([]byte, quicwire.MaxBodyChunkSize); return &b }}

// hopByHop are the headers that belong to one connection (RFC 9110 7.6.1)
// and are never relayed, in either direction.
var hopByHop = map[string]bool{
	"Connection": true, "Keep-Alive": true, "Proxy-Authenticate": true,
	"Proxy-Authorization": true, "Proxy-Connection": true, "Te": true,
	"Trailer": true, "Transfer-Encoding": true, "Upgrade": true,
}

// notForwarded are request headers kept from the provider for other
// reasons. Authorization, X-Api-Key and Cookie carry the client's
// credentials to the Edge, never to travel further. Host and Content-Length
// are the Node's to set. Accept-Encoding is dropped so that the provider
// answers uncompressed: a compressed stream would hold lines back, and an
// error line could not be appended to it.
var notForwarded = map[string]bool{
	"Authorization": true, "X-Api-Key": true, "Cookie": true,
	"Host": true, "Content-Length": true, "Accept-Encoding": true,
}

// tunnelled serves one of the endpoints relayed to a Node's Ollama. The
// model is the body's "model"; for show, Ollama's deprecated "name" too.
func (h *handler) tunnelled(route string, nameToo bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		x := &exchange{h: h, w: w, r: r, route: route, arrived: time.Now()}
		p, ok := h.authenticate(w, r, route)
		if !ok {
			return
		}
		x.p = p
		body, e := x.readBody(nameToo)
		if e != nil {
			x.end(e)
			return
		}
		// The body's share of the door's memory is given back once
		// StartTunnel no longer needs it for another candidate.
		defer body.Release()
		profile, err := h.runner.Profile(p, x.model)
		if err != nil {
			x.end(startError(err, nil, x.model))
			return
		}
		x.idleAfter = time.Duration(profile.IdleTimeout)
		x.wd = frontdoor.NewWriteDeadline(w, x.idleAfter)
		x.end(x.serve(body))
	}
}

// exchange is one tunnelled request from its body to its last byte. The
// handler's goroutine alone reads the tunnel and writes the response. The
// idle timer and the client-gone watch only call stop, which cancels the
// tunnel; the tunnel's terminal brings that news back to the handler's
// goroutine.
type exchange struct {
	h       *handler
	w       http.ResponseWriter
	r       *http.Request
	route   string
	p       auth.Principal
	model   string
	arrived time.Time

	// ctx is the request's own context, cancelled with ErrClientGone when
	// the client goes away and with ErrIdleTimeout by the idle timer; the
	// tunnel's context derives from it.
	ctx       context.Context
	cancel    context.CancelCauseFunc
	idleAfter time.Duration
	idle      *frontdoor.IdleTimer
	wd        *frontdoor.WriteDeadline // every write's deadline: the idle timeout
	tun       Tunnel

	// mu orders stop against the tunnel's start: a tunnel started after
	// the request was stopped is cancelled at once, one started before is
	// cancelled by stop.
	mu   sync.Mutex
	live Tunnel

	started bool // the head and a byte have gone to the client
	status  int  // the provider's status, once started
	last    byte // the last byte sent: an error line must start a line

	// target is the name the provider got in place of the client's, for
	// an alias route (see bodyFor); "" when it got the client's.
	target string
	rename *renamer   // gives the answer the client's name back; nil unless target is set
	lines  *lineWatch // the stream's last line, when it must be final; else nil
	failed bool       // the stream ended with the provider's own error line
}

// readBody reads the whole request body, within maxRequestBody and the
// door's body memory, and the model it names.
func (x *exchange) readBody(nameToo bool) (*frontdoor.Body, *apiError) {
	body, err := x.h.door.ReadBody(x.w, x.r, maxRequestBody)
	if err != nil {
		return nil, bodyError(err)
	}
	if len(bytes.TrimSpace(body.Bytes)) == 0 {
		body.Release()
		return nil, invalid("missing request body")
	}
	// Two strings are all this decode allocates, however large the body.
	var named struct {
		Model string `json:"model"`
		Name  string `json:"name"`
	}
	if err := json.Unmarshal(body.Bytes, &named); err != nil {
		body.Release()
		return nil, invalid("%s", err.Error())
	}
	x.model = named.Model
	if x.model == "" && nameToo {
		x.model = named.Name
	}
	if x.model == "" {
		body.Release()
		return nil, invalid("model is required")
	}
	return body, nil
}

// serve starts the tunnel and relays it; it returns how the request ended:
// nil for a completed tunnel.
func (x *exchange) serve(body *frontdoor.Body) *apiError {
	x.ctx, x.cancel = context.WithCancelCause(context.WithoutCancel(x.r.Context()))
	defer x.cancel(nil)
	stopGone := context.AfterFunc(x.r.Context(), func() { x.stop(ErrClientGone) })
	defer stopGone()
	// The idle timer runs from admission: a silent prefill is time without
	// a byte to the client as much as a pause mid-answer, but the queue
	// wait before it is the queue timeout's alone (429 queue_timeout,
	// whatever the idle timeout). The deadline runs from arrival. Each
	// timer has its own error (SPEC S5); whichever fires first ends the
	// request.
	x.idle = frontdoor.NewIdleTimer(x.idleAfter, func() { x.stop(ErrIdleTimeout) })
	defer x.idle.Stop()

	t, err := x.h.runner.StartTunnel(x.ctx, x.p, x.model, tunnelRequest(x.r), x.bodyFor(body.Bytes), x.idle.Start)
	body.Release()
	if err != nil {
		return startError(err, context.Cause(x.ctx), x.model)
	}
	x.tun = t
	defer t.Close()
	x.mu.Lock()
	x.live = t
	cause := context.Cause(x.ctx)
	x.mu.Unlock()
	if cause != nil {
		t.Cancel(cause)
	}
	if m := x.h.metrics; m != nil {
		m.Active.WithLabelValues("tunnel").Inc()
		defer m.Active.WithLabelValues("tunnel").Dec()
	}
	if s := t.Head().GetStatus(); s < 200 || s > 599 {
		return &apiError{status: http.StatusBadGateway, code: "protocol",
			message: "the provider answered with an invalid status " + strconv.Itoa(int(s))}
	}
	return x.relay(t)
}

// relay copies the body to the client read by read, each flushed at once,
// so NDJSON lines reach the client as the provider flushed them; a client
// that reads slowly blocks the write and so slows the Node. The head is
// committed with the first byte, so that a tunnel that ends before any is
// answered with a fitting HTTP error instead. A completed chat or generate
// stream without its final line is an error too (see lineWatch).
func (x *exchange) relay(t Tunnel) *apiError {
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	rc := http.NewResponseController(x.w)
	if x.target != "" {
		x.rename = newRenamer(x.target, x.model)
	}
	if watchesEnding(x.route, t.Head()) {
		x.lines = &lineWatch{}
	}
	for {
		n, err := t.Read(*bp)
		if n > 0 && !x.forward(rc, (*bp)[:n]) {
			x.stop(ErrClientGone)
			return errGone
		}
		if err == nil {
			continue
		}
		if x.rename != nil && !x.pass(rc, x.rename.flush()) {
			x.stop(ErrClientGone)
			return errGone
		}
		var e *apiError
		if errors.Is(err, io.EOF) {
			e = x.incomplete()
		} else {
			e = relayError(err, x.why())
		}
		if e == nil && !x.started {
			x.begin() // a head without a body
		}
		if x.started && e != nil && e != errGone {
			// Output started: the error goes in-stream, on a line of its
			// own, so the client does not take the end for success.
			x.wd.Extend()
			if x.last != '\n' {
				_, _ = x.w.Write([]byte{'\n'})
			}
			_, _ = x.w.Write(e.line())
			_ = rc.Flush()
		}
		return e
	}
}

// forward passes one read on: noted for the final line, renamed for an
// alias, sent.
func (x *exchange) forward(rc *http.ResponseController, p []byte) bool {
	if x.lines != nil {
		x.lines.see(p)
	}
	if x.rename != nil {
		p = x.rename.rename(p)
	}
	return x.pass(rc, p)
}

// pass sends p unless it is empty (a read the renamer holds back whole).
func (x *exchange) pass(rc *http.ResponseController, p []byte) bool {
	return len(p) == 0 || x.send(rc, p)
}

// incomplete judges a completed stream: errIncomplete if it had to end
// with a final line and did not.
func (x *exchange) incomplete() *apiError {
	if x.lines == nil {
		return nil
	}
	switch x.lines.ending() {
	case endDone:
		return nil
	case endError:
		x.failed = true // relayed as the provider wrote it
		return nil
	}
	return errIncomplete
}

// send writes p and flushes it, committing the head first; it reports
// false when the client could not be written to.
func (x *exchange) send(rc *http.ResponseController, p []byte) bool {
	x.wd.Extend()
	if !x.started {
		x.begin()
	}
	if _, err := x.w.Write(p); err != nil {
		return false
	}
	if err := rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return false
	}
	x.last = p[len(p)-1]
	x.idle.Reset()
	return true
}

// begin commits the provider's status and headers.
func (x *exchange) begin() {
	x.started = true
	head := x.tun.Head()
	h := x.w.Header()
	drop := connectionNamed(head.GetHeaders())
	for _, kv := range head.GetHeaders() {
		name := textproto.CanonicalMIMEHeaderKey(kv.GetName())
		// Content-Length goes too: the body is relayed as it comes, and an
		// error line may have to follow it.
		if hopByHop[name] || drop[name] || name == "Content-Length" {
			continue
		}
		h.Add(name, kv.GetValue())
	}
	x.status = int(head.GetStatus())
	x.w.WriteHeader(x.status)
	if m := x.h.metrics; m != nil {
		m.TimeToFirstToken.WithLabelValues(x.route).Observe(time.Since(x.arrived).Seconds())
	}
}

// tunnelRequest is what goes to the provider: the method, path and query
// as the client sent them, and its headers minus those not forwarded. The
// gateway adds the Content-Length of the body it sends.
func tunnelRequest(r *http.Request) *wirepb.TunnelRequest {
	req := &wirepb.TunnelRequest{Method: r.Method, Path: r.URL.RequestURI()}
	var hs []*wirepb.Header
	for name, vs := range r.Header {
		for _, v := range vs {
			hs = append(hs, &wirepb.Header{Name: name, Value: v})
		}
	}
	drop := connectionNamed(hs)
	for _, kv := range hs {
		name := textproto.CanonicalMIMEHeaderKey(kv.GetName())
		if !hopByHop[name] && !drop[name] && !notForwarded[name] {
			req.Headers = append(req.Headers, kv)
		}
	}
	return req
}

// connectionNamed is the set of headers the Connection header names: hop
// by hop too.
func connectionNamed(hs []*wirepb.Header) map[string]bool {
	drop := map[string]bool{}
	for _, kv := range hs {
		if textproto.CanonicalMIMEHeaderKey(kv.GetName()) != "Connection" {
			continue
		}
		for name := range strings.SplitSeq(kv.GetValue(), ",") {
			drop[textproto.CanonicalMIMEHeaderKey(strings.TrimSpace(name))] = true
		}
	}
	return drop
}

// stop ends the request with cause: the tunnel, if there is one yet, and
// StartTunnel, if it is still waiting. The first cause wins. The tunnel
// hears it first, so that whoever sees its terminal also sees its Cancel.
func (x *exchange) stop(cause error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.live != nil {
		x.live.Cancel(cause)
	}
	x.cancel(cause)
}

// why is the cause of the tunnel's context, or of the request's when the
// tunnel has none: the first of client gone, idle timeout and deadline.
func (x *exchange) why() error {
	if x.tun != nil {
		if c := context.Cause(x.tun.Context()); c != nil {
			return c
		}
	}
	return context.Cause(x.ctx)
}

// end answers e as an HTTP error if nothing was sent yet, and records the
// outcome in metrics and the log.
func (x *exchange) end(e *apiError) {
	outcome, level := "ok", slog.LevelDebug
	switch {
	case e != nil:
		outcome, level = e.code, slog.LevelInfo
		switch {
		case !x.started:
			x.wd.Extend()
			writeError(x.w, e)
		case e != errGone:
			level = slog.LevelWarn // the client saw part of an answer, then an error
		}
	case x.status >= 400 || x.failed:
		outcome = "provider_error" // relayed as the provider answered
	}
	x.h.count(x.route, outcome)
	if m := x.h.metrics; m != nil {
		switch e {
		case errGone:
			m.Cancellations.WithLabelValues("client_gone").Inc()
		case errIdle:
			m.Cancellations.WithLabelValues("idle_timeout").Inc()
		case errDeadline:
			m.Cancellations.WithLabelValues("deadline").Inc()
		}
	}
	attrs := []slog.Attr{slog.String("route", x.route), slog.String("principal", x.p.Name),
		slog.String("outcome", outcome), slog.Duration("elapsed", time.Since(x.arrived))}
	if x.model != "" {
		attrs = append(attrs, slog.String("model", x.model))
	}
	if x.target != "" {
		attrs = append(attrs, slog.String("target", x.target))
	}
	if x.tun != nil {
		attrs = append(attrs, slog.String("tunnel_id", x.tun.ID()))
	}
	if x.started {
		attrs = append(attrs, slog.Int("status", x.status))
	}
	if e != nil && e != errGone {
		attrs = append(attrs, slog.String("err", e.message))
	}
	x.h.log.LogAttrs(x.r.Context(), level, "ollama tunnel", attrs...)
}
