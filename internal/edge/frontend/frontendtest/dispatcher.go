package frontendtest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/iop-dev/iop/internal/edge/auth"
	"github.com/iop-dev/iop/internal/edge/dispatch"
	"github.com/iop-dev/iop/internal/edge/edgeconfig"
	"github.com/iop-dev/iop/internal/edge/frontend"
	"github.com/iop-dev/iop/internal/edge/sched"
	"github.com/iop-dev/iop/internal/yamlconf"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

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
	// NotYetBack are models no Node offers yet that the Edge served
	// before it restarted: dispatch.ErrNotYetBack.
	NotYetBack []string
	// Offerings is the inventory; nil: every model asked for is served by
	// one Ollama server.
	Offerings []dispatch.Offering
	// Targets are the candidates' targets a tunnel tries, in order; nil:
	// the model's name.
	Targets []string
	// Replies are the metadata calls' answers, by path.
	Replies map[string][]dispatch.MetadataReply

	mu      sync.Mutex
	plans   []dispatch.Plan
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
	d.mu.Lock()
	d.plans = append(d.plans, plan)
	d.mu.Unlock()
	if slices.Contains(d.Unknown, plan.Model) {
		return fmt.Errorf("%w: %q", dispatch.ErrUnknownModel, plan.Model)
	}
	if slices.Contains(d.NotYetBack, plan.Model) {
		return notYetBack(plan.Model)
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
func (d *Dispatcher) StartRun(ctx context.Context, plan *dispatch.Plan, req *wirepb.RunRequest, watch dispatch.Watch) (frontend.Run, error) {
	d.mu.Lock()
	d.runReqs = append(d.runReqs, req)
	d.mu.Unlock()
	if err := d.start(ctx, *plan, watch); err != nil {
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
func (d *Dispatcher) StartTunnel(ctx context.Context, plan *dispatch.Plan, req *wirepb.TunnelRequest, body dispatch.TunnelBody, watch dispatch.Watch) (frontend.Tunnel, error) {
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
	if err := d.start(ctx, *plan, watch); err != nil {
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
func (d *Dispatcher) Embed(ctx context.Context, plan *dispatch.Plan, req *wirepb.EmbedRequest, watch dispatch.Watch, progress func()) (*dispatch.Embedding, error) {
	d.mu.Lock()
	d.embeds = append(d.embeds, req)
	d.mu.Unlock()
	if d.EmbedErr != nil {
		return nil, d.EmbedErr
	}
	if err := d.start(ctx, *plan, watch); err != nil {
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

// Ready is Available: the fake has no sleeping Nodes.
func (d *Dispatcher) Ready(_ context.Context, plan dispatch.Plan) error { return d.Available(plan) }

// Available is nil for a model of the inventory.
func (d *Dispatcher) Available(plan dispatch.Plan) error {
	if slices.Contains(d.Unknown, plan.Model) {
		return fmt.Errorf("%w: %q", dispatch.ErrUnknownModel, plan.Model)
	}
	if slices.Contains(d.NotYetBack, plan.Model) {
		return notYetBack(plan.Model)
	}
	if len(d.Candidates(plan)) == 0 {
		return &sched.RefusalError{Reason: sched.ReasonNoCandidate, Model: plan.Model}
	}
	return nil
}

// notYetBack is the error of a model remembered from before a restart 2 s
// ago.
func notYetBack(model string) error {
	return &dispatch.NotYetBackError{Model: model, Since: 2 * time.Second, Remembered: true, RetryAfter: dispatch.NotYetBackRetry}
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

// Plans are the plans work was started under (runs, tunnels, embedding
// calls), in order: the session, the size, the route the front end planned.
func (d *Dispatcher) Plans() []dispatch.Plan {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.plans)
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
