package fleet_test

import (
	"errors"
	"testing"

	"github.com/iop-dev/iop/internal/edge/fleet"
	"github.com/iop-dev/iop/quicwire"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

func onlineProvider(health string) []*wirepb.Provider {
	return []*wirepb.Provider{{Name: "p", Adapter: "ollama", Capacity: 1, State: wirepb.ProviderState_PROVIDER_STATE_ONLINE,
		Targets: []*wirepb.Target{{Name: "m", Health: health}, {Name: "other"}}}}
}

func observation(c *fleet.Conn, seq uint64, class string) *wirepb.StallObservation {
	return &wirepb.StallObservation{NodeId: c.NodeID(), Generation: c.Generation(), HealthObservationSeq: seq,
		Provider: "p", Target: "m", LivenessClassification: class}
}

// R7 and the Edge's validation: an observation whose sequence is not above
// the last accepted on its connection, or of another or fenced generation,
// is stale and changes nothing.
func TestStaleObservationsAreIgnored(t *testing.T) {
	r := fleet.New(fleet.Options{})
	c, _ := register(r, "n1")
	if err := r.MarkReady(c, c.Generation(), onlineProvider("")); err != nil {
		t.Fatal(err)
	}
	if err := r.ObserveStall(c, observation(c, 2, quicwire.LivenessRequestStalled)); err != nil {
		t.Fatalf("first observation: %v", err)
	}
	for _, seq := range []uint64{2, 1} {
		if err := r.ObserveStall(c, observation(c, seq, quicwire.LivenessProviderUnhealthy)); !errors.Is(err, fleet.ErrStaleObservation) {
			t.Errorf("seq %d after 2: %v, want ErrStaleObservation", seq, err)
		}
	}
	other := observation(c, 3, quicwire.LivenessProviderUnhealthy)
	other.Generation++
	if err := r.ObserveStall(c, other); !errors.Is(err, fleet.ErrStaleObservation) {
		t.Errorf("observation of another generation: %v", err)
	}
	if h := c.TargetHealth("p", "m"); h.Unhealthy || h.Stalls != 1 {
		t.Fatalf("overlay after stale observations = %+v, want 1 stall, healthy", h)
	}
	// A new connection supersedes (fences) c: its observations are stale,
	// and the new one starts its own sequence at 1 (R7).
	c2, _ := register(r, "n1")
	if err := r.ObserveStall(c, observation(c, 9, quicwire.LivenessProviderUnhealthy)); !errors.Is(err, fleet.ErrStaleObservation) {
		t.Errorf("observation of a fenced generation: %v", err)
	}
	if err := r.ObserveStall(c2, observation(c2, 1, quicwire.LivenessRequestStalled)); err != nil {
		t.Errorf("first observation on the new connection: %v", err)
	}
}

// R6 at the Edge: provider_unhealthy takes the target out until the Node
// reports it back in an update taken after the observation; an update read
// before it (a lower sequence) cannot bring it back. request_stalled counts
// until a run completes.
func TestUnhealthyTargetComesBackOnlyByALaterReport(t *testing.T) {
	r := fleet.New(fleet.Options{})
	c, _ := register(r, "n1")
	if err := r.MarkReady(c, c.Generation(), onlineProvider("")); err != nil {
		t.Fatal(err)
	}
	changed := r.Changed()
	if err := r.ObserveStall(c, observation(c, 5, quicwire.LivenessProviderUnhealthy)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-changed:
	default:
		t.Error("an unhealthy target did not signal a change (the scheduler would not notice)")
	}
	if !c.TargetHealth("p", "m").Unhealthy || c.TargetHealth("p", "other").Unhealthy {
		t.Fatal("provider_unhealthy must mark exactly its target")
	}
	// An update the Node read before observation 5 still shows the target
	// healthy: it must not override the observation.
	r.UpdateProviders(c, onlineProvider(""), 4)
	if !c.TargetHealth("p", "m").Unhealthy {
		t.Fatal("an update older than the observation cleared it")
	}
	// The Node's own report after it (its mark set) keeps it out …
	r.UpdateProviders(c, onlineProvider(quicwire.TargetHealthUnavailable), 5)
	if !c.TargetHealth("p", "m").Unhealthy {
		t.Fatal("the Node's unavailable report cleared the overlay")
	}
	// … and its report after recovery brings it back.
	r.UpdateProviders(c, onlineProvider(""), 6)
	if c.TargetHealth("p", "m").Unhealthy {
		t.Fatal("the target stayed out after the Node reported it back")
	}

	for seq := uint64(7); seq < 10; seq++ {
		if err := r.ObserveStall(c, observation(c, seq, quicwire.LivenessRequestStalled)); err != nil {
			t.Fatal(err)
		}
	}
	if h := c.TargetHealth("p", "m"); h.Unhealthy || h.Stalls != 3 {
		t.Fatalf("after 3 request_stalled: %+v", h)
	}
	r.ObserveCompleted(c, "p", "m")
	if h := c.TargetHealth("p", "m"); h.Stalls != 0 {
		t.Fatalf("a completed run did not reset the stalls: %+v", h)
	}
	if err := r.ObserveStall(c, observation(c, 10, quicwire.LivenessHealthUnknown)); err != nil || c.TargetHealth("p", "m") != (fleet.TargetHealth{}) {
		t.Fatalf("health_unknown changed the overlay: %v %+v", err, c.TargetHealth("p", "m"))
	}
}

// A Node that registers with a target it already knows to be unavailable
// (a reconnect during recovery) has it out of selection from the start.
func TestReportedUnavailableTargetAtRegistration(t *testing.T) {
	r := fleet.New(fleet.Options{})
	c := r.Register(fleet.ConnInfo{NodeID: "n1", Providers: onlineProvider(quicwire.TargetHealthUnavailable)})
	if !c.TargetHealth("p", "m").Unhealthy {
		t.Fatal("a target reported unavailable at registration is selectable")
	}
}

// The admin view shows why a target is out of selection: the stall
// observation that took it out (its classification, sequence and time),
// then the Node's own report that keeps it out; and the stalls counted
// against a target still in selection.
func TestTheViewShowsTheEvidenceAgainstATarget(t *testing.T) {
	r := fleet.New(fleet.Options{})
	c, _ := register(r, "n1")
	if err := r.MarkReady(c, c.Generation(), onlineProvider("")); err != nil {
		t.Fatal(err)
	}
	evidence := func() map[string]fleet.TargetEvidence {
		t.Helper()
		v := r.Snapshot()
		if len(v) != 1 || len(v[0].Providers) != 1 {
			t.Fatalf("snapshot = %+v, want one node with one provider", v)
		}
		return v[0].Providers[0].Evidence
	}
	if ev := evidence(); len(ev) != 0 {
		t.Fatalf("evidence before any observation = %+v, want none", ev)
	}
	if err := r.ObserveStall(c, observation(c, 3, quicwire.LivenessProviderUnhealthy)); err != nil {
		t.Fatal(err)
	}
	ev := evidence()["m"]
	if !ev.Unhealthy || ev.Source != fleet.SourceStallObservation || ev.ObservationSeq != 3 ||
		ev.LastClassification != quicwire.LivenessProviderUnhealthy || ev.LastObservedAt == nil {
		t.Errorf("after provider_unhealthy: %+v, want unhealthy from stall observation 3 with its time", ev)
	}
	if _, ok := evidence()["other"]; ok {
		t.Error("evidence against a target nothing was observed about")
	}
	r.UpdateProviders(c, onlineProvider(quicwire.TargetHealthUnavailable), 4)
	if ev := evidence()["m"]; !ev.Unhealthy || ev.Source != fleet.SourceNodeReport || ev.ObservationSeq != 4 {
		t.Errorf("after the Node's unavailable report: %+v, want unhealthy by node report 4", ev)
	}
	r.UpdateProviders(c, onlineProvider(""), 5)
	if err := r.ObserveStall(c, observation(c, 6, quicwire.LivenessRequestStalled)); err != nil {
		t.Fatal(err)
	}
	if ev := evidence()["m"]; ev.Unhealthy || ev.Source != "" || ev.Stalls != 1 || ev.LastClassification != quicwire.LivenessRequestStalled {
		t.Errorf("back, then one request_stalled: %+v, want healthy with 1 stall", ev)
	}
}
