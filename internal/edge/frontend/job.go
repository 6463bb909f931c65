package frontend

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/textproto"
	"strings"
	"time"

	"github.com/iop-dev/iop/internal/edge/dispatch"
	"github.com/iop-dev/iop/internal/edge/inflight"
	"github.com/iop-dev/iop/internal/edge/sched"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// Job is what a request becomes, as its API's translation makes it: a
// RunJob, a TunnelJob, an EmbedJob, a CountJob, or an Answer the Edge
// gives itself.
type Job interface {
	kind() inflight.Kind
	// fail ends an answer that has started with f, in the API's in-stream
	// shape: never a silent end.
	fail(resp *Response, f *Failure)
	// writer is what writes the answer, for what it adds to the log
	// (LogAttrs).
	writer() any
}

// RunJob is a normalized run (R2), written back by Out.
type RunJob struct {
	Run *wirepb.RunRequest
	Out RunWriter
	// KeepAlive, if not nil, is written whenever nothing went to the
	// client for the profile's keepalive_interval, while the request waits
	// for a slot or a silent prefill: a line the API's clients skip (an
	// SSE comment, a ping event). Only a streamed answer has one.
	KeepAlive []byte
}

// RunWriter writes a run's answer in one API's shape, through the
// request's Response. Each write reports false when the client could not
// be written to. An API with no place for some kind of event (a text
// completion has none for reasoning or tool calls) writes nothing for it
// and reports true.
type RunWriter interface {
	// Started names the answer after its run, before the first event.
	Started(runID string)
	// Text and Reasoning relay deltas of the answer and of its thinking.
	Text(s string) bool
	Reasoning(s string) bool
	// ToolCall relays a tool call or a fragment of one (by its index).
	ToolCall(tc *wirepb.ToolCall) bool
	// Usage notes the run's token counts and durations, as they come.
	Usage(u *wirepb.Usage)
	// Complete writes the end of an answer that completed, with the run's
	// done reason.
	Complete(doneReason string) bool
	// Fail ends an answer that has started with f.
	Fail(f *Failure)
}

func (*RunJob) kind() inflight.Kind                  { return inflight.Run }
func (j *RunJob) fail(_ *Response, f *Failure)       { j.Out.Fail(f) }
func (j *RunJob) writer() any                        { return j.Out }
func (*TunnelJob) kind() inflight.Kind               { return inflight.Tunnel }
func (j *TunnelJob) fail(resp *Response, f *Failure) { resp.End(j.Out.Fail(f)) }
func (j *TunnelJob) writer() any                     { return j.Out }
func (*EmbedJob) kind() inflight.Kind                { return inflight.Embed }
func (*EmbedJob) fail(*Response, *Failure)           {} // nothing is sent before the call ends
func (*EmbedJob) writer() any                        { return nil }
func (Answer) kind() inflight.Kind                   { return "" }
func (Answer) fail(*Response, *Failure)              {} // an answer is sent whole
func (Answer) writer() any                           { return nil }

// TunnelJob relays a provider's own HTTP API (R3): the request as the
// client sent it, minus what is not forwarded (TunnelRequest), the answer
// byte for byte, through Out.
type TunnelJob struct {
	Tunnel *wirepb.TunnelRequest
	// Adapter is the kind of provider whose API it is: only its providers
	// are candidates.
	Adapter string
	// Body makes the body for each candidate's target.
	Body dispatch.TunnelBody
	Out  TunnelWriter
}

// TunnelWriter is what an API does to a provider's answer it relays.
type TunnelWriter interface {
	// Head sees the provider's response head, before any of the body.
	Head(head *wirepb.TunnelResponseHead)
	// Pass returns what of one read of the body goes to the client now
	// (nothing, for what it holds back).
	Pass(p []byte) []byte
	// Flush returns what was held back, at the end of the body.
	Flush() []byte
	// Ended judges a body that completed: nil, or the failure to end the
	// stream with (it lacked its final line); upstream says the answer is
	// the provider's own error, relayed as it wrote it.
	Ended() (f *Failure, upstream bool)
	// Usage is the tokens the completed answer reported, if it did.
	Usage() (prompt, completion int64, ok bool)
	// Fail is f as the last piece of an answer that started.
	Fail(f *Failure) []byte
}

// EmbedJob is an embedding call, answered whole by Out once it ends: its
// vectors, through resp (resp.Write for a large one); false when the
// client could not be written to.
type EmbedJob struct {
	Embed *wirepb.EmbedRequest
	Out   func(resp *Response, e *dispatch.Embedding) bool
}

