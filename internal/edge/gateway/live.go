package gateway

import (
	"bytes"
	"context"
	"errors"
	"io"

	"github.com/iop-dev/iop/internal/edge/auth"
	"github.com/iop-dev/iop/internal/edge/live"
	"github.com/iop-dev/iop/internal/edge/nodeserver"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// The gateway tells the live tracker (Options.Live, the status page's)
// where each run, tunnel and embedding call is: tracked once resolved,
// queued while it waits for a slot, in prefill once dispatched, streaming
// from its first output, and ended with the code its client is answered
// with ("completed", or a Failure's Code). Per token this is one atomic
// add (live.Entry.Add), on the goroutine that reads the work.

// exchangeKey is the context key of the Exchange whose request the work
// serves: Begin puts it in the request's context, so that the tracker
// learns the API route and when the request arrived.
type exchangeKey struct{}

// withExchange returns ctx carrying x.
func withExchange(ctx context.Context, x *Exchange) context.Context {
	return context.WithValue(ctx, exchangeKey{}, x)
}

// track starts tracking work of kind for p under plan; ctx is the one
// StartRun, StartTunnel or Embed was given. Without a tracker it returns
// nil, which tracks nothing.
func (g *Gateway) track(ctx context.Context, kind live.Kind, id string, p auth.Principal, plan Plan) *live.Entry {
	if g.live == nil {
		return nil
	}
	w := live.Work{Kind: kind, ID: id, Model: plan.Model, Principal: p.Name}
	if x, ok := ctx.Value(exchangeKey{}).(*Exchange); ok {
		w.API, w.Arrived = x.Route, x.Arrived
	}
	return g.live.Start(w)
}

// startReason is the reason work that never started ends with: the code
// of StartFailure, as the client API answers it.
func startReason(err, cause error, model string) string {
	return StartFailure(err, cause, model).Code
}

// closedReason is the reason work closed before its terminal ends with:
// what stopped it (client gone, idle timeout, deadline), else "cancelled".
func closedReason(cause error) string {
	if f := causeFailure(cause); f != nil {
		return f.Code
	}
	return FailClientGone.Code
}

// isOutput reports whether ev is output the client sees: a token.
func isOutput(ev *wirepb.RunEvent) bool {
	switch ev.GetType() {
	case wirepb.RunEventType_RUN_EVENT_TYPE_TEXT_DELTA, wirepb.RunEventType_RUN_EVENT_TYPE_REASONING_DELTA,
		wirepb.RunEventType_RUN_EVENT_TYPE_TOOL_CALL_DELTA:
		return true
	}
	return false
}

// see tells the tracker about one event of the run: its usage, a token,
// its terminal.
func (r *Run) see(ev *wirepb.RunEvent) {
	if r.live == nil {
		return
	}
	if u := ev.GetUsage(); u != nil {
		r.live.Usage(u.GetPromptTokens(), u.GetCompletionTokens())
	}
	switch {
	case isOutput(ev):
		if !r.streaming {
			r.streaming = true
			r.live.First()
		}
		r.live.Add(1)
	case IsTerminal(ev):
		reason := live.Completed
		if ev.GetType() != wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED {
			reason = RunFailure(ev, context.Cause(r.ctx)).Code
		}
		r.live.End(reason)
	}
}

// newline is what a tunnel's output is counted in: lines of its stream
// (Ollama's NDJSON: about one token each).
var newline = []byte{'\n'}

// out tells the tracker about one read of the tunnel's body.
func (t *Tunnel) out(p []byte) {
	if t.live == nil {
		return
	}
	if !t.streaming {
		t.streaming = true
		t.live.First()
	}
	t.live.Add(int64(bytes.Count(p, newline)))
}

// end tells the tracker how the tunnel's body ended: err is Read's final
// error. A provider's error status relayed whole is "provider_error", as
// the Ollama API records it.
func (t *Tunnel) end(err error) {
	if t.live == nil {
		return
	}
	var te *nodeserver.TunnelError
	reason := live.Completed
	switch {
	case errors.Is(err, io.EOF):
		if t.head.GetStatus() >= 400 {
			reason = "provider_error"
		}
	case errors.As(err, &te):
		reason = TunnelFailure(te, context.Cause(t.ctx)).Code
	default:
		reason = closedReason(context.Cause(t.ctx))
	}
	t.live.End(reason)
}

// embedReason is the reason an embedding call ends with: Embed's result.
func embedReason(e *Embedding, err, cause error, model string) string {
	switch {
	case err != nil:
		return startReason(err, cause, model)
	case e.Terminal.GetType() == wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED:
		return live.Completed
	}
	return RunFailure(e.Terminal, nil).Code
}
