// Package gateway is where a client request becomes work on a Node: it
// resolves the model to a route and profile, checks the principal may use
// it, acquires a slot from the scheduler, dispatches the run or tunnel, and
// moves the work to another candidate when a Node is lost or refuses before
// the first byte reaches the client. The client APIs (OpenAI, Ollama) are
// translations on top of it.
package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/iop-dev/iop/internal/edge/auth"
	"github.com/iop-dev/iop/internal/edge/edgeconfig"
	"github.com/iop-dev/iop/internal/edge/live"
	"github.com/iop-dev/iop/internal/edge/metrics"
	"github.com/iop-dev/iop/internal/edge/nodeserver"
	"github.com/iop-dev/iop/internal/edge/sched"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// MaxAttempts bounds how many candidates one request tries before its
// first byte.
const MaxAttempts = 3

// Gateway dispatches client requests.
type Gateway struct {
	cfg     atomic.Pointer[edgeconfig.Config]
	sched   *sched.Scheduler
	srv     *nodeserver.Server
	metrics *metrics.Metrics
	log     *slog.Logger
	ids     atomic.Uint64
	prefix  string
	leases  *Leases
	live    *live.Tracker
}

// Options are the optional parts of a Gateway.
type Options struct {
	// Metrics records queue waits, failovers and stalls; nil records
	// nothing.
	Metrics *metrics.Metrics
	// Leases issues credential leases for the profiles that name a
	// credential; nil fails such requests with ErrCredentialUnavailable.
	Leases *Leases
	// Logger logs failovers; nil logs nothing.
	Logger *slog.Logger
	// Live tracks the work in flight and how it ended, for the status
	// page (live.go); nil tracks nothing.
	Live *live.Tracker
}

// New returns a gateway that schedules with s and dispatches through srv.
func New(cfg *edgeconfig.Config, s *sched.Scheduler, srv *nodeserver.Server, opts Options) *Gateway {
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	g := &Gateway{sched: s, srv: srv, metrics: opts.Metrics, leases: opts.Leases, log: log, live: opts.Live,
		prefix: fmt.Sprintf("%x", time.Now().UnixNano()&0xffffffffff)}
	g.cfg.Store(cfg)
	return g
}

// SetConfig makes cfg the configuration of requests whose principal carries none (see
// auth.Principal.Config); a config reload calls it after the authenticator's Replace. Work
// already resolved keeps its Plan, and with it its profile.
func (g *Gateway) SetConfig(cfg *edgeconfig.Config) { g.cfg.Store(cfg) }

// config is the configuration p's request resolves in: the one it was authenticated under, or
// the current one.
func (g *Gateway) config(p auth.Principal) *edgeconfig.Config {
	if p.Config != nil {
		return p.Config
	}
	return g.cfg.Load()
}

// NewID returns a new request id with the given prefix ("run", "tun").
func (g *Gateway) NewID(kind string) string {
	return fmt.Sprintf("%s-%s-%d", kind, g.prefix, g.ids.Add(1))
}

// Errors a client API maps to its own error shape.
var (
	// ErrForbidden: the principal may not use the model's route.
	ErrForbidden = errors.New("forbidden")
	// ErrUnknownModel: no route names the model and no Node offers it, in
	// any state: a 404 in each API's shape (SPEC P1), not the 503 of a
	// model that is known but cannot be served now.
	ErrUnknownModel = errors.New("unknown model")
	// ErrUnsupported: the model is served now, but by no provider whose
	// adapter does the kind of work asked for (Plan.Needs: embeddings, raw
	// completions): a 400, which the client can only change by asking
	// another model.
	ErrUnsupported = errors.New("unsupported")
)

// Plan is what a model resolves to: its route (if configured), its
// profile, and the filter of candidate targets.
type Plan struct {
	Model   string
	Route   string
	Profile edgeconfig.Profile
	Match   func(sched.Candidate) bool
	// Needs, if not "", is a capability the adapter of every candidate
	// must report (CapEmbed, CapComplete): the work is of a kind not every
	// adapter does. Match and Known do not look at it; acquire does.
	Needs string
}

// Capabilities a Plan may need, as adapters report them (sdk.CapEmbed,
// sdk.CapComplete; the Edge does not import the SDK).
const (
	CapEmbed    = "embed"
	CapComplete = "complete"
)

