// Package dispatch is where a client's request becomes work on a Node. It
// resolves the model to a Plan once (route, profile, the filter of
// candidate targets, the principal), and then runs one loop for every kind
// of work (a normalized run, a raw tunnel, an embedding call): acquire a
// slot, seal the credential lease, open the stream, wait for the first
// outcome, then keep the work there, hold off and try the same candidates
// again, or move to another candidate (loop.go). It knows nothing of HTTP:
// the client APIs' front end (internal/edge/frontend) calls it, and renders
// what it returns.
//
// It reaches the scheduler and the Node server through interfaces (Slots,
// Nodes), so that the loop is driven by a table test (loop_test.go);
// SchedulerSlots and ServerNodes adapt the real ones.
package dispatch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"github.com/iop-dev/iop/internal/edge/auth"
	"github.com/iop-dev/iop/internal/edge/edgeconfig"
	"github.com/iop-dev/iop/internal/edge/edgemetrics"
	"github.com/iop-dev/iop/internal/edge/sched"
	"github.com/iop-dev/iop/internal/edge/served"
	"github.com/iop-dev/iop/internal/transport"
)

// Dispatcher turns resolved requests into work on Nodes. It is safe for
// concurrent use.
type Dispatcher struct {
	cfg      atomic.Pointer[edgeconfig.Config]
	slots    Slots
	nodes    Nodes
	metrics  *edgemetrics.Metrics
	log      *slog.Logger
	leases   *Leases
	ids      atomic.Uint64
	prefix   string
	sessions *sessions
	served   *served.Memory
	waker    Waker // wake.go
}

// Options are the optional parts of a Dispatcher.
type Options struct {
	// Metrics records queue waits, failovers, stalls and usage; nil
	// records nothing.
	Metrics *edgemetrics.Metrics
	// Leases issues credential leases for the profiles that name a
	// credential; nil fails such requests with ErrCredentialUnavailable.
	Leases *Leases
	// Logger logs failovers; nil logs nothing.
	Logger *slog.Logger
	// Now is the clock of the session table; nil: time.Now.
	Now func() time.Time
	// Served is what the Edge served before it restarted: a model nobody
	// offers now that it remembers (or any, in its start-up grace) is
	// ErrNotYetBack, not ErrUnknownModel, and is listed. nil: none.
	Served *served.Memory
	// Waker wakes a sleeping Node that served a model no Node serves now
	// (wake.go, issue 23); nil: none is woken.
	Waker Waker
}

// New returns a dispatcher that resolves in cfg (until SetConfig), takes
// slots from slots and opens streams with nodes.
func New(cfg *edgeconfig.Config, slots Slots, nodes Nodes, opts Options) *Dispatcher {
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	now := opts.Now
	if now == nil {
		now = time.Now
	}
	d := &Dispatcher{slots: slots, nodes: nodes, metrics: opts.Metrics, leases: opts.Leases, log: log,
		prefix: fmt.Sprintf("%x", time.Now().UnixNano()&0xffffffffff), sessions: newSessions(now), served: opts.Served, waker: opts.Waker}
	d.cfg.Store(cfg)
	return d
}

// SetConfig makes cfg the configuration of requests whose principal
// carries none (see auth.Principal.Config); a config reload calls it after
// the authenticator's Replace. Work already resolved keeps its Plan, and
// with it its profile.
func (d *Dispatcher) SetConfig(cfg *edgeconfig.Config) { d.cfg.Store(cfg) }

// config is the configuration p's request resolves in: the one it was
// authenticated under, or the current one.
func (d *Dispatcher) config(p auth.Principal) *edgeconfig.Config {
	if p.Config != nil {
		return p.Config
	}
	return d.cfg.Load()
}

// newID returns a new work id of kind ("run", "tun", "emb", "lease").
func (d *Dispatcher) newID(kind string) string {
	return fmt.Sprintf("%s-%s-%d", kind, d.prefix, d.ids.Add(1))
}

// Errors of resolving and admitting; the front end renders each in every
// API's shape.
var (
	// ErrForbidden: the principal may not use the model's route.
	ErrForbidden = errors.New("forbidden")
	// ErrUnknownModel: no route names the model and no Node offers it, in
	// any state: a 404 in each API's shape (SPEC P1), not the 503 of a
	// model that is known but cannot be served now.
	ErrUnknownModel = errors.New("unknown model")
	// ErrNotYetBack: no Node offers the model now, but the Edge served it
	// before it restarted (or, remembering nothing, started moments ago)
	// and its Nodes are expected back: a 503 with Retry-After, so that
	// clients retry rather than conclude it does not exist. Matched by
	// every *NotYetBackError.
	ErrNotYetBack = errors.New("model not yet back")
	// ErrUnsupported: the model is served now, but by no provider whose
	// adapter does the kind of work asked for (Plan.Needs: embeddings, raw
	// completions): a 400, which the client can only change by asking
	// another model.
	ErrUnsupported = errors.New("unsupported")
	// ErrRequestTooLarge: the model is served now, but by no Node that
	// takes a request as large as this one (noded's
	// limits.max_request_mib): a 413.
	ErrRequestTooLarge = errors.New("request too large for every node serving the model")
)

