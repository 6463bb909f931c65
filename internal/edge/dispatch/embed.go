package dispatch

import (
	"context"

	"github.com/iop-dev/iop/internal/edge/sched"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// Embedding is an embedding call that ended on a candidate: its vectors
// with a COMPLETED terminal, or the terminal it failed with there.
type Embedding struct {
	ID string
	// Node is where the call ran.
	Node sched.Candidate
	// Vectors are the embeddings, one per input, in input order (with a
	// COMPLETED terminal only).
	Vectors []*wirepb.Vector
	// Terminal is how the call ended: COMPLETED with its usage, or a
	// failure (RunEnding).
	Terminal *wirepb.RunEvent

	d        *Dispatcher
	plan     Plan
	req      *wirepb.EmbedRequest
	es       EmbedStream // sent, until its wait
	progress func()
}

// Embed computes req's embeddings under plan on a candidate whose adapter
// implements embed, through the loop (loop.go), with a run's queueing,
// capacity, lease and metrics. Nothing of a call reaches the client before
// it ends, so the whole call is its first answer: it moves to another
// candidate whenever it ends in a way that says "try elsewhere". Embed takes
// req: its ids, provider, target, deadline and stall timeout are set on it
// here; ctx bounds
// the call, and the profile's hard deadline applies on top. progress, if
// not nil, is called after each frame of vectors.
//
// The error is for a call that got no terminal to answer with: a refusal,
// an unknown or unsupported model, a cancel or the deadline
// (context.Cause), every candidate failing; otherwise the Embedding's
// Terminal says how it ended.
func (d *Dispatcher) Embed(ctx context.Context, p *Plan, req *wirepb.EmbedRequest, watch Watch, progress func()) (*Embedding, error) {
	e := &Embedding{ID: d.newID("emb"), d: d, plan: *p, progress: progress}
	plan := &e.plan
	plan.Needs = CapEmbed
	watch.Live.Identify(e.ID)
	deadline := plan.deadline()
	ctx, stop := context.WithDeadline(ctx, deadline)
	defer stop()
	e.req = req // taken, as StartRun takes its request
	e.req.EmbedId = e.ID
	e.req.DeadlineUnixMs = deadline.UnixMilli()
	e.req.ResponseStallTimeoutMs = plan.stallTimeoutMs()
	if err := d.dispatch(ctx, e.ID, plan, deadline, &watch, e); err != nil {
		return nil, err
	}
	return e, nil
}

// send is one attempt of the loop: the call's request to c.
func (e *Embedding) send(ctx context.Context, c *sched.Candidate, conn Conn, lease []byte, binding *wirepb.LeaseBinding) answer {
	call := e.req // the attempt before this one has ended: nothing reads it
	call.Provider, call.Adapter, call.Target = c.Provider, c.Adapter, c.Target
	call.SealedLease, call.Binding = lease, binding
	es, err := e.d.nodes.Embed(ctx, c.NodeID, call)
	if err != nil {
		return answer{err: err}
	}
	e.es = es
	return answer{}
}

// wait waits for the whole call sent to c.
func (e *Embedding) wait(c *sched.Candidate, conn Conn) answer {
	es := e.es
	e.es = nil
	stop := watchSuspect(conn, c.NodeID, es)
	vectors, term := es.Wait(e.progress)
	stop()
	e.Node, e.Vectors, e.Terminal = *c, vectors, term
	if term.GetType() == wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED {
		return answer{}
	}
	return answer{err: &RunFailedError{Event: term}, end: RunEnding(term), abandoned: es.Abandoned()}
}

// keep ends the call's slot at once: the call is over.
func (e *Embedding) keep(slot Slot) {
	slot.Release()
	if u := e.Terminal.GetUsage(); u != nil {
		e.d.metrics.CountUsage(e.plan.Model, e.plan.Principal.Name, e.Node.NodeID, u.GetPromptTokens(), u.GetCompletionTokens())
	}
}

func (e *Embedding) drop() { e.Node, e.Vectors, e.Terminal = sched.Candidate{}, nil, nil }
