// Package frontendtest is the one fake the client APIs' tests share: a
// frontend.Dispatcher whose runs, tunnels and embedding calls play
// scripts, and which records what the front end asked of it. A script is
// made of Steps: run events (Text, Completed, Ended...) or body pieces of
// a tunnel (Line, Chunk), each given after its delay (After) or once its
// gate is closed (Gated). Work whose script is used up says nothing until
// it is cancelled, as a provider in a long prefill does.
package frontendtest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/iop-dev/iop/internal/edge/auth"
	"github.com/iop-dev/iop/internal/edge/dispatch"
	"github.com/iop-dev/iop/internal/edge/edgeconfig"
	"github.com/iop-dev/iop/internal/edge/frontend"
	"github.com/iop-dev/iop/internal/edge/nodeserver"
	"github.com/iop-dev/iop/internal/edge/sched"
	"github.com/iop-dev/iop/internal/yamlconf"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// Step is one scripted piece of work: a run event, or a piece of a
// tunnel's body.
type Step struct {
	Event *wirepb.RunEvent
	Data  string
	Delay time.Duration
	Gate  <-chan struct{}
}

// Events of a run.
func Text(s string) Step {
	return event(wirepb.RunEventType_RUN_EVENT_TYPE_TEXT_DELTA, func(e *wirepb.RunEvent) { e.Text = s })
}
func Reasoning(s string) Step {
	return event(wirepb.RunEventType_RUN_EVENT_TYPE_REASONING_DELTA, func(e *wirepb.RunEvent) { e.Text = s })
}

// ToolCall is a tool call, or a fragment of the call of its index.
func ToolCall(index int32, id, name, args string) Step {
	return event(wirepb.RunEventType_RUN_EVENT_TYPE_TOOL_CALL_DELTA, func(e *wirepb.RunEvent) {
		e.ToolCall = &wirepb.ToolCall{Index: index, Id: id, Name: name, ArgumentsJson: []byte(args)}
	})
}

// Usage is a usage event of prompt and completion tokens.
func Usage(prompt, completion int64) Step {
	return event(wirepb.RunEventType_RUN_EVENT_TYPE_USAGE, func(e *wirepb.RunEvent) {
		e.Usage = &wirepb.Usage{PromptTokens: prompt, CompletionTokens: completion}
	})
}

// Completed is the COMPLETED terminal with its done reason.
func Completed(reason string) Step {
	return event(wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED, func(e *wirepb.RunEvent) { e.DoneReason = reason })
}

// Failed is a FAILED terminal of kind.
func Failed(kind wirepb.FailureKind, msg string) Step {
	return Ended(wirepb.RunEventType_RUN_EVENT_TYPE_FAILED, kind, msg)
}

// Ended is a terminal of type t, with a failure when kind or msg is set; a
// RESPONSE_STALLED one carries Stall.
func Ended(t wirepb.RunEventType, kind wirepb.FailureKind, msg string) Step {
	return event(t, func(e *wirepb.RunEvent) {
		if kind != wirepb.FailureKind_FAILURE_KIND_UNSPECIFIED || msg != "" {
			e.Failure = &wirepb.Failure{Kind: kind, Message: msg}
		}
		if t == wirepb.RunEventType_RUN_EVENT_TYPE_RESPONSE_STALLED {
			e.Stall = Stall
		}
	})
}

func event(t wirepb.RunEventType, set func(*wirepb.RunEvent)) Step {
	e := &wirepb.RunEvent{Type: t}
	set(e)
	return Step{Event: e}
}

// Line is a line of a tunnel's body; Chunk any piece of it.
func Line(s string) Step  { return Step{Data: s + "\n"} }
func Chunk(s string) Step { return Step{Data: s} }

// After gives s after d.
func After(d time.Duration, s Step) Step { s.Delay = d; return s }

// Gated gives s once gate is closed.
func Gated(gate <-chan struct{}, s Step) Step { s.Gate = gate; return s }

// TunnelEnd is how a tunnel's body ends other than completed: outcome o,
// with a failure when kind or msg is set; a RESPONSE_STALLED one carries
// Stall.
func TunnelEnd(o wirepb.TunnelOutcome, kind wirepb.FailureKind, msg string) error {
	te := &nodeserver.TunnelError{Outcome: o}
	if o == wirepb.TunnelOutcome_TUNNEL_OUTCOME_RESPONSE_STALLED {
		te.Stall = Stall
	}
	if kind != wirepb.FailureKind_FAILURE_KIND_UNSPECIFIED || msg != "" {
		te.Failure = &wirepb.Failure{Kind: kind, Message: msg}
	}
	return te
}