// Resolve finds the route and profile for model, in the configuration p
// was authenticated under, and checks that p may use it. The plan holds
// the profile by value: a reload after this does not change the work's
// timers or credential. A model with no configured route uses the default profile and any
// Node target of that name (Ollama's implicit ":latest" included); only a
// principal allowed every route ("*") may use it.
func (g *Gateway) Resolve(p auth.Principal, model string, adapter string) (Plan, error) {
	cfg := g.config(p)
	plan := Plan{Model: model, Profile: cfg.Profile(edgeconfig.DefaultProfileName)}
	if r, ok := cfg.RouteForModel(model); ok {
		plan.Route, plan.Profile = r.Name, cfg.Profile(r.Profile)
		plan.Match = routeMatch(r, adapter)
	} else {
		plan.Match = func(c sched.Candidate) bool {
			return (adapter == "" || c.Adapter == adapter) && sched.SameModel(c.Target, model)
		}
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
func routeMatch(r edgeconfig.Route, adapter string) func(sched.Candidate) bool {
	return func(c sched.Candidate) bool {
		if adapter != "" && c.Adapter != adapter {
			return false
		}
		if len(r.Targets) == 0 {
			return sched.SameModel(c.Target, r.Model)
		}
		for _, t := range r.Targets {
			if t.Target != c.Target || (t.Adapter != "" && t.Adapter != c.Adapter) {
				continue
			}
			if len(t.Nodes) == 0 {
				return true
			}
			for _, n := range t.Nodes {
				if n == c.NodeID {
					return true
				}
			}
		}
		return false
	}
}

// acquire takes a slot for plan, excluding candidates already tried, among
// the candidates whose adapter has what plan needs. A model that nothing
// offers at all is ErrUnknownModel; one offered now, but by no adapter that
// can do the work, ErrUnsupported.
func (g *Gateway) acquire(ctx context.Context, id string, plan Plan, tried []sched.Candidate) (*sched.Slot, error) {
	start := time.Now()
	match := plan.Match
	if plan.Needs != "" {
		match = func(c sched.Candidate) bool { return plan.Match(c) && slices.Contains(c.Capabilities, plan.Needs) }
	}
	slot, err := g.sched.Acquire(ctx, sched.Request{
		ID:            id,
		Model:         plan.Model,
		Match:         match,
		Exclude:       tried,
		QueueTimeout:  time.Duration(plan.Profile.QueueTimeout),
		MaxQueueDepth: plan.Profile.MaxQueueDepth,
	})
	if err == nil && g.metrics != nil {
		g.metrics.QueueWait.WithLabelValues(plan.Model).Observe(time.Since(start).Seconds())
	}
	if len(tried) == 0 && errors.Is(err, sched.ErrNoCandidate) {
		if !g.Known(plan) {
			return nil, fmt.Errorf("%w: %q: no route names it and no Node offers it", ErrUnknownModel, plan.Model)
		}
		if plan.Needs != "" && slices.ContainsFunc(g.sched.Candidates(), plan.Match) {
			return nil, fmt.Errorf("%w: model %q is served by no provider whose adapter implements %s", ErrUnsupported, plan.Model, plan.Needs)
		}
	}
	return slot, err
}

// Known reports whether plan's model exists for the Edge: a route names
// it, or a provider of a Node the registry still holds (in any state:
// ready, suspect, draining, or fenced and not yet forgotten) offers a
// target that plan matches. An unknown model is 404; a known one that no
// Node can serve now is 503.
func (g *Gateway) Known(plan Plan) bool {
	if plan.Route != "" {
		return true
	}
	if g.srv == nil {
		return false
	}
	return g.srv.Registry().Offers(func(nodeID, provider, adapter, target string) bool {
		return plan.Match(sched.Candidate{NodeID: nodeID, Provider: provider, Adapter: adapter, Target: target})
	})
}

// FailureCode is a failure kind's name as an API error code, e.g.
// "rate_limited"; both client APIs use it.
func FailureCode(k wirepb.FailureKind) string {
	if k == wirepb.FailureKind_FAILURE_KIND_UNSPECIFIED {
		return "failed"
	}
	return strings.ToLower(strings.TrimPrefix(k.String(), "FAILURE_KIND_"))
}

// busyOnNode reports a first answer that says the Node's own slots for the
// provider are all taken (capacity_exhausted) while the Edge's count had a
// slot free: the Edge frees a slot when it reads the work's terminal or
// cancels it, the Node when the provider call has returned, so for a
// moment after a cancel the Edge's count is ahead. That is not a reason to
// leave the candidate, and with one candidate it would refuse the request
// wrongly: the caller waits a moment (holdOff) and tries it again.
func busyOnNode(err error) bool {
	var failed *RunFailedError
	var te *nodeserver.TunnelError
	switch {
	case errors.As(err, &failed):
		return failed.Event.GetFailure().GetKind() == wirepb.FailureKind_FAILURE_KIND_CAPACITY_EXHAUSTED
	case errors.As(err, &te):
		return te.Failure.GetKind() == wirepb.FailureKind_FAILURE_KIND_CAPACITY_EXHAUSTED
	}
	return false
}

// maxHoldOffs bounds how often one request waits for a Node whose slots
// are still finishing (busyOnNode): about 2.5 s in all.
const maxHoldOffs = 7

// holdOff waits before the n-th retry of a candidate that was busy on its
// Node, 20 ms doubling each time; it reports false when ctx ended first or
// n is past maxHoldOffs.
func holdOff(ctx context.Context, n int) bool {
	if n >= maxHoldOffs {
		return false
	}
	t := time.NewTimer(20 * time.Millisecond << n)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
