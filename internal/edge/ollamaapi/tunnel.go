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

	"github.com/iop-dev/iop/internal/edge/auth"
	"github.com/iop-dev/iop/internal/edge/edgeconfig"
	"github.com/iop-dev/iop/internal/edge/frontdoor"
	"github.com/iop-dev/iop/internal/edge/gateway"
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
		x := &exchange{Exchange: gateway.NewExchange(w, r, route, h.metrics, h.log), h: h}
		p, ok := h.authenticate(w, r, route)
		if !ok {
			return
		}
		x.P = p
		body, e := x.readBody(nameToo)
		if e != nil {
			x.end(e)
			return
		}
		// The body's share of the door's memory is given back once
		// StartTunnel no longer needs it for another candidate.
		defer body.Release()
		profile, err := h.runner.Profile(p, x.Model)
		if err != nil {
			x.end(fromFailure(gateway.StartFailure(err, nil, x.Model)))
			return
		}
		switch {
		case (route == routeChat || route == routeGenerate) && !h.tunnels(p, x.Model):
			x.end(x.serveRun(profile, body))
			return
		case route == routeShow && !h.tunnels(p, x.Model):
			body.Release()
			x.end(x.show())
			return
		case route == routeEmbed || route == routeEmbeddings:
			if e, ok := h.runner.(Embedder); ok && !h.tunnels(p, x.Model) {
				x.end(x.serveEmbed(e, profile, body))
				return
			}
		}
		x.end(x.serve(profile, body))
	}
}

// exchange is one tunnelled request from its body to its last byte: the
// lifecycle every API shares (gateway.Exchange), and the relay.
type exchange struct {
	*gateway.Exchange
	h   *handler
	tun Tunnel  // the request went through the raw tunnel
	run Run     // the request ran as a normalized run (run.go)
	out *ndjson // a run's answer

	started bool // the head and a byte have gone to the client
	status  int  // the provider's status, once started
	last    byte // the last byte sent: an error line must start a line

	// target is the name the provider got in place of the client's, for
	// an alias route (see bodyFor); "" when it got the client's.
	target string
	rename *renamer   // gives the answer the client's name back; nil unless target is set
	lines  *lineWatch // the stream's last line, when it must be final; else nil
	failed bool       // the stream ended with the provider's own error line

	embedding bool   // the request is an embedding call (embed.go)
	embedID   string // its id, once it ran
}

// tunnels reports whether a chat, generate or embed for model goes through the
// raw tunnel: exactly when an Ollama server is among the model's
// candidates now. Any other model runs as a normalized run, on whatever
// provider serves it (run.go); so does a model no candidate serves now, so
// that its refusal (404 unknown, 503 unavailable) considers every
// provider.
func (h *handler) tunnels(p auth.Principal, model string) bool {
	off, ok := h.runner.Offered(p, model)
	return ok && off.Has(Adapter)
}

// readBody reads the whole request body, within maxRequestBody and the
// door's body memory, and the model it names.
func (x *exchange) readBody(nameToo bool) (*frontdoor.Body, *apiError) {
	body, err := x.h.door.ReadBody(x.W, x.R, maxRequestBody)
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
	x.Model = named.Model
	if x.Model == "" && nameToo {
		x.Model = named.Name
	}
	if x.Model == "" {
		body.Release()
		return nil, invalid("model is required")
	}
	return body, nil
}

// serve starts the tunnel under profile and relays it; it returns how the
// request ended: nil for a completed tunnel.
func (x *exchange) serve(profile edgeconfig.Profile, body *frontdoor.Body) *apiError {
	ctx := x.Begin(time.Duration(profile.IdleTimeout))
	defer x.End()
	t, err := x.h.runner.StartTunnel(ctx, x.P, x.Model, tunnelRequest(x.R), x.bodyFor(body.Bytes), x.Admitted)
	body.Release()
	if err != nil {
		return fromFailure(gateway.StartFailure(err, context.Cause(ctx), x.Model))
	}
	x.tun = t
	defer t.Close()
	x.Attach(t)
	defer x.Active("tunnel")()
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
	rc := http.NewResponseController(x.W)
	if x.target != "" {
		x.rename = newRenamer(x.target, x.Model)
	}
	if watchesEnding(x.Route, t.Head()) {
		x.lines = &lineWatch{}
	}
	for {
		n, err := t.Read(*bp)
		if n > 0 && !x.forward(rc, (*bp)[:n]) {
			x.Stop(gateway.ErrClientGone)
			return errGone
		}
		if err == nil {
			continue
		}
		if x.rename != nil && !x.pass(rc, x.rename.flush()) {
			x.Stop(gateway.ErrClientGone)
			return errGone
		}
		var e *apiError
		if errors.Is(err, io.EOF) {
			if e = x.incomplete(); e == nil && x.lines != nil {
				if prompt, completion, ok := x.lines.usage(); ok {
					t.CountUsage(prompt, completion)
				}
			}
		} else {
			e = relayError(err, x.Why())
		}
		if e == nil && !x.started {
			x.begin() // a head without a body
		}
		if x.started && e != nil && e != errGone {
			// Output started: the error goes in-stream, on a line of its
			// own, so the client does not take the end for success.
			x.BeforeWrite()
			if x.last != '\n' {
				_, _ = x.W.Write([]byte{'\n'})
			}
			_, _ = x.W.Write(e.line())
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

// send writes p and flushes it (unless the tunnel has more ready),
// committing the head first; it reports
// false when the client could not be written to.
func (x *exchange) send(rc *http.ResponseController, p []byte) bool {
	x.BeforeWrite()
	if !x.started {
		x.begin()
	}
	if _, err := x.W.Write(p); err != nil {
		return false
	}
	// When more has arrived already, it is written first and one flush
	// carries both; a lone read is flushed at once.
	if !x.tun.Ready() {
		if err := rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
			return false
		}
	}
	x.last = p[len(p)-1]
	x.Wrote()
	return true
}

// begin commits the provider's status and headers.
func (x *exchange) begin() {
	x.started = true
	head := x.tun.Head()
	h := x.W.Header()
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
	x.W.WriteHeader(x.status)
	x.FirstByte()
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

// end answers e as an HTTP error if nothing was sent yet (after output,
// relay wrote it as a line), and records the outcome in metrics and the
// log.
func (x *exchange) end(e *apiError) {
	outcome := "ok"
	started := x.started || x.out != nil && x.out.started
	switch {
	case e != nil && !started && e != errGone:
		x.BeforeWrite()
		writeError(x.W, e)
	case e != nil && x.out != nil && x.out.started && e != errGone:
		x.out.fail(e) // a run's answer had started: the error is its last line
	case e == nil && (x.status >= 400 || x.failed):
		outcome = "provider_error" // relayed as the provider answered
	}
	var attrs []slog.Attr
	if x.target != "" {
		attrs = append(attrs, slog.String("target", x.target))
	}
	if x.tun != nil {
		attrs = append(attrs, slog.String("tunnel_id", x.tun.ID()))
	}
	if x.run != nil {
		attrs = append(attrs, slog.String("run_id", x.run.ID()))
	}
	if x.started {
		attrs = append(attrs, slog.Int("status", x.status))
	}
	var f *gateway.Failure
	if e != nil {
		f = e.failure()
	}
	msg := "ollama tunnel"
	switch {
	case x.out != nil:
		msg = "ollama run"
	case x.embedding:
		msg = "ollama embed"
	}
	if x.embedID != "" {
		attrs = append(attrs, slog.String("embed_id", x.embedID))
	}
	x.Record(msg, outcome, f, started, attrs...)
}
