package execution

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/iop-dev/iop/internal/node/nodemetrics"
	"github.com/iop-dev/iop/internal/transport"
	"github.com/iop-dev/iop/quicwire/wirepb"
	"github.com/iop-dev/iop/sdk"
)

// An embedding call, Node side. On an embed stream the Edge sends nothing
// after the header; the Node answers with EmbedFrame{vectors}... as the
// plugin sends them, then exactly one EmbedFrame{terminal}: a RunEvent of a
// terminal type, claimed exactly as a run's (the plugin's outcome, a cancel,
// the deadline, a disconnect, or a stall of the same watchdog).
//
//	Edge ◄── vectors..., terminal ── embedOut ◄── plugin.Embed ◄── provider

// embedOut is an embedding call's output side: it relays frames of vectors,
// counts their values against wirepb.MaxEmbedValues, and owns the single
// terminal: the first claim wins and nothing is sent after it.
type embedOut struct {
	st Stream

	mu       sync.Mutex
	values   int
	terminal *wirepb.RunEvent
}

// emit sends one frame of vectors from the plugin. After the terminal it
// refuses, which makes the plugin call stop.
func (o *embedOut) emit(v *wirepb.EmbedVectors) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.terminal != nil {
		return fmt.Errorf("embedding call already ended (%s)", o.terminal.GetType())
	}
	for _, vec := range v.GetVectors() {
		o.values += len(vec.GetValues())
	}
	if o.values > wirepb.MaxEmbedValues {
		return sdk.Errorf(sdk.KindUpstream, "the embeddings exceed the %d values a result may have", wirepb.MaxEmbedValues)
	}
	return o.st.Send(&wirepb.EmbedFrame{Frame: &wirepb.EmbedFrame_Vectors{Vectors: v}})
}

// finish claims the terminal and sends it; only the first call does
// anything. It reports whether this call was the one.
func (o *embedOut) finish(ev *wirepb.RunEvent) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.terminal != nil {
		return false
	}
	o.terminal = ev
	_ = o.st.Send(&wirepb.EmbedFrame{Frame: &wirepb.EmbedFrame_Terminal{Terminal: ev}})
	return true
}

// checkEmbedRequest refuses a call outside the wire's bounds before any
// provider is looked up.
func checkEmbedRequest(req *wirepb.EmbedRequest) error {
	switch n := len(req.GetInputs()); {
	case n == 0:
		return fmt.Errorf("an embedding call without inputs")
	case n > wirepb.MaxEmbedInputs:
		return fmt.Errorf("%d inputs, more than the %d an embedding call may have", n, wirepb.MaxEmbedInputs)
	case req.GetDimensions() > wirepb.MaxEmbedDimensions:
		return fmt.Errorf("%d dimensions asked for, more than %d", req.GetDimensions(), wirepb.MaxEmbedDimensions)
	}
	for i, in := range req.GetInputs() {
		if in == "" {
			return fmt.Errorf("input %d is empty", i)
		}
	}
	return nil
}

// serveEmbed computes one call's embeddings: validate, admit (capacity,
// the embed capability, the lease), call the plugin under the stall
// watchdog, whose progress is each frame of vectors, and end with exactly
// one terminal. sess is the connection's session, nil for a path without
// one.
func (h *Handler) serveEmbed(ctx context.Context, sess *transport.Session, req *wirepb.EmbedRequest, st Stream) {
	out := &embedOut{st: st}
	log := h.callLog(slog.String("embed_id", req.GetEmbedId()), slog.String("target", req.GetTarget()), slog.Int("inputs", len(req.GetInputs())))
	if err := checkEmbedRequest(req); err != nil {
		o := failedOutcome(wirepb.FailureKind_FAILURE_KIND_INVALID_REQUEST, "%v", err)
		out.finish(o.RunEvent())
		h.ended(nodemetrics.Embed, nil, o)
		return
	}
	a, refused := h.admit(sess, admission{kind: nodemetrics.Embed, stallMs: req.GetResponseStallTimeoutMs(), provider: req.GetProvider(), adapter: req.GetAdapter(),
		target: req.GetTarget(), capability: sdk.CapEmbed, sealed: req.GetSealedLease(), binding: req.GetBinding()})
	if refused != nil {
		if h.refuseBusy(ctx, st, refused, req.GetProvider(), req.GetAdapter(), req.GetTarget()) {
			return
		}
		out.finish(refusedOutcome(refused).RunEvent())
		return
	}
	req.SealedLease = nil // the adapter gets the credential, not the lease

	g := a.guard(ctx, h, sess, req.GetTarget(), req.GetDeadlineUnixMs(), st)

	start := time.Now()
	emit := func(v *wirepb.EmbedVectors) error {
		return g.wd.Emit(true, func() error { return out.emit(v) })
	}
	g.serve(log, a.release, func() (Outcome, error) { return pluginOutcome(a.plugin.Embed(g.ctx, req, a.cred, emit)) }, func(o Outcome) {
		if term := o.RunEvent(); out.finish(term) {
			log.Info("embedding call ended", "outcome", o.Cause.String(), "failure", term.GetFailure().GetKind().String(), "took", time.Since(start))
		}
		h.ended(nodemetrics.Embed, a.prov, o)
	})
}
