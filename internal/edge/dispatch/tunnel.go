package dispatch

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/iop-dev/iop/internal/edge/inflight"
	"github.com/iop-dev/iop/internal/edge/nodeserver"
	"github.com/iop-dev/iop/internal/edge/sched"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// Tunnel is a raw provider request in progress for a client (R3): read
// its Head, then its body with Read until io.EOF or an error, then Close.
type Tunnel struct {
	work
	base    *wirepb.TunnelRequest
	body    TunnelBody
	slot    Slot
	ts      TunnelStream
	head    *wirepb.TunnelResponseHead
	headErr error // how the kept attempt ended before its head
	ended   bool  // Read returned its final error
}

// work is what a run and a tunnel are as the dispatcher's: an id, a plan
// of their own, their context with its deadline (S5), the usage they are
// counted in and their status page entry.
type work struct {
	id       string
	plan     Plan
	d        *Dispatcher
	ctx      context.Context
	deadline time.Time
	cancel   context.CancelCauseFunc
	stop     context.CancelFunc // releases the deadline timer
	meter    usageMeter
	// live is the status page's entry; streaming: it has seen the first
	// output.
	live      *inflight.Entry
	streaming bool
}

// start makes w work of d under a copy of plan, named with prefix, in ctx
// with plan's deadline, on the status page as live.
func (w *work) start(ctx context.Context, d *Dispatcher, prefix string, plan *Plan, live *inflight.Entry) {
	w.id, w.plan, w.d, w.live = d.newID(prefix), *plan, d, live
	w.meter = usageMeter{d: d, model: plan.Model, principal: plan.Principal.Name}
	live.Identify(w.id)
	w.ctx, w.cancel = context.WithCancelCause(ctx)
	w.deadline = plan.deadline()
	w.ctx, w.stop = context.WithDeadline(w.ctx, w.deadline)
}

// TunnelBody makes a tunnel's request body for one candidate, given its
// target (the model's name on that provider): a client API whose body names
// the model can put the target there, for a route whose target is not the
// name the client asked for. StartTunnel calls it once per attempt, in
// order, on the caller's goroutine, so the tunnel it returns carries the
// body of the last call; an error from it ends StartTunnel with that error.
type TunnelBody func(target string) ([]byte, error)

// StartTunnel relays req with a body made by body to a candidate of plan
// (see Plan.WithAdapter) through the loop (loop.go), moving to another
// candidate (with a body made for its target) while nothing has come back:
// a Node lost or refusing before the response head. It returns once a head
// came back, or with why none did: a tunnel that ended before its head in
// a way the client is told returns its *nodeserver.TunnelError. The body
// is held in memory so that it can be sent again; the request's
// Content-Length header is set to the length of each body sent, whatever
// req said. req is the tunnel's from then on: it is not copied (a waiting
// tunnel holds one request, P3), and the caller must not use it again.
func (d *Dispatcher) StartTunnel(ctx context.Context, plan *Plan, req *wirepb.TunnelRequest, body TunnelBody, watch Watch) (*Tunnel, error) {
	t := d.newTunnel(ctx, plan, req, body, watch.Live)
	err := d.dispatch(t.ctx, t.id, &t.plan, t.deadline, &watch, t)
	if err == nil {
		err = t.headErr
	}
	if err != nil {
		t.Close()
		return nil, err
	}
	return t, nil
}

// newTunnel is StartTunnel's tunnel before its dispatch: a function of its
// own, as the dispatch loop says why.
func (d *Dispatcher) newTunnel(ctx context.Context, plan *Plan, req *wirepb.TunnelRequest, body TunnelBody, live *inflight.Entry) *Tunnel {
	t := &Tunnel{body: body}
	t.start(ctx, d, "tun", plan, live)
	t.base = req
	t.base.TunnelId = t.id
	t.base.DeadlineUnixMs = t.deadline.UnixMilli()
	t.base.ResponseStallTimeoutMs = plan.stallTimeoutMs()
	return t
}

// send is one attempt of the loop: the tunnel's request to c.
func (t *Tunnel) send(ctx context.Context, c *sched.Candidate, conn Conn, lease []byte, binding *wirepb.LeaseBinding) answer {
	b, err := t.body(c.Target)
	if err != nil { // the client's body: no other candidate would take it
		t.headErr = err
		return answer{err: err, end: Ending{Outcome: OutcomeFailed, Local: err.Error()}}
	}
	r := proto.CloneOf(t.base)
	r.Provider, r.Target = c.Provider, c.Target
	setContentLength(r, len(b))
	r.SealedLease, r.Binding = lease, binding
	ts, err := t.d.nodes.Tunnel(ctx, c.NodeID, r, bytes.NewReader(b))
	if err != nil {
		return answer{err: err}
	}
	t.ts = ts
	return answer{}
}