// Capabilities a Plan may need, as adapters report them (sdk.CapEmbed,
// sdk.CapComplete; the Edge does not import the SDK).
const (
	CapEmbed       = "embed"
	CapComplete    = "complete"
	CapCountTokens = "count_tokens"
)

// Plan is what a request resolves to, once: the principal it runs for,
// the model it asked for, its route (if configured), its profile, and the
// filter of candidate targets. It holds the profile by value, so a reload
// after resolving does not change the work's timers or credential.
type Plan struct {
	Principal auth.Principal
	Model     string
	Route     string
	Profile   edgeconfig.Profile
	// Match filters candidates: the route's targets, or the model's own
	// name (Ollama's implicit ":latest" included), and an adapter
	// (WithAdapter).
	Match func(sched.Candidate) bool
	// Needs, if not "", is a capability the adapter of every candidate
	// must report (CapEmbed, CapComplete): the work is of a kind not every
	// adapter does. Match and Known do not look at it; acquire does.
	Needs string
	// Session is the client's name for the conversation this is a turn of
	// ("" for none): its turns prefer the candidate that ran the last one.
	Session string
	// Size is how many bytes the work's request is on the wire (0: small):
	// only a candidate whose Node takes that much is offered it
	// (sched.Candidate.MaxRequest).
	Size int
}

// deadline is the hard deadline of work of p that starts now (S5); it
// bounds the work's context and its leases, and travels to the Node.
func (p Plan) deadline() time.Time { return time.Now().Add(time.Duration(p.Profile.Deadline)) }

// stallTimeoutMs is the response-stall timeout every request of p carries,
// the same on every candidate it is tried on (R4).
func (p Plan) stallTimeoutMs() int64 {
	return time.Duration(p.Profile.ResponseStallTimeout).Milliseconds()
}

// WithAdapter is p among the candidates of adapter only: the raw tunnel,
// which relays one kind of server's own API. p is not changed.
func (p *Plan) WithAdapter(adapter string) *Plan {
	q := *p
	match := p.Match
	q.Match = func(c sched.Candidate) bool { return c.Adapter == adapter && match(c) }
	return &q
}

// Resolve finds the route and profile for model, in the configuration p
// was authenticated under, and checks that p may use it. A model with no
// configured route uses the default profile and any Node target of that
// name (Ollama's implicit ":latest" included); only a principal allowed
// every route ("*") may use it.
func (d *Dispatcher) Resolve(p auth.Principal, model string) (Plan, error) {
	cfg := d.config(p)
	plan := Plan{Principal: p, Model: model, Profile: cfg.Profile(edgeconfig.DefaultProfileName)}
	if r, ok := cfg.RouteForModel(model); ok {
		plan.Route, plan.Profile = r.Name, cfg.Profile(r.Profile)
		plan.Match = routeMatch(r)
	} else {
		plan.Match = func(c sched.Candidate) bool { return sched.SameModel(c.Target, model) }
	}
	switch {
	case plan.Route == "" && !p.MayUse(edgeconfig.AllRoutes):
		return Plan{}, fmt.Errorf("%w: model %q has no route, and principal %q may use only its routes", ErrForbidden, model, p.Name)
	case plan.Route != "" && !p.MayUse(plan.Route):
		return Plan{}, fmt.Errorf("%w: principal %q may not use route %q", ErrForbidden, p.Name, plan.Route)
	}
	return plan, nil
}

// routeMatch filters candidates by a route's configured targets.
func routeMatch(r edgeconfig.Route) func(sched.Candidate) bool {
	return func(c sched.Candidate) bool {
		if len(r.Targets) == 0 {
			return sched.SameModel(c.Target, r.Model)
		}
		for _, t := range r.Targets {
			if t.Target != c.Target || (t.Adapter != "" && t.Adapter != c.Adapter) {
				continue
			}
			if len(t.Nodes) == 0 || slices.Contains(t.Nodes, c.NodeID) {
				return true
			}
		}
		return false
	}
}

