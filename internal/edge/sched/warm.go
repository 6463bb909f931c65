package sched

import (
	"time"

	"github.com/iop-dev/iop/quicwire/wirepb"
)

// Warm-first routing (issue 23, P9). A model server such as Ollama holds
// a few models in memory and loads another on demand, evicting one that
// is idle, which costs seconds to minutes; when every model it holds is in
// use it queues the load (and, Ollama being one queue, the requests behind
// it) until one is free. So among the candidates that can take a request
// now, the scheduler prefers, in tiers:
//
//  1. warm: the model is loaded there (the Node's Provider.loaded, or
//     all_loaded), or this Edge has work on it there now (loaded, or
//     being loaded for that work: the Node's report lags it);
//  2. room: it can be loaded there without evicting anything: nothing is
//     loaded, or fewer models than the server's max_loaded are (counting
//     those this Edge's work is loading). A Node that does not say what
//     is loaded (an older Node, an adapter without a report) ranks here
//     too: nothing says it is cold;
//  3. evict: loading it evicts a loaded model that is idle (in use
//     neither by the Node's report nor by this Edge's slots): nothing in
//     use is disturbed, but that model is gone for its next request;
//  4. cold: every model loaded there is in use, so loading this one waits
//     for them (and holds the server's other work meanwhile).
//
// Warm and room are taken at once, warm within bounded load (WarmSlack):
// a warm candidate is taken while its share of capacity in use is at most
// WarmSlack above the least busy warm or room candidate's; otherwise the
// least busy room candidate is (the model spills: a hot model gets a
// second server rather than a queue behind the first). Evict and cold
// are taken only when no warm or room candidate has a slot free, and then
// only by a request that has waited ColdWait in its queue for one (or that
// may not wait), unless no candidate is warm or has room at all: then the
// least damaging place is taken at once, evict before cold. With servers
// that hold one model each, evicting the other model to serve a burst
// makes that model's next requests evict in turn; a queue behind the warm
// Node is shorter unless it has lasted about a load's time. Within a tier
// the pick is as without tiers: the largest share of capacity free, then
// the fewest consecutive stalls, then in turn.
//
// The order of all the preferences, first to last:
//
//  0. what is not a candidate at all: a Node not ready or suspect (R1,
//     P4), a provider offline or a target unhealthy (R6), a candidate
//     already tried (Request.Exclude) or that Request.Match refuses;
//  1. what has no slot free now: this Edge's slots at the provider's
//     capacity or the connection's stream limit, or marked full by a
//     Node's busy refusal (full.go);
//  2. session affinity (Request.Prefer), within PreferSlack, when the
//     preferred candidate is warm or does not say (a Node that reports
//     the model unloaded has dropped its prompt cache with it);
//  3. the tiers above: warm within WarmSlack, room, then after ColdWait
//     evict and cold;
//  4. the largest share of capacity free, the fewest stalls, in turn.

// WarmSlack is how much busier, as a share of capacity, a warm candidate
// may be than the least busy warm or room one and still be preferred: with
// capacity 4, two runs more. Loading a model costs seconds; a place in a
// batch beside two more runs costs little.
const WarmSlack = 0.5

// ColdWait is how long a request routed warm first waits in its queue for
// a slot on a warm or room candidate before it takes one where its model
// would evict another: about a model's load on a GPU server. A queue that
// long behind the warm Node costs as much as loading the model elsewhere.
const ColdWait = 10 * time.Second

// Choice is why the scheduler picked a candidate: in the request's log
// line and the iop_edge_route_choices_total metric.
type Choice string

// The choices.
const (
	// ChoiceWarm: the model is loaded there.
	ChoiceWarm Choice = "warm"
	// ChoiceRoom: loaded nowhere that could take it; loaded there without
	// evicting anything.
	ChoiceRoom Choice = "room"
	// ChoiceEvict: loaded nowhere that could take it, and no room: loaded
	// there in place of an idle model.
	ChoiceEvict Choice = "evict"
	// ChoiceSpill: loaded elsewhere, but those are full or too busy
	// (WarmSlack); loaded there as well.
	ChoiceSpill Choice = "spill"
	// ChoiceCold: loading it there waits for a model in use to be free.
	ChoiceCold Choice = "cold"
	// ChoiceUnknown: the Node does not say what is loaded.
	ChoiceUnknown Choice = "unknown"
)

// Choices lists the choices, for metrics that start at zero.
var Choices = []Choice{ChoiceWarm, ChoiceRoom, ChoiceEvict, ChoiceSpill, ChoiceCold, ChoiceUnknown}

// Tiers of warmth, best first.
const (
	tierWarm = iota
	tierRoom
	tierEvict
	tierCold
)

// loadState is what one provider's Node says its server holds loaded,
// shared by the provider's candidates. Immutable.
type loadState struct {
	known, all bool
	max        int
	models     []*wirepb.LoadedModel
}

func newLoadState(p *wirepb.Provider) *loadState {
	return &loadState{known: p.GetLoadedKnown(), all: p.GetAllLoaded(), max: int(p.GetMaxLoaded()), models: p.GetLoaded()}
}

// holds reports whether the server holds target loaded.
func (l *loadState) holds(target string) bool {
	for _, m := range l.models {
		if sameName(m.GetName(), target) {
			return true
		}
	}
	return false
}

// sameName reports whether two model names are one model, either way
// round with Ollama's implicit ":latest".
func sameName(a, b string) bool { return SameModel(a, b) || SameModel(b, a) }

// warmthLocked is c's tier for its target, and the choice it would be
// reported as.
func (s *Scheduler) warmthLocked(c *candidate) (int, Choice) {
	l := c.load
	mine := s.byTarget[c.key()] // this Edge's slots on the provider, by target
	if l == nil {
		l = &loadState{}
	}
	if l.all || mine[c.Target] > 0 || l.known && l.holds(c.Target) {
		return tierWarm, ChoiceWarm
	}
	if !l.known {
		return tierRoom, ChoiceUnknown
	}
	occupied, idle := len(l.models), false
	for _, m := range l.models {
		used := int(m.GetInUse())
		for t, n := range mine {
			if sameName(t, m.GetName()) {
				used = max(used, n)
			}
		}
		idle = idle || used == 0
	}
	for t, n := range mine {
		if n > 0 && !l.holds(t) {
			occupied++ // being loaded for this Edge's work, and in use
		}
	}
	switch {
	case occupied == 0 || l.max > 0 && occupied < l.max:
		return tierRoom, ChoiceRoom
	case idle:
		return tierEvict, ChoiceEvict
	}
	return tierCold, ChoiceCold
}