// wait waits for the head of the tunnel sent to c.
func (t *Tunnel) wait(c *sched.Candidate, conn Conn) answer {
	stop := watchSuspect(conn, c.NodeID, t.ts)
	head, err := t.ts.Head()
	stop()
	if err == nil {
		t.head = head
		return answer{}
	}
	t.headErr = err
	a := answer{err: err, abandoned: t.ts.Abandoned()}
	if te := (*nodeserver.TunnelError)(nil); errors.As(err, &te) {
		a.end = TunnelEnding(te)
	}
	return a
}

func (t *Tunnel) keep(slot Slot) { t.slot = slot }

func (t *Tunnel) drop() {
	if t.ts != nil {
		t.ts.Close()
	}
	t.ts, t.head, t.headErr = nil, nil, nil
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

// ID names the tunnel, for logs.
func (t *Tunnel) ID() string { return t.id }

// Head is the provider's response head.
func (t *Tunnel) Head() *wirepb.TunnelResponseHead { return t.head }

// Node is where the tunnel runs.
func (t *Tunnel) Node() sched.Candidate { return t.slot.Candidate() }

// NextPiece returns the next piece of the response body as the Node sent
// it (one body frame, what the provider flushed together), the caller's to
// keep: io.EOF at a completed end, a *nodeserver.TunnelError otherwise.
func (t *Tunnel) NextPiece() ([]byte, error) {
	p, err := t.ts.NextPiece()
	if len(p) > 0 {
		t.meter.output()
		t.out(p)
	}
	if err != nil && !t.ended {
		t.ended = true
		if te := (*nodeserver.TunnelError)(nil); errors.As(err, &te) {
			t.d.countStall(te.Stall)
		}
	}
	return p, err
}

// Ready reports whether NextPiece can return more without waiting: a relay then
// writes it before it flushes, one flush for both.
func (t *Tunnel) Ready() bool { return !t.ended && t.ts.Ready() }

// newline is what a tunnel's output is counted in: lines of its stream
// (Ollama's NDJSON: about one token each).
var newline = []byte{'\n'}

// out tells the status page about one piece of the body.
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

// CountUsage counts the tokens of a tunnel that completed, as the
// provider's answer reported them: the Edge relays a tunnel's bytes
// without reading them, so the client API that knows the answer's format
// reads them (Ollama's final line) and tells the dispatcher, which counts
// them by model, principal and Node, and the answer's pace. Call it once,
// after NextPiece returned io.EOF.
func (t *Tunnel) CountUsage(prompt, completion int64) {
	t.meter.usage = &wirepb.Usage{PromptTokens: prompt, CompletionTokens: completion}
	t.meter.end(t.slot.Candidate().NodeID, true)
	t.live.Usage(prompt, completion)
}

// Terminal is the tunnel's single outcome, once NextPiece has returned an
// error.
func (t *Tunnel) Terminal() *wirepb.TunnelTerminal { return t.ts.Terminal() }

// Cancel ends the tunnel with cause (client gone, idle timeout).
func (t *Tunnel) Cancel(cause error) { t.cancel(cause) }

// Context is the tunnel's context; its cause tells why it ended.
func (t *Tunnel) Context() context.Context { return t.ctx }

// Close releases everything the tunnel holds; safe to call more than once.
func (t *Tunnel) Close() {
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
func (d *Dispatcher) Metadata(ctx context.Context, adapter, method, path string, maxBody int64) []MetadataReply {
	jobs := d.nodes.Online(adapter)
	replies := make([]MetadataReply, len(jobs))
	done := make(chan struct{}, len(jobs))
	for i, j := range jobs {
		go func() {
			defer func() { done <- struct{}{} }()
			r := MetadataReply{NodeID: j.NodeID, Provider: j.Provider}
			ts, err := d.nodes.Tunnel(ctx, j.NodeID, &wirepb.TunnelRequest{
				TunnelId: d.newID("meta"), Provider: j.Provider, Method: method, Path: path, Metadata: true,
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