// acquire takes a slot for the work of plan, excluding candidates already
// tried, among the candidates whose adapter has what plan needs. A model
// that nothing offers at all is ErrUnknownModel; one offered now, but by
// no adapter that can do the work, ErrUnsupported.
//
// acquire is on the way of every request that waits for its first byte,
// whose goroutine keeps the stack it grew to (P3): its refusal path is a
// function of its own, so that the frame it pushes stays small.
func (d *Dispatcher) acquire(ctx context.Context, id string, plan *Plan, tried []sched.Candidate, prefer *sched.Candidate) (Slot, error) {
	start := time.Now()
	req := &sched.Request{
		ID:            id,
		Model:         plan.Model,
		Match:         plan.Match,
		Exclude:       tried,
		QueueTimeout:  time.Duration(plan.Profile.QueueTimeout),
		MaxQueueDepth: plan.Profile.MaxQueueDepth,
		Prefer:        prefer,
		PreferSlack:   AffinitySlack,
		WarmFirst:     d.config(plan.Principal).WarmFirst(),
	}
	if plan.Needs != "" || plan.Size > transport.OneFrameHeader {
		req.Match = plan.matchCapable
	}
	slot, err := d.slots.Acquire(ctx, *req)
	if err != nil && len(tried) == 0 && errors.Is(err, sched.ErrNoCandidate) {
		slot, err = d.refused(ctx, plan, req, err)
	}
	if err == nil && d.metrics != nil {
		d.metrics.QueueWait.WithLabelValues(plan.Model).Observe(time.Since(start).Seconds())
		d.metrics.RouteChoices.WithLabelValues(string(slot.Candidate().Choice)).Inc()
	}
	return slot, err
}

// capable is p.Match among the candidates whose adapter has what p needs.
func (p *Plan) capable(c sched.Candidate) bool {
	return p.Match(c) && (p.Needs == "" || slices.Contains(c.Capabilities, p.Needs))
}

// matchCapable is capable among the candidates whose Node takes p's size.
func (p *Plan) matchCapable(c sched.Candidate) bool { return p.capable(c) && takes(c, p.Size) }

// refused follows the scheduler's first refusal of req for want of a
// candidate, err: a model served by a sleeping Node only is woken, a Node
// that turned ready meanwhile is asked again, and otherwise the error says
// why nothing can take the work.
func (d *Dispatcher) refused(ctx context.Context, plan *Plan, req *sched.Request, err error) (Slot, error) {
	var slot Slot
	if !d.slots.Any(plan.Match) {
		// Served by a sleeping Node only: wake it, holding the request up
		// to the wake timeout, then queue as any other (wake.go).
		woke, werr := d.awaken(ctx, *plan)
		if werr != nil {
			return nil, werr
		}
		if woke {
			slot, err = d.slots.Acquire(ctx, *req)
		}
	}
	if errors.Is(err, sched.ErrNoCandidate) && d.slots.Any(req.Match) {
		// A Node became ready between the scheduler's refusal and now (a
		// Node reconnecting to a restarted Edge: its remembered models
		// stop being "not yet back" as it turns ready). Its slot is there
		// to take; asking again is the answer a moment later would give.
		slot, err = d.slots.Acquire(ctx, *req)
	}
	if !errors.Is(err, sched.ErrNoCandidate) {
		return slot, err
	}
	cands := d.slots.Candidates()
	switch {
	case !slices.ContainsFunc(cands, plan.Match):
		if err := d.absent(*plan); err != nil {
			return nil, err
		}
	case !slices.ContainsFunc(cands, plan.capable):
		return nil, fmt.Errorf("%w: model %q is served by no provider whose adapter implements %s", ErrUnsupported, plan.Model, plan.Needs)
	case !slices.ContainsFunc(cands, req.Match):
		largest := 0
		for _, c := range cands {
			if plan.capable(c) {
				largest = max(largest, maxRequest(c))
			}
		}
		return nil, fmt.Errorf("%w: the request is %d bytes; the Nodes serving model %q take at most %d (noded limits.max_request_mib)",
			ErrRequestTooLarge, plan.Size, plan.Model, largest)
	}
	return slot, err
}

// takes reports whether c's Node takes a request of size bytes.
func takes(c sched.Candidate, size int) bool { return size <= maxRequest(c) }

// maxRequest is the largest request c's Node takes: one frame for a Node
// that said nothing (an older noded).
func maxRequest(c sched.Candidate) int {
	if c.MaxRequest > 0 {
		return c.MaxRequest
	}
	return transport.OneFrameHeader
}

// absent says why no candidate at all matches plan: ErrNotYetBack for a
// model whose Nodes are expected back after a restart, ErrUnknownModel for
// one nobody offers, nil for one known (a route, a Node not ready) whose
// no_candidate refusal says it.
func (d *Dispatcher) absent(plan Plan) error {
	if err := d.notYetBack(plan); err != nil {
		return err
	}
	if !d.Known(plan) {
		return fmt.Errorf("%w: %q: no route names it and no Node offers it", ErrUnknownModel, plan.Model)
	}
	return nil
}

// Known reports whether plan's model exists for the Edge: a route names
// it, or a provider of a Node the registry still holds (in any state:
// ready, suspect, draining, or fenced and not yet forgotten) offers a
// target that plan matches. An unknown model is 404; a known one that no
// Node can serve now is 503.
func (d *Dispatcher) Known(plan Plan) bool {
	return plan.Route != "" || d.nodes != nil && d.nodes.Offers(plan.Match)
}
