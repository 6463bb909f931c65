package dispatch

import (
	"context"
	"slices"
	"strings"

	"github.com/iop-dev/iop/internal/edge/auth"
	"github.com/iop-dev/iop/internal/edge/edgeconfig"
	"github.com/iop-dev/iop/internal/edge/sched"
)

// Offering is one model of the inventory: the name a client asks for, and
// the candidates that can serve it now, in the scheduler's order.
type Offering struct {
	ID         string
	Candidates []sched.Candidate
	// Reconnecting: no candidate serves it now (Candidates is empty), but
	// the Edge served it before it restarted and its Nodes are expected
	// back; a request for it is answered ErrNotYetBack (503, retry). It is
	// listed so that a client that lists, then asks, is told to retry
	// rather than find it gone.
	Reconnecting bool
	// Asleep: no candidate serves it now (Candidates is empty), but these
	// sleeping Nodes served it, and a request for it wakes one (wake.go,
	// issue 23). It is listed so that a client can pick it.
	Asleep []string
}

// Has reports whether any of o's candidates runs on adapter.
func (o Offering) Has(adapter string) bool {
	return slices.ContainsFunc(o.Candidates, func(c sched.Candidate) bool { return c.Adapter == adapter })
}

// Inventory lists what p may ask for and can be served now (SPEC P1): the
// configured routes it may use that have a candidate, under the route's
// model name, and, for a principal allowed every route, every target a
// candidate serves, under its own name (unless a route already lists it).
// The model lists of every API (/v1/models, /api/tags, /api/ps) read it,
// and it reads the scheduler's candidates, so a list and the routing agree:
// a listed model can be scheduled, an unlisted one cannot, with one
// exception: after a restart, a model remembered and not back yet is
// listed, Reconnecting; and one that only a sleeping Node served, which a
// request wakes, is listed Asleep. Sorted by id.
func (d *Dispatcher) Inventory(p auth.Principal) []Offering {
	cands := d.slots.Candidates()
	seen := map[string]bool{}
	var out []Offering
	for _, r := range d.config(p).Routes {
		if !p.MayUse(r.Name) {
			continue
		}
		seen[r.Model] = true
		match := routeMatch(r)
		var cs []sched.Candidate
		for _, c := range cands {
			if match(c) {
				cs = append(cs, c)
			}
		}
		if len(cs) > 0 {
			out = append(out, Offering{ID: r.Model, Candidates: cs})
		}
	}
	if p.MayUse(edgeconfig.AllRoutes) {
		at := map[string]int{}
		for _, c := range cands {
			if seen[c.Target] {
				continue
			}
			if i, ok := at[c.Target]; ok {
				out[i].Candidates = append(out[i].Candidates, c)
				continue
			}
			at[c.Target] = len(out)
			out = append(out, Offering{ID: c.Target, Candidates: []sched.Candidate{c}})
		}
	}
	listed := map[string]bool{}
	for _, o := range out {
		listed[o.ID] = true
	}
	out = append(out, d.returning(p, listed)...)
	out = append(out, d.asleep(p, listed)...)
	slices.SortFunc(out, func(a, b Offering) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// Candidates are the candidates that can serve plan now, in the
// scheduler's order.
func (d *Dispatcher) Candidates(plan Plan) []sched.Candidate { return d.slots.Matching(plan.Match) }

// Ready is Available for a call that may wait: a model that only a
// sleeping Node served wakes that Node, and Ready returns once it is
// ready, or says why not as a request for the model would be answered
// (wake.go). Ollama's load call (a chat or generate with nothing to run)
// uses it: loading a model that lives on a sleeping machine is waking it
// (issue 23).
func (d *Dispatcher) Ready(ctx context.Context, plan Plan) error {
	if d.slots.Any(plan.Match) {
		return nil
	}
	if woke, err := d.awaken(ctx, plan); woke || err != nil {
		return err
	}
	return d.Available(plan)
}

// Available is nil when work of plan can be scheduled now; otherwise it
// says why not, as StartRun would: ErrUnknownModel, ErrNotYetBack for a
// model whose Nodes are expected back after a restart, or a no_candidate
// refusal for a model that is known but that nobody can serve now. A
// model that only a sleeping Node served is available while a connected
// Node can wake it: a request for it wakes it (wake.go).
func (d *Dispatcher) Available(plan Plan) error {
	if d.slots.Any(plan.Match) {
		return nil
	}
	if ok, err := d.wakeable(plan); ok || err != nil {
		return err // a request would wake a sleeping Node (wake.go), or nobody can
	}
	if err := d.absent(plan); err != nil {
		return err
	}
	if d.slots.Any(plan.Match) {
		return nil // its Node turned ready since the first look (and so is no longer "not yet back")
	}
	return &sched.RefusalError{Reason: sched.ReasonNoCandidate, Model: plan.Model, Detail: "no ready node offers it now"}
}