// Answer is a request the Edge answers itself, from what it knows (a
// model's description, Ollama's "load the model" call).
type Answer func(resp *Response) *Failure

// run starts j's run and relays it. As with a tunnel, the start is where
// a request waits for its first event, so the relay is a function of its
// own (serve says why).
func (l *life) run(ctx context.Context, plan *dispatch.Plan, j *RunJob, watch dispatch.Watch) *Failure {
	// Keep-alives stop before serve returns, so end writes alone.
	stop := l.resp.keepAlive(time.Duration(plan.Profile.KeepAliveInterval), j.KeepAlive)
	defer stop()
	run, err := l.f.d.StartRun(ctx, plan, j.Run, watch)
	if err != nil {
		return StartFailure(err, context.Cause(ctx), plan.Model)
	}
	return l.relayRun(run, j)
}

// relayRun relays run of j, which has its first event.
func (l *life) relayRun(run Run, j *RunJob) *Failure {
	defer run.Close()
	defer l.x.active(inflight.Run)()
	l.placed(run, run.ID(), run.Node)
	j.Out.Started(run.ID())
	return l.x.relay(run, j.Out)
}

// placed attaches work w, of id, to the request, and notes where it runs.
func (l *life) placed(w Work, id string, node func() sched.Candidate) {
	l.x.Attach(w)
	n := node()
	l.id, l.node, l.choice = id, n.NodeID, string(n.Choice)
}

// relay reads run until its terminal and writes it with w, on the
// handler's goroutine: the one relay loop of every API. It returns nil when
// the run completed and w wrote its end; FailClientGone when a write
// failed (the request is stopped, so the run is cancelled); otherwise the
// failure of the run's terminal, explained by the exchange's cause (client
// gone, idle timeout, deadline) when there is one. A run that ends without
// a terminal is a protocol failure.
func (x *Exchange) relay(run Run, w RunWriter) *Failure {
	defer func() { x.more = nil }()
	ready := run.Ready // once: a method value is an allocation
	for ; ; x.coalesceAfterFirst(ready) {
		ev, err := run.Next()
		if err != nil {
			ev = &wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_FAILED,
				Failure: &wirepb.Failure{Kind: wirepb.FailureKind_FAILURE_KIND_PROTOCOL, Message: "run ended without a terminal: " + err.Error()}}
		}
		if u := ev.GetUsage(); u != nil {
			w.Usage(u)
		}
		ok := true
		switch t := ev.GetType(); {
		case t == wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED:
			if !w.Complete(ev.GetDoneReason()) {
				return FailClientGone
			}
			return nil
		case t.IsTerminal():
			return RunFailure(ev, x.Why())
		case t == wirepb.RunEventType_RUN_EVENT_TYPE_TEXT_DELTA:
			ok = w.Text(ev.GetText())
		case t == wirepb.RunEventType_RUN_EVENT_TYPE_REASONING_DELTA:
			ok = w.Reasoning(ev.GetText())
		case t == wirepb.RunEventType_RUN_EVENT_TYPE_TOOL_CALL_DELTA:
			ok = w.ToolCall(ev.GetToolCall())
		}
		if !ok {
			x.Stop(ErrClientGone)
			return FailClientGone
		}
	}
}

// embed runs j's embedding call and answers it.
func (l *life) embed(ctx context.Context, plan *dispatch.Plan, j *EmbedJob, watch dispatch.Watch) *Failure {
	x := l.x
	done := x.active(inflight.Embed)
	emb, err := l.f.d.Embed(ctx, plan, j.Embed, watch, x.Wrote)
	done()
	if err != nil {
		return StartFailure(err, context.Cause(ctx), plan.Model)
	}
	l.id, l.node, l.choice = emb.ID, emb.Node.NodeID, string(emb.Node.Choice)
	if u := emb.Terminal.GetUsage(); u != nil {
		// An embedding's usage comes with its terminal: the status page's
		// entry takes it, and with it the usage ledger (inflight.Options.Usage).
		x.live.Usage(u.GetPromptTokens(), u.GetCompletionTokens())
	}
	if emb.Terminal.GetType() != wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED {
		return RunFailure(emb.Terminal, context.Cause(ctx))
	}
	if !j.Out(l.resp, emb) {
		x.Stop(ErrClientGone)
		return FailClientGone
	}
	return nil
}

// tunnel starts j's tunnel and relays it. The start is where a request
// waits for its first byte, so this frame is kept small (serve says why)
// and the relay is a function of its own.
func (l *life) tunnel(ctx context.Context, plan *dispatch.Plan, j *TunnelJob, watch dispatch.Watch) *Failure {
	t, err := l.f.d.StartTunnel(ctx, plan.WithAdapter(j.Adapter), j.Tunnel, j.Body, watch)
	j.Tunnel = nil   // the tunnel's now
	l.body.Release() // no other candidate will need it
	if err != nil {
		return StartFailure(err, context.Cause(ctx), plan.Model)
	}
	return l.relayStarted(t, j)
}

