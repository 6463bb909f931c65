package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/iop-dev/iop/internal/edge/auth"
	"github.com/iop-dev/iop/internal/edge/live"
	"github.com/iop-dev/iop/internal/edge/nodes"
	"github.com/iop-dev/iop/internal/edge/nodeserver"
	"github.com/iop-dev/iop/internal/edge/sched"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// Tunnel is a raw provider request in progress for a client (R3): read
// its Head, then its body with Read until io.EOF or an error, then Close.
type Tunnel struct {
	ID   string
	Plan Plan

	ctx    context.Context
	cancel context.CancelCauseFunc
	stop   context.CancelFunc
	slot   *sched.Slot
	ts     *nodeserver.TunnelStream
	head   *wirepb.TunnelResponseHead
	g      *Gateway
	ended  bool // Read returned its final error
	meter  usageMeter
	// live is the status page's view of the tunnel (live.go); streaming:
	// it has seen the first byte of the body.
	live      *live.Entry
	streaming bool
}

// TunnelBody makes a tunnel's request body for one candidate, given its
// target (the model's name on that provider): a client API whose body names
// the model can put the target there, for a route whose target is not the
// name the client asked for. StartTunnel calls it once per attempt, in
// order, on the caller's goroutine, so the tunnel it returns carries the
// body of the last call; an error from it ends StartTunnel with that error.
type TunnelBody func(target string) ([]byte, error)

// StartTunnel resolves model for principal p among providers of adapter,
// and relays req with a body made by body to one of them, moving to another
// candidate (with a body made for its target) while nothing has come back:
// a Node lost or refusing before the response head. The body is held in
// memory so that it can be sent again. The request's Content-Length header
// is set to the length of each body sent, whatever req said.
//
// admitted, if not nil, is called once, on this goroutine, when the request
// first gets a slot: its queue wait, which the queue timeout alone bounds
// (S5), is over.
func (g *Gateway) StartTunnel(ctx context.Context, p auth.Principal, model, adapter string, req *wirepb.TunnelRequest, body TunnelBody, admitted func()) (_ *Tunnel, err error) {
	plan, err := g.Resolve(p, model, adapter)
	if err != nil {
		return nil, err
	}
	t := &Tunnel{ID: g.NewID("tun"), Plan: plan, g: g, meter: usageMeter{g: g, model: plan.Model, principal: p.Name}}
	t.live = g.track(ctx, live.Tunnel, t.ID, p, plan)
	defer func() {
		if err != nil {
			t.live.End(startReason(err, context.Cause(ctx), plan.Model))
		}
	}()
	t.ctx, t.cancel = context.WithCancelCause(ctx)
	deadline := time.Now().Add(time.Duration(plan.Profile.Deadline))
	t.ctx, t.stop = context.WithDeadline(t.ctx, deadline)
	base := proto.Clone(req).(*wirepb.TunnelRequest)
	base.TunnelId = t.ID
	base.DeadlineUnixMs = deadline.UnixMilli()
	base.ResponseStallTimeoutMs = time.Duration(plan.Profile.ResponseStallTimeout).Milliseconds()

	var tried []sched.Candidate
	var lastErr error
	stallRetried := false
	holdOffs := 0
	for attempt := 0; attempt < MaxAttempts; attempt++ {
		t.live.Queued()
		slot, err := g.acquire(t.ctx, t.ID, plan, tried)
		if err != nil {
			if lastErr != nil && errors.Is(err, sched.ErrNoCandidate) {
				err = noStreamIsBusy(plan.Model, lastErr)
			}
			t.Close()
			return nil, err
		}
		if admitted != nil {
			admitted()
			admitted = nil
		}
		c := slot.Candidate
		b, err := body(c.Target)
		if err != nil {
			slot.Release()
			t.Close()
			return nil, err
		}
		r := proto.Clone(base).(*wirepb.TunnelRequest)
		r.Provider, r.Target = c.Provider, c.Target
		setContentLength(r, len(b))
		r.SealedLease, r.Binding, err = g.seal(p, plan, fmt.Sprintf("%s#%d", t.ID, attempt), c, slot.Conn(), deadline)
		if err != nil {
			slot.Release()
			t.Close()
			return nil, err // no other credential, no other way (S4)
		}
		t.live.Dispatched(c.NodeID, c.Provider, c.Target)
		ts, err := g.srv.Tunnel(t.ctx, c.NodeID, r, bytes.NewReader(b))
		if err == nil {
			// A Node that turns suspect before the head gives the tunnel
			// up, and it moves on (P4).
			unwatch := slot.Conn().AfterSuspect(func() { ts.Abandon(nodeSuspect(c.NodeID)) })
			var head *wirepb.TunnelResponseHead
			head, err = ts.Head()
			unwatch()
			if err == nil {
				t.slot, t.ts, t.head = slot, ts, head
				return t, nil
			}
			ts.Close()
		}
		slot.Release()
		var te *nodeserver.TunnelError
		if errors.As(err, &te) {
			g.countStall(te.Stall)
		}
		// A stall before the head, whose close the Node confirmed, is
		// retried once elsewhere: nothing reached the client (recovery).
		retry := !stallRetried && te != nil && te.Outcome == wirepb.TunnelOutcome_TUNNEL_OUTCOME_RESPONSE_STALLED && te.Stall.GetRetryable()
		stallRetried = stallRetried || retry
		if t.ctx.Err() != nil || !retry && !tunnelFailoverable(err) {
			t.Close()
			return nil, err
		}
		if busyOnNode(err) && holdOff(t.ctx, holdOffs) {
			holdOffs++
			attempt-- // the same candidates again, not a failover
			continue
		}
		tried = append(tried, c)
		lastErr = err
		reason := reasonOf(err)
		if ts != nil && ts.Abandoned() {
			reason = "node_suspect"
		}
		g.failover(t.ID, c, err, reason)
	}
	t.Close()
	return nil, noStreamIsBusy(plan.Model, lastErr)
}