// Stall is the observation of the stalled terminals Ended and TunnelEnd
// make; StallText is how every API words it.
var Stall = &wirepb.StallObservation{StallTimeoutMs: 2000, SinceLastProgressMs: 2000, CloseConfirmed: true,
	ProviderHealth: "available", LivenessClassification: "request_stalled", HealthObservationSeq: 1, Retryable: true}

// StallText is how the failure of Stall reads.
const StallText = "the provider stopped responding: no progress for 2s (stall timeout 2s); provider health available, classification request_stalled"

// Embedded is a completed embedding call with vectors and its prompt
// tokens.
func Embedded(prompt int64, vectors ...[]float32) *dispatch.Embedding {
	e := &dispatch.Embedding{ID: "emb-1", Terminal: &wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED,
		Usage: &wirepb.Usage{PromptTokens: prompt}}}
	for _, v := range vectors {
		e.Vectors = append(e.Vectors, &wirepb.Vector{Values: v})
	}
	return e
}

// Offer is a model of the inventory served by one candidate of each of
// adapters, on Node n1.
func Offer(id string, adapters ...string) dispatch.Offering {
	o := dispatch.Offering{ID: id}
	for _, a := range adapters {
		o.Candidates = append(o.Candidates, sched.Candidate{NodeID: "n1", Provider: a, Adapter: a, Target: id, Capabilities: capsOf(a)})
	}
	return o
}

func capsOf(adapter string) []string {
	if adapter == "ollama" || adapter == "openai" || adapter == "simulator" {
		return []string{dispatch.CapEmbed, dispatch.CapComplete}
	}
	return nil
}

// Dispatcher is a fake frontend.Dispatcher. Set its fields before the
// first request; read what it recorded with its methods.
type Dispatcher struct {
	// Events are the events of every run started.
	Events []Step
	// Head is every tunnel's response head (nil: 200 application/x-ndjson),
	// Pieces its body, End how it ends (nil: completed). With Silent, a
	// tunnel whose pieces are used up says nothing until it is cancelled.
	Head   *wirepb.TunnelResponseHead
	Pieces []Step
	End    error
	Silent bool
	// Embedding is every embedding call's result; EmbedErr fails them.
	Embedding *dispatch.Embedding
	EmbedErr  error

	// StartErr fails every start with it. StartBlocks makes a start wait
	// for its context, as a queue wait does; QueueFor makes it wait that
	// long, then refuses it with queue_timeout; AdmitAfter makes it wait
	// that long, then go on.
	StartErr    error
	StartBlocks bool
	QueueFor    time.Duration
	AdmitAfter  time.Duration
	// Profile is the profile every model resolves to (nil: an idle
	// timeout of Idle, or an hour, and no keep-alives); Deadline is the
	// work's hard deadline (0: none).
	Profile  *edgeconfig.Profile
	Idle     time.Duration
	Deadline time.Duration
	// ResolveErr fails every Resolve; Forbidden are models the principal
	// may not use, Unknown models no route names and no Node offers.
	ResolveErr error
	Forbidden  []string
	Unknown    []string
	// Offerings is the inventory; nil: every model asked for is served by
	// one Ollama server.
	Offerings []dispatch.Offering
	// Targets are the candidates' targets a tunnel tries, in order; nil:
	// the model's name.
	Targets []string
	// Replies are the metadata calls' answers, by path.
	Replies map[string][]dispatch.MetadataReply

	mu      sync.Mutex
	runReqs []*wirepb.RunRequest
	runs    []*Run
	starts  []TunnelStart
	tunnels []*Tunnel
	embeds  []*wirepb.EmbedRequest
	meta    []string
}

var _ frontend.Dispatcher = (*Dispatcher)(nil)

// Resolve resolves model for p to a plan with the fake's profile.
func (d *Dispatcher) Resolve(p auth.Principal, model string) (dispatch.Plan, error) {
	if d.ResolveErr != nil {
		return dispatch.Plan{}, d.ResolveErr
	}
	if slices.Contains(d.Forbidden, model) {
		return dispatch.Plan{}, fmt.Errorf("%w: principal %q may not use %q", dispatch.ErrForbidden, p.Name, model)
	}
	profile := edgeconfig.Profile{Name: "default", IdleTimeout: yamlconf.Duration(time.Hour)}
	switch {
	case d.Profile != nil:
		profile = *d.Profile
	case d.Idle > 0:
		profile.IdleTimeout = yamlconf.Duration(d.Idle)
	}
	return dispatch.Plan{Principal: p, Model: model, Profile: profile,
		Match: func(c sched.Candidate) bool { return sched.SameModel(c.Target, model) }}, nil
}

