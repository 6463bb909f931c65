package dispatch

import (
	"context"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/iop-dev/iop/internal/edge/auth"
	"github.com/iop-dev/iop/internal/edge/edgeconfig"
	"github.com/iop-dev/iop/internal/edge/edgemetrics"
	"github.com/iop-dev/iop/internal/edge/sched"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// choosingSlots records the requests it is asked for and grants slots of
// fl whose pick is choice, as the scheduler reports it.
type choosingSlots struct {
	*fakeFleet
	choice sched.Choice
	warm   []bool // each request's WarmFirst
}

func (c *choosingSlots) Acquire(ctx context.Context, r sched.Request) (Slot, error) {
	c.warm = append(c.warm, r.WarmFirst)
	slot, err := c.fakeFleet.Acquire(ctx, r)
	if err != nil {
		return nil, err
	}
	return chosenSlot{slot, c.choice}, nil
}

type chosenSlot struct {
	Slot
	choice sched.Choice
}

func (s chosenSlot) Candidate() sched.Candidate {
	c := s.Slot.Candidate()
	c.Choice = s.choice
	return c
}

// Issue 23: requests are routed warm first unless scheduling.warm_first is
// false, and each pick is counted by its reason (the metric's reasons are
// the scheduler's choices, each exported from the start).
func TestRequestsAreRoutedWarmFirstAndTheChoiceCounted(t *testing.T) {
	for _, warmFirst := range []bool{true, false} {
		cfg := loopConfig(t)
		if !warmFirst {
			cfg.Scheduling.WarmFirst = &warmFirst
		}
		slots := &choosingSlots{fakeFleet: newFakeFleet([]string{"a"}, nil), choice: sched.ChoiceSpill}
		m := edgemetrics.New(nil, nil)
		d := New(cfg, slots, slots.fakeFleet, Options{Metrics: m})
		plan, err := d.Resolve(auth.Principal{Name: "p", Routes: []string{edgeconfig.AllRoutes}}, "m")
		if err != nil {
			t.Fatal(err)
		}
		r, err := d.StartRun(t.Context(), &plan, &wirepb.RunRequest{}, Watch{})
		if err != nil {
			t.Fatal(err)
		}
		if r.Node().Choice != sched.ChoiceSpill {
			t.Errorf("the run's node says choice %q, want spill", r.Node().Choice)
		}
		r.Close()
		if !slices.Equal(slots.warm, []bool{warmFirst}) {
			t.Errorf("warm_first %v: requests asked WarmFirst %v", warmFirst, slots.warm)
		}
		if got := testutil.ToFloat64(m.RouteChoices.WithLabelValues("spill")); got != 1 {
			t.Errorf("route choices spill %v, want 1", got)
		}
	}
	var choices []string
	for _, c := range sched.Choices {
		choices = append(choices, string(c))
	}
	if !slices.Equal(choices, edgemetrics.RouteChoiceReasons) {
		t.Errorf("the metric's reasons %v differ from the scheduler's choices %v", edgemetrics.RouteChoiceReasons, choices)
	}
}
