package dispatch

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/iop-dev/iop/internal/edge/auth"
	"github.com/iop-dev/iop/internal/edge/edgeconfig"
	"github.com/iop-dev/iop/internal/edge/sched"
	"github.com/iop-dev/iop/internal/edge/wake"
)

// Waker wakes the sleeping Nodes a request needs (issue 23;
// *wake.Tracker). The dispatcher asks it only when no candidate serves
// the plan's model now.
type Waker interface {
	// Check says whether a request for r's model would wake a Node: nil
	// when one can be woken now, wake.ErrNotAsleep, or a
	// *wake.NoWakerError.
	Check(r wake.Request) error
	// Wake wakes one and waits until it is ready (nil), or says why not.
	Wake(ctx context.Context, r wake.Request) error
	// Asleep lists the sleeping Nodes' remembered offers.
	Asleep() []sched.Candidate
}

// WakeRetry is the Retry-After of a request whose Node did not wake
// within the wake timeout: a machine that is still booting may register
// any moment, and another wake is sent at the next request.
const WakeRetry = 5 * time.Second

// wakeRequest is plan's need for a sleeping Node, with the wake timeout of
// the configuration plan was resolved in.
func (d *Dispatcher) wakeRequest(plan Plan) wake.Request {
	return wake.Request{Model: plan.Model, Match: plan.Match, Timeout: d.config(plan.Principal).WakeTimeout()}
}

// awaken is called when no candidate serves plan: it wakes a sleeping
// Node that served the model and waits for it, holding the request up to
// the wake timeout. woke: a Node is ready now, acquire again. Otherwise
// err says why not, in the dispatcher's terms (a no_candidate refusal
// that names the Node when nobody can wake it, ErrNotYetBack with
// Retry-After when it did not wake in time), or both are zero: no
// sleeping Node served the model, and the request is answered as
// without waking.
func (d *Dispatcher) awaken(ctx context.Context, plan Plan) (woke bool, err error) {
	if d.waker == nil {
		return false, nil
	}
	return d.wakeOutcome(plan, d.waker.Wake(ctx, d.wakeRequest(plan)))
}

// wakeable is awaken without waking or waiting, for Available: a model a
// request would wake a Node for counts as available.
func (d *Dispatcher) wakeable(plan Plan) (bool, error) {
	if d.waker == nil {
		return false, nil
	}
	return d.wakeOutcome(plan, d.waker.Check(d.wakeRequest(plan)))
}

// wakeOutcome is what the Waker said, in the dispatcher's terms. A Node
// nobody connected can wake, just after this Edge restarted, is answered
// as not yet back (retry): its wakers are likely reconnecting too.
func (d *Dispatcher) wakeOutcome(plan Plan, err error) (bool, error) {
	var nw *wake.NoWakerError
	var te *wake.TimeoutError
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, wake.ErrNotAsleep):
		return false, nil
	case errors.As(err, &nw):
		if nb := d.notYetBack(plan); nb != nil {
			return false, nb
		}
		return false, &sched.RefusalError{Reason: sched.ReasonNoCandidate, Model: plan.Model, Detail: nw.Error()}
	case errors.As(err, &te):
		return false, &NotYetBackError{Model: plan.Model, Detail: te.Error(), RetryAfter: WakeRetry}
	}
	return false, err
}

// asleep lists the models p may ask for that no candidate serves now but
// that a sleeping Node served, as Asleep offerings, the way returning
// lists those of a restart: a route's under its model name, any other
// target (for a principal allowed every route) under its own. listed
// holds the ids listed already. None while waking is off.
func (d *Dispatcher) asleep(p auth.Principal, listed map[string]bool) []Offering {
	if d.waker == nil || d.config(p).WakeTimeout() <= 0 {
		return nil
	}
	sleeping := d.waker.Asleep()
	if len(sleeping) == 0 {
		return nil
	}
	nodes := func(match func(sched.Candidate) bool) []string {
		var out []string
		for _, c := range sleeping {
			if match(c) && !slices.Contains(out, c.NodeID) {
				out = append(out, c.NodeID)
			}
		}
		return out
	}
	var out []Offering
	for _, r := range d.config(p).Routes {
		if !p.MayUse(r.Name) || listed[r.Model] {
			continue
		}
		listed[r.Model] = true
		if ns := nodes(routeMatch(r)); len(ns) > 0 {
			out = append(out, Offering{ID: r.Model, Asleep: ns})
		}
	}
	if p.MayUse(edgeconfig.AllRoutes) {
		for _, c := range sleeping {
			if !listed[c.Target] {
				listed[c.Target] = true
				out = append(out, Offering{ID: c.Target, Asleep: nodes(func(o sched.Candidate) bool { return o.Target == c.Target })})
			}
		}
	}
	return out
}
