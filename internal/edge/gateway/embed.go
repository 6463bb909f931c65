package gateway

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/iop-dev/iop/internal/edge/auth"
	"github.com/iop-dev/iop/internal/edge/live"
	"github.com/iop-dev/iop/internal/edge/nodeserver"
	"github.com/iop-dev/iop/internal/edge/sched"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// Embedding is an embedding call that ended on a candidate: its vectors
// with a COMPLETED terminal, or the terminal it failed with there.
type Embedding struct {
	ID   string
	Plan Plan
	// Node is where the call ran.
	Node sched.Candidate
	// Vectors are the embeddings, one per input, in input order (with a
	// COMPLETED terminal only).
	Vectors []*wirepb.Vector
	// Terminal is how the call ended: COMPLETED with its usage, or a
	// failure to map with RunFailure.
	Terminal *wirepb.RunEvent
}

// Embed resolves model for principal p and computes req's embeddings on a
// candidate whose adapter implements embed, with a run's queueing,
// capacity, lease and metrics. Nothing of a call reaches the client before
// it ends, so the whole call moves to another candidate whenever it ends in
// a way that says "try elsewhere": a Node lost, refusing, or turning
// suspect (P4), a stall whose call was confirmed closed (once). req's ids,
// provider, target, deadline and stall timeout are set here; ctx bounds the
// call, and the profile's hard deadline applies on top.
//
// admitted, if not nil, is called once, on this goroutine, when the call
// first gets a slot (its queue wait is over); progress, if not nil, after
// each frame of vectors that arrives. The error is for a call that got no
// terminal to answer with: a refusal, an unknown or unsupported model, a
// cancel or the deadline (context.Cause), every candidate failing;
// otherwise the Embedding's Terminal says how it ended.
func (g *Gateway) Embed(ctx context.Context, p auth.Principal, model string, req *wirepb.EmbedRequest, admitted, progress func()) (res *Embedding, err error) {
	plan, err := g.Resolve(p, model, "")
	if err != nil {
		return nil, err
	}
	plan.Needs = CapEmbed
	e := &Embedding{ID: g.NewID("emb"), Plan: plan}
	tracked := g.track(ctx, live.Embed, e.ID, p, plan)
	deadline := time.Now().Add(time.Duration(plan.Profile.Deadline))
	ctx, stop := context.WithDeadline(ctx, deadline)
	defer stop()
	defer func() { tracked.End(embedReason(res, err, context.Cause(ctx), plan.Model)) }()
	base := proto.CloneOf(req)
	base.EmbedId = e.ID
	base.DeadlineUnixMs = deadline.UnixMilli()
	base.ResponseStallTimeoutMs = time.Duration(plan.Profile.ResponseStallTimeout).Milliseconds()

	var tried []sched.Candidate
	var lastErr error
	stallRetried := false
	holdOffs := 0
	for attempt := 0; attempt < MaxAttempts; attempt++ {
		tracked.Queued()
		slot, err := g.acquire(ctx, e.ID, plan, tried)
		if err != nil {
			if lastErr != nil && errors.Is(err, sched.ErrNoCandidate) {
				return nil, noStreamIsBusy(plan.Model, lastErr) // every candidate tried failed: say why
			}
			return nil, err
		}
		if admitted != nil {
			admitted()
			admitted = nil
		}
		c := slot.Candidate
		call := proto.CloneOf(base)
		call.Provider, call.Adapter, call.Target = c.Provider, c.Adapter, c.Target
		call.SealedLease, call.Binding, err = g.seal(p, plan, fmt.Sprintf("%s#%d", e.ID, attempt), c, slot.Conn(), deadline)
		if err != nil {
			slot.Release()
			return nil, err // no other credential, no other way (S4)
		}
		tracked.Dispatched(c.NodeID, c.Provider, c.Target)
		var es *nodeserver.EmbedStream
		if es, err = g.srv.Embed(ctx, c.NodeID, call); err == nil {
			unwatch := slot.Conn().AfterSuspect(func() { es.Abandon(nodeSuspect(c.NodeID)) })
			vectors, term := es.Wait(progress)
			unwatch()
			g.countStall(term.GetStall())
			retry := term.GetType() == wirepb.RunEventType_RUN_EVENT_TYPE_RESPONSE_STALLED && term.GetStall().GetRetryable() && !stallRetried
			stallRetried = stallRetried || retry
			completed := term.GetType() == wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED
			if completed || !failoverable(term) && !retry && ctx.Err() == nil {
				slot.Release()
				e.Node, e.Vectors, e.Terminal = c, vectors, term
				if u := term.GetUsage(); u != nil {
					g.metrics.CountUsage(plan.Model, p.Name, c.NodeID, u.GetPromptTokens(), u.GetCompletionTokens())
				}
				return e, nil
			}
			err = &RunFailedError{Event: term}
		}
		slot.Release()
		if ctx.Err() != nil {
			return nil, context.Cause(ctx)
		}
		if busyOnNode(err) && holdOff(ctx, holdOffs) {
			holdOffs++
			attempt-- // the same candidates again, not a failover
			continue
		}
		tried = append(tried, c)
		lastErr = err
		reason := reasonOf(err)
		if es != nil && es.Abandoned() {
			reason = "node_suspect"
		}
		g.failover(e.ID, c, err, reason)
	}
	return nil, noStreamIsBusy(plan.Model, lastErr)
}

// AppendValues appends v's values to b as a JSON array of numbers, each
// the shortest text that reads back as the same float32: what the
// embedding answers of every API are made of. The values are finite (the
// transport refuses others).
func AppendValues(b []byte, v *wirepb.Vector) []byte {
	b = append(b, '[')
	for i, f := range v.GetValues() {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendFloat(b, float64(f), 'g', -1, 32)
	}
	return append(b, ']')
}
