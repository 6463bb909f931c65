package dispatch

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/iop-dev/iop/internal/edge/auth"
	"github.com/iop-dev/iop/internal/edge/edgeconfig"
	"github.com/iop-dev/iop/internal/edge/sched"
	"github.com/iop-dev/iop/internal/edge/served"
)

// NotYetBackRetry is the Retry-After of a model not yet back: a Node
// reconnecting to a restarted Edge is back within about a handshake, so a
// client that retries after a second most likely finds it.
const NotYetBackRetry = time.Second

// NotYetBackError is ErrNotYetBack for one model: why it is expected back.
type NotYetBackError struct {
	Model string
	// Since is how long ago the Edge started.
	Since time.Duration
	// Remembered: the Edge remembers the model served before its restart;
	// otherwise it remembers nothing (no data_dir) and is in its start-up
	// grace.
	Remembered bool
	// RetryAfter is when to try again.
	RetryAfter time.Duration
	// Detail, when set, is the whole message: the model is expected back
	// for another reason (its sleeping Node was woken but is not back
	// yet, wake.go).
	Detail string
}

func (e *NotYetBackError) Error() string {
	if e.Detail != "" {
		return e.Detail
	}
	if e.Remembered {
		return fmt.Sprintf("model %q was served before this Edge restarted %s ago; its Nodes are reconnecting; retry",
			e.Model, e.Since.Round(100*time.Millisecond))
	}
	return fmt.Sprintf("no Node offers model %q yet; the Edge started %s ago and its Nodes are reconnecting; retry",
		e.Model, e.Since.Round(100*time.Millisecond))
}

// Is makes errors.Is(err, ErrNotYetBack) hold.
func (e *NotYetBackError) Is(target error) bool { return target == ErrNotYetBack }

// notYetBack is the *NotYetBackError of plan's model when no candidate
// matches it but its Nodes are expected back: a Node that offered it
// before the restart has not registered again yet, or the Edge remembers
// nothing and is in its start-up grace; nil otherwise.
func (d *Dispatcher) notYetBack(plan Plan) error {
	if d.served == nil {
		return nil
	}
	since := d.served.Since()
	for _, o := range d.served.Pending() {
		if plan.Match(offerCandidate(o)) {
			return &NotYetBackError{Model: plan.Model, Since: since, Remembered: true, RetryAfter: NotYetBackRetry}
		}
	}
	if since, ok := d.served.Grace(); ok {
		return &NotYetBackError{Model: plan.Model, Since: since, RetryAfter: NotYetBackRetry}
	}
	return nil
}

// offerCandidate is a remembered offer as the candidate it was.
func offerCandidate(o served.Offer) sched.Candidate {
	return sched.Candidate{NodeID: o.NodeID, Provider: o.Provider, Adapter: o.Adapter, Target: o.Target}
}

// returning lists the models p may ask for that no candidate serves now
// but that are remembered from before the restart, with their Nodes not
// back yet, as Reconnecting offerings, as Inventory lists them: a route's
// under its model name, any other target (for a principal allowed every
// route) under its own. listed holds the ids Inventory lists already.
func (d *Dispatcher) returning(p auth.Principal, listed map[string]bool) []Offering {
	if d.served == nil {
		return nil
	}
	pending := d.served.Pending()
	if len(pending) == 0 {
		return nil
	}
	var out []Offering
	for _, r := range d.config(p).Routes {
		if !p.MayUse(r.Name) {
			continue
		}
		named := listed[r.Model]
		listed[r.Model] = true // a target of the route's name is listed under the route only
		if named {
			continue
		}
		match := routeMatch(r)
		for _, o := range pending {
			if match(offerCandidate(o)) {
				out = append(out, Offering{ID: r.Model, Reconnecting: true})
				break
			}
		}
	}
	if p.MayUse(edgeconfig.AllRoutes) {
		for _, o := range pending {
			if !listed[o.Target] {
				listed[o.Target] = true
				out = append(out, Offering{ID: o.Target, Reconnecting: true})
			}
		}
	}
	return out
}

// NotYetBackView is what a restarted Edge expects back, for the admin
// view (/admin/v1/queues' not_yet_back).
type NotYetBackView struct {
	// Models are the models served before the restart whose Nodes have not
	// registered again, with those Nodes: answered 503 retry meanwhile.
	Models []NotYetBackModel `json:"models"`
	// Until is when the Edge stops expecting them (the window's end);
	// nil when nothing is expected.
	Until *time.Time `json:"until,omitempty"`
	// Grace: the Edge remembers nothing (no data_dir): until Until, every
	// model no Node offers is answered 503 retry.
	Grace bool `json:"grace,omitempty"`
}

// NotYetBackModel is one target not back yet and the Nodes that served it.
type NotYetBackModel struct {
	Model string   `json:"model"`
	Nodes []string `json:"nodes"`
}

// NotYetBack is what the Edge expects back after its restart, by target.
func (d *Dispatcher) NotYetBack() NotYetBackView {
	v := NotYetBackView{Models: []NotYetBackModel{}}
	if d.served == nil {
		return v
	}
	at := map[string]int{}
	for _, o := range d.served.Pending() {
		i, ok := at[o.Target]
		if !ok {
			i, at[o.Target] = len(v.Models), len(v.Models)
			v.Models = append(v.Models, NotYetBackModel{Model: o.Target})
		}
		if m := &v.Models[i]; !slices.Contains(m.Nodes, o.NodeID) {
			m.Nodes = append(m.Nodes, o.NodeID)
		}
	}
	_, v.Grace = d.served.Grace()
	if len(v.Models) > 0 || v.Grace {
		until := d.served.Until()
		v.Until = &until
	}
	slices.SortFunc(v.Models, func(a, b NotYetBackModel) int { return strings.Compare(a.Model, b.Model) })
	return v
}