// start plays what every start has in common: an unknown model, a queue
// wait, a refusal, admission.
func (d *Dispatcher) start(ctx context.Context, plan dispatch.Plan, watch dispatch.Watch) error {
	if slices.Contains(d.Unknown, plan.Model) {
		return fmt.Errorf("%w: %q", dispatch.ErrUnknownModel, plan.Model)
	}
	if d.QueueFor > 0 {
		select {
		case <-time.After(d.QueueFor):
			return &sched.RefusalError{Reason: sched.ReasonQueueTimeout, Model: plan.Model, RetryAfter: time.Second}
		case <-ctx.Done():
			return errors.Join(errors.New("sched: queued"), ctx.Err())
		}
	}
	if d.StartBlocks {
		<-ctx.Done()
		return errors.Join(errors.New("sched: queued"), ctx.Err())
	}
	if d.AdmitAfter > 0 {
		select {
		case <-time.After(d.AdmitAfter):
		case <-ctx.Done():
			return errors.Join(errors.New("sched: queued"), ctx.Err())
		}
	}
	if d.StartErr != nil {
		return d.StartErr
	}
	if watch.Admitted != nil {
		watch.Admitted()
	}
	return nil
}

// workContext is the context of started work: ctx with the fake's
// deadline.
func (d *Dispatcher) workContext(ctx context.Context) (context.Context, context.CancelCauseFunc, context.CancelFunc) {
	wctx, cancel := context.WithCancelCause(ctx)
	stop := context.CancelFunc(func() {})
	if d.Deadline > 0 {
		wctx, stop = context.WithTimeout(wctx, d.Deadline)
	}
	return wctx, cancel, stop
}

// StartRun starts a run that plays Events.
func (d *Dispatcher) StartRun(ctx context.Context, plan dispatch.Plan, req *wirepb.RunRequest, watch dispatch.Watch) (frontend.Run, error) {
	d.mu.Lock()
	d.runReqs = append(d.runReqs, req)
	d.mu.Unlock()
	if err := d.start(ctx, plan, watch); err != nil {
		return nil, err
	}
	r := &Run{work: work{id: "run-1", model: plan.Model, closed: make(chan struct{})}, steps: slices.Clone(d.Events)}
	r.ctx, r.cancel, r.stop = d.workContext(ctx)
	d.mu.Lock()
	d.runs = append(d.runs, r)
	d.mu.Unlock()
	return r, nil
}

// TunnelStart is what one StartTunnel was asked.
type TunnelStart struct {
	Model string
	Req   *wirepb.TunnelRequest
	// Body is the body made for the candidate tried last; Bodies the one
	// made for each target tried, in order.
	Body   []byte
	Bodies []string
}

// StartTunnel makes the body for each of Targets, as the dispatcher does
// once per candidate it tries, and starts a tunnel that plays Head,
// Pieces and End.
func (d *Dispatcher) StartTunnel(ctx context.Context, plan dispatch.Plan, req *wirepb.TunnelRequest, body dispatch.TunnelBody, watch dispatch.Watch) (frontend.Tunnel, error) {
	targets := d.Targets
	if targets == nil {
		targets = []string{plan.Model}
	}
	s := TunnelStart{Model: plan.Model, Req: req}
	for _, target := range targets {
		b, err := body(target)
		if err != nil {
			return nil, err
		}
		s.Body = b
		s.Bodies = append(s.Bodies, string(b))
	}
	d.mu.Lock()
	d.starts = append(d.starts, s)
	d.mu.Unlock()
	if err := d.start(ctx, plan, watch); err != nil {
		return nil, err
	}
	head := d.Head
	if head == nil {
		head = &wirepb.TunnelResponseHead{Status: 200, Headers: []*wirepb.Header{{Name: "Content-Type", Value: "application/x-ndjson"}}}
	}
	t := &Tunnel{work: work{id: "tun-1", model: plan.Model, closed: make(chan struct{})}, head: head,
		pieces: slices.Clone(d.Pieces), end: d.End, silent: d.Silent}
	t.ctx, t.cancel, t.stop = d.workContext(ctx)
	d.mu.Lock()
	d.tunnels = append(d.tunnels, t)
	d.mu.Unlock()
	return t, nil
}