// relayStarted relays tunnel t of j, whose head has come back. Its frame,
// too, is under the one net/http writes the answer's header from, which
// is large: what it does once is done in functions of their own.
func (l *life) relayStarted(t Tunnel, j *TunnelJob) *Failure {
	defer t.Close()
	defer l.x.active(inflight.Tunnel)()
	l.placed(t, t.ID(), t.Node)
	head := t.Head()
	if s := head.GetStatus(); s < 200 || s > 599 {
		return InvalidUpstreamStatus(s)
	}
	l.relayHead(head, j)
	return l.relayTunnel(t, head, j.Out)
}

// relayHead gives the tunnel's head to the response and to j's writer.
func (l *life) relayHead(head *wirepb.TunnelResponseHead, j *TunnelJob) {
	l.resp.Relay(int(head.GetStatus()), func(h http.Header) { relayedHeaders(h, head.GetHeaders()) })
	j.Out.Head(head)
}

// relayTunnel copies the body to the client piece by piece as the Node
// sent it (no buffer of its own: each piece is a body frame the tunnel
// hands over), so the lines reach the client as the provider flushed them;
// a client that reads slowly blocks the write and so slows the Node. The
// head is committed with the first byte, so that a tunnel that ends before
// any is answered with a fitting HTTP error instead.
func (l *life) relayTunnel(t Tunnel, head *wirepb.TunnelResponseHead, out TunnelWriter) *Failure {
	x := l.x
	defer func() { x.more = nil }()
	ready := t.Ready // once: a method value is an allocation
	for ; ; x.coalesceAfterFirst(ready) {
		piece, err := t.NextPiece()
		if len(piece) > 0 {
			if p := out.Pass(piece); len(p) > 0 && !l.resp.Event(p) {
				x.Stop(ErrClientGone)
				return FailClientGone
			}
		}
		if err == nil {
			continue
		}
		if p := out.Flush(); len(p) > 0 && !l.resp.Event(p) {
			x.Stop(ErrClientGone)
			return FailClientGone
		}
		if !errors.Is(err, io.EOF) {
			return TunnelFailure(err, x.Why())
		}
		f, upstream := out.Ended()
		if f == nil {
			if prompt, completion, ok := out.Usage(); ok {
				t.CountUsage(prompt, completion)
			}
		}
		if upstream || head.GetStatus() >= 400 {
			l.outcome = "provider_error" // relayed as the provider answered
		}
		if f == nil && !l.resp.Commit() { // a head without a body
			return FailClientGone
		}
		return f
	}
}

// hopByHop are the headers that belong to one connection (RFC 9110 7.6.1)
// and are never relayed, in either direction.
var hopByHop = map[string]bool{
	"Connection": true, "Keep-Alive": true, "Proxy-Authenticate": true,
	"Proxy-Authorization": true, "Proxy-Connection": true, "Te": true,
	"Trailer": true, "Transfer-Encoding": true, "Upgrade": true,
}

// notForwarded are request headers kept from the provider for other
// reasons. Authorization, X-Api-Key and Cookie carry the client's
// credentials to the Edge, never to travel further. Host and
// Content-Length are the Node's to set. Accept-Encoding is dropped so that
// the provider answers uncompressed: a compressed stream would hold lines
// back, and an error line could not be appended to it.
var notForwarded = map[string]bool{
	"Authorization": true, "X-Api-Key": true, "Cookie": true,
	"Host": true, "Content-Length": true, "Accept-Encoding": true,
}

// TunnelRequest is what goes to the provider of a tunnel: the method, path
// and query as the client sent them, and its headers minus those not
// forwarded. The dispatcher adds the Content-Length of the body it sends.
func TunnelRequest(r *http.Request) *wirepb.TunnelRequest {
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

// relayedHeaders sets h to the provider's headers hs, minus the hop-by-hop
// ones and Content-Length: the body is relayed as it comes, and an error
// line may have to follow it.
func relayedHeaders(h http.Header, hs []*wirepb.Header) {
	drop := connectionNamed(hs)
	for _, kv := range hs {
		name := textproto.CanonicalMIMEHeaderKey(kv.GetName())
		if hopByHop[name] || drop[name] || name == "Content-Length" {
			continue
		}
		h.Add(name, kv.GetValue())
	}
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