// setContentLength makes r's Content-Length header say n, the length of
// the body that goes with it, in place of any the client sent: the body may
// have been rewritten for the candidate's target.
func setContentLength(r *wirepb.TunnelRequest, n int) {
	hs := r.Headers[:0]
	for _, h := range r.Headers {
		if !strings.EqualFold(h.GetName(), "Content-Length") {
			hs = append(hs, h)
		}
	}
	r.Headers = append(hs, &wirepb.Header{Name: "Content-Length", Value: strconv.Itoa(n)})
}

// tunnelFailoverable reports whether a tunnel that ended before its head
// may be tried elsewhere: the Node was lost or refused it.
func tunnelFailoverable(err error) bool {
	var te *nodeserver.TunnelError
	if !errors.As(err, &te) {
		return err != nil // dispatch failed: the Node is not there
	}
	switch te.Outcome {
	case wirepb.TunnelOutcome_TUNNEL_OUTCOME_DISCONNECTED:
		return true
	case wirepb.TunnelOutcome_TUNNEL_OUTCOME_FAILED:
		switch te.Failure.GetKind() {
		case wirepb.FailureKind_FAILURE_KIND_PROVIDER_UNAVAILABLE, wirepb.FailureKind_FAILURE_KIND_CAPACITY_EXHAUSTED:
			return true
		}
	}
	return false
}

// Head is the provider's response head.
func (t *Tunnel) Head() *wirepb.TunnelResponseHead { return t.head }

// Node is where the tunnel runs.
func (t *Tunnel) Node() sched.Candidate { return t.slot.Candidate }

// Read reads the response body as the provider flushed it: io.EOF at a
// completed end, a *nodeserver.TunnelError otherwise.
func (t *Tunnel) Read(p []byte) (int, error) {
	n, err := t.ts.Read(p)
	if n > 0 {
		t.meter.output()
		t.out(p[:n])
	}
	var te *nodeserver.TunnelError
	if err != nil && !t.ended {
		t.ended = true
		t.end(err)
		if errors.As(err, &te) {
			t.g.countStall(te.Stall)
		}
	}
	return n, err
}

// Ready reports whether Read can return more without waiting (see
// nodeserver.TunnelStream.Ready): a relay then writes it before it
// flushes, one flush for both.
func (t *Tunnel) Ready() bool { return !t.ended && t.ts.Ready() }

// CountUsage counts the tokens of a tunnel that completed, as the
// provider's answer reported them: the Edge relays a tunnel's bytes
// without reading them, so the client API that knows the answer's format
// reads them (Ollama's final line) and tells the gateway, which counts
// them by model, principal and Node, and the answer's pace. Call it once,
// after Read returned io.EOF.
func (t *Tunnel) CountUsage(prompt, completion int64) {
	t.meter.usage = &wirepb.Usage{PromptTokens: prompt, CompletionTokens: completion}
	t.meter.end(t.slot.Candidate.NodeID, true)
}

// Terminal is the tunnel's single outcome, once Read has returned an error.
func (t *Tunnel) Terminal() *wirepb.TunnelTerminal { return t.ts.Terminal() }

// Cancel ends the tunnel with cause (client gone, idle timeout).
func (t *Tunnel) Cancel(cause error) { t.cancel(cause) }

// Context is the tunnel's context; its cause tells why it ended.
func (t *Tunnel) Context() context.Context { return t.ctx }

// Close releases everything the tunnel holds; safe to call more than once.
func (t *Tunnel) Close() {
	if t.head != nil {
		t.live.End(closedReason(context.Cause(t.ctx))) // unless its end was read
	}
	if t.ts != nil {
		t.ts.Close()
	}
	if t.slot != nil {
		t.slot.Release()
	}
	t.stop()
	t.cancel(context.Canceled)
}

// MetadataReply is one Node provider's answer to a metadata call.
type MetadataReply struct {
	NodeID   string
	Provider string
	Status   int32
	Body     []byte
	Err      error
}

// Metadata sends one read-only call (no capacity slot, R3) to every online
// provider of adapter on every ready Node, and returns their answers: how
// Ollama's /api/tags and /api/ps are merged across Nodes. Bodies are capped
// at maxBody bytes.
func (g *Gateway) Metadata(ctx context.Context, reg *nodes.Registry, adapter, method, path string, maxBody int64) []MetadataReply {
	type job struct{ node, provider string }
	var jobs []job
	for _, c := range reg.Ready() {
		for _, p := range c.Providers() {
			if p.GetAdapter() == adapter && p.GetState() == wirepb.ProviderState_PROVIDER_STATE_ONLINE {
				jobs = append(jobs, job{c.NodeID(), p.GetName()})
			}
		}
	}
	replies := make([]MetadataReply, len(jobs))
	done := make(chan struct{}, len(jobs))
	for i, j := range jobs {
		go func() {
			defer func() { done <- struct{}{} }()
			r := MetadataReply{NodeID: j.node, Provider: j.provider}
			ts, err := g.srv.Tunnel(ctx, j.node, &wirepb.TunnelRequest{
				TunnelId: g.NewID("meta"), Provider: j.provider, Method: method, Path: path, Metadata: true,
			}, nil)
			if err == nil {
				var head *wirepb.TunnelResponseHead
				if head, err = ts.Head(); err == nil {
					r.Status = head.GetStatus()
					r.Body, err = io.ReadAll(io.LimitReader(ts, maxBody))
				}
				ts.Close()
			}
			r.Err = err
			replies[i] = r
		}()
	}
	for range jobs {
		<-done
	}
	return replies
}