// Embed answers with Embedding (or EmbedErr).
func (d *Dispatcher) Embed(ctx context.Context, plan dispatch.Plan, req *wirepb.EmbedRequest, watch dispatch.Watch, progress func()) (*dispatch.Embedding, error) {
	d.mu.Lock()
	d.embeds = append(d.embeds, req)
	d.mu.Unlock()
	if d.EmbedErr != nil {
		return nil, d.EmbedErr
	}
	if err := d.start(ctx, plan, watch); err != nil {
		return nil, err
	}
	if progress != nil {
		progress()
	}
	if d.Embedding == nil {
		return nil, errors.New("frontendtest: no Embedding scripted")
	}
	return d.Embedding, nil
}

// Candidates are the model's candidates in Offerings.
func (d *Dispatcher) Candidates(plan dispatch.Plan) []sched.Candidate {
	if d.Offerings == nil {
		return Offer(plan.Model, "ollama").Candidates
	}
	for _, o := range d.Offerings {
		if o.ID == plan.Model {
			return o.Candidates
		}
	}
	return nil
}

// Available is nil for a model of the inventory.
func (d *Dispatcher) Available(plan dispatch.Plan) error {
	if slices.Contains(d.Unknown, plan.Model) {
		return fmt.Errorf("%w: %q", dispatch.ErrUnknownModel, plan.Model)
	}
	if len(d.Candidates(plan)) == 0 {
		return &sched.RefusalError{Reason: sched.ReasonNoCandidate, Model: plan.Model}
	}
	return nil
}

// Inventory is Offerings.
func (d *Dispatcher) Inventory(auth.Principal) []dispatch.Offering { return d.Offerings }

// Metadata answers with Replies for path, and records the call as
// "METHOD path maxBody".
func (d *Dispatcher) Metadata(_ context.Context, _, method, path string, maxBody int64) []dispatch.MetadataReply {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.meta = append(d.meta, fmt.Sprintf("%s %s %d", method, path, maxBody))
	return slices.Clone(d.Replies[path])
}

// RunRequests are the run requests of every StartRun, in order.
func (d *Dispatcher) RunRequests() []*wirepb.RunRequest {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.runReqs)
}

// RunRequest is the only run request started.
func (d *Dispatcher) RunRequest(t testing.TB) *wirepb.RunRequest {
	t.Helper()
	reqs := d.RunRequests()
	if len(reqs) != 1 {
		t.Fatalf("%d runs started, want 1", len(reqs))
	}
	return reqs[0]
}

// Run is the only run started.
func (d *Dispatcher) Run(t testing.TB) *Run {
	t.Helper()
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.runs) != 1 {
		t.Fatalf("%d runs started, want 1", len(d.runs))
	}
	return d.runs[0]
}

// Runs are the runs started.
func (d *Dispatcher) Runs() []*Run {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.runs)
}

// Start is the only StartTunnel call.
func (d *Dispatcher) Start(t testing.TB) TunnelStart {
	t.Helper()
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.starts) != 1 {
		t.Fatalf("%d StartTunnel calls, want 1", len(d.starts))
	}
	return d.starts[0]
}

// Starts are the StartTunnel calls.
func (d *Dispatcher) Starts() []TunnelStart {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.starts)
}

// Tunnel is the only tunnel started.
func (d *Dispatcher) Tunnel(t testing.TB) *Tunnel {
	t.Helper()
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.tunnels) != 1 {
		t.Fatalf("%d tunnels started, want 1", len(d.tunnels))
	}
	return d.tunnels[0]
}

// Tunnels are the tunnels started.
func (d *Dispatcher) Tunnels() []*Tunnel {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.tunnels)
}

// EmbedRequests are the requests of every Embed call.
func (d *Dispatcher) EmbedRequests() []*wirepb.EmbedRequest {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.embeds)
}

// MetadataCalls are the Metadata calls, as "METHOD path maxBody".
func (d *Dispatcher) MetadataCalls() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.meta)
}

// work is what runs and tunnels share: their context, cancels and close.
type work struct {
	id, model string
	ctx       context.Context
	cancel    context.CancelCauseFunc
	stop      context.CancelFunc

	mu        sync.Mutex
	cancels   []error
	closeOnce sync.Once
	closed    chan struct{}
}

