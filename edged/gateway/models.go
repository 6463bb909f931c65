package gateway

import (
	"slices"
	"strings"

	"github.com/iop-dev/iop/edged/auth"
	"github.com/iop-dev/iop/edged/config"
	"github.com/iop-dev/iop/edged/nodes"
	"github.com/iop-dev/iop/edged/sched"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// Model is a model a principal may ask for, and whether a ready Node can
// serve it now.
type Model struct {
	ID        string
	Available bool
}

// Models lists what p may ask for: the configured routes it may use, and,
// for a principal allowed every route, every target that a ready Node's
// online provider serves. Sorted by id.
func (g *Gateway) Models(p auth.Principal, reg *nodes.Registry) []Model {
	var online []sched.Candidate
	for _, c := range reg.Ready() {
		for _, prov := range c.Providers() {
			if prov.GetState() != wirepb.ProviderState_PROVIDER_STATE_ONLINE {
				continue
			}
			for _, t := range prov.GetTargets() {
				online = append(online, sched.Candidate{NodeID: c.NodeID(), Adapter: prov.GetAdapter(), Target: t.GetName()})
			}
		}
	}
	seen := map[string]bool{}
	var out []Model
	for _, r := range g.cfg.Routes {
		if !p.MayUse(r.Name) {
			continue
		}
		avail := slices.ContainsFunc(online, routeMatch(r, ""))
		seen[r.Model] = true
		out = append(out, Model{ID: r.Model, Available: avail})
	}
	if p.MayUse(config.AllRoutes) {
		for _, c := range online {
			if !seen[c.Target] {
				seen[c.Target] = true
				out = append(out, Model{ID: c.Target, Available: true})
			}
		}
	}
	slices.SortFunc(out, func(a, b Model) int { return strings.Compare(a.ID, b.ID) })
	return out
}
