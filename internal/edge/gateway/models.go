package gateway

import (
	"fmt"
	"slices"
	"strings"

	"github.com/iop-dev/iop/internal/edge/auth"
	"github.com/iop-dev/iop/internal/edge/edgeconfig"
	"github.com/iop-dev/iop/internal/edge/sched"
)

// Model is a model a principal may ask for, and whether a ready Node can
// serve it now.
type Model struct {
	ID        string
	Available bool
}

// Offering is one model of the inventory: the name a client asks for, and
// the candidates that can serve it now, in the scheduler's order.
type Offering struct {
	ID         string
	Candidates []sched.Candidate
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
// a listed model can be scheduled, an unlisted one cannot. Sorted by id.
func (g *Gateway) Inventory(p auth.Principal) []Offering {
	cands := g.sched.Candidates()
	seen := map[string]bool{}
	var out []Offering
	for _, r := range g.config(p).Routes {
		if !p.MayUse(r.Name) {
			continue
		}
		seen[r.Model] = true
		match := routeMatch(r, "")
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
	slices.SortFunc(out, func(a, b Offering) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// Models lists the IDs of Inventory(p).
func (g *Gateway) Models(p auth.Principal) []Model {
	inv := g.Inventory(p)
	out := make([]Model, len(inv))
	for i, o := range inv {
		out[i] = Model{ID: o.ID, Available: true}
	}
	return out
}

// Offered returns the inventory entry for model as p would ask for it
// (Ollama's implicit ":latest" included), and whether there is one.
func (g *Gateway) Offered(p auth.Principal, model string) (Offering, bool) {
	plan, err := g.Resolve(p, model, "")
	if err != nil {
		return Offering{}, false
	}
	var cs []sched.Candidate
	for _, c := range g.sched.Candidates() {
		if plan.Match(c) {
			cs = append(cs, c)
		}
	}
	return Offering{ID: model, Candidates: cs}, len(cs) > 0
}

// Available is nil when a request by p for model can be scheduled now;
// otherwise it says why not, as StartRun would: ErrForbidden,
// ErrUnknownModel, or a no_candidate refusal for a model that is known but
// that nobody can serve now.
func (g *Gateway) Available(p auth.Principal, model string) error {
	plan, err := g.Resolve(p, model, "")
	if err != nil {
		return err
	}
	for _, c := range g.sched.Candidates() {
		if plan.Match(c) {
			return nil
		}
	}
	if !g.Known(plan) {
		return fmt.Errorf("%w: %q: no route names it and no Node offers it", ErrUnknownModel, model)
	}
	return &sched.RefusalError{Reason: sched.ReasonNoCandidate, Model: model, Detail: "no ready node offers it now"}
}