func (w *work) ID() string               { return w.id }
func (w *work) Context() context.Context { return w.ctx }
func (w *work) Node() sched.Candidate {
	return sched.Candidate{NodeID: "n1", Provider: "p1", Adapter: "ollama", Target: w.model}
}

func (w *work) Cancel(cause error) {
	w.mu.Lock()
	w.cancels = append(w.cancels, cause)
	w.mu.Unlock()
	w.cancel(cause)
}

func (w *work) Close() {
	w.closeOnce.Do(func() {
		w.stop()
		w.cancel(context.Canceled)
		close(w.closed)
	})
}

// Closed is closed once the front end closed the work.
func (w *work) Closed() <-chan struct{} { return w.closed }

// CancelledWith reports whether the work was cancelled with cause.
func (w *work) CancelledWith(cause error) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, c := range w.cancels {
		if errors.Is(c, cause) {
			return true
		}
	}
	return false
}

// wait gives s after its delay or gate; false when the work's context
// ended first.
func (w *work) wait(s Step) bool {
	var after <-chan time.Time
	if s.Delay > 0 {
		after = time.After(s.Delay)
	}
	if s.Gate == nil && after == nil {
		return w.ctx.Err() == nil
	}
	select {
	case <-s.Gate:
	case <-after:
	case <-w.ctx.Done():
		return false
	}
	return true
}

// Run plays its steps; Next is only called by the relaying goroutine,
// Cancel from anywhere.
type Run struct {
	work
	steps []Step
	done  bool
}

var _ frontend.Run = (*Run)(nil)

// Next gives the next step's event, or the CANCELLED terminal the
// transport makes when the run's context ends.
func (r *Run) Next() (*wirepb.RunEvent, error) {
	if r.done {
		return nil, io.EOF
	}
	if len(r.steps) > 0 {
		s := r.steps[0]
		r.steps = r.steps[1:]
		if !r.wait(s) {
			return r.cancelled(), nil
		}
		r.done = s.Event.GetType().IsTerminal()
		return s.Event, nil
	}
	<-r.ctx.Done()
	return r.cancelled(), nil
}

func (r *Run) cancelled() *wirepb.RunEvent {
	r.done = true
	return &wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_CANCELLED}
}

// Ready is false: every event is flushed as it comes.
func (r *Run) Ready() bool { return false }

// Tunnel plays its pieces; Read is only called by the relaying goroutine,
// Cancel from anywhere.
type Tunnel struct {
	work
	head   *wirepb.TunnelResponseHead
	pieces []Step
	end    error
	silent bool
	buf    []byte
	err    error // once the body has ended

	umu   sync.Mutex
	usage [][2]int64
}

var _ frontend.Tunnel = (*Tunnel)(nil)

func (t *Tunnel) Head() *wirepb.TunnelResponseHead { return t.head }

// Ready reports whether a read's rest is buffered.
func (t *Tunnel) Ready() bool { return len(t.buf) > 0 }

func (t *Tunnel) Read(p []byte) (int, error) {
	for len(t.buf) == 0 {
		if t.err != nil {
			return 0, t.err
		}
		t.buf, t.err = t.next()
	}
	n := copy(p, t.buf)
	t.buf = t.buf[n:]
	return n, nil
}

// next plays the next piece, or ends the body.
func (t *Tunnel) next() ([]byte, error) {
	if t.ctx.Err() != nil {
		return nil, t.cancelled()
	}
	if len(t.pieces) == 0 {
		switch {
		case t.silent:
			<-t.ctx.Done()
			return nil, t.cancelled()
		case t.end != nil:
			return nil, t.end
		}
		return nil, io.EOF
	}
	s := t.pieces[0]
	t.pieces = t.pieces[1:]
	if !t.wait(s) {
		return nil, t.cancelled()
	}
	return []byte(s.Data), nil
}

// cancelled is the terminal the transport makes when the tunnel's context
// ends.
func (t *Tunnel) cancelled() error {
	return &nodeserver.TunnelError{Outcome: wirepb.TunnelOutcome_TUNNEL_OUTCOME_CANCELLED, Err: context.Cause(t.ctx)}
}

// CountUsage records the usage the front end counted.
func (t *Tunnel) CountUsage(prompt, completion int64) {
	t.umu.Lock()
	defer t.umu.Unlock()
	t.usage = append(t.usage, [2]int64{prompt, completion})
}

// Counted is every CountUsage call: prompt, completion.
func (t *Tunnel) Counted() [][2]int64 {
	t.umu.Lock()
	defer t.umu.Unlock()
	return slices.Clone(t.usage)
}
