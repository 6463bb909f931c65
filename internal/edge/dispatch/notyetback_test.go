package dispatch

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/iop-dev/iop/internal/edge/auth"
	"github.com/iop-dev/iop/internal/edge/edgeconfig"
	"github.com/iop-dev/iop/internal/edge/fleet"
	"github.com/iop-dev/iop/internal/edge/nodeserver"
	"github.com/iop-dev/iop/internal/edge/sched"
	"github.com/iop-dev/iop/internal/edge/served"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *testClock) now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *testClock) add(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

// restarted is a dispatcher over an empty registry, as just after a
// restart, remembering mem.
func restarted(t *testing.T, yaml string, mem *served.Memory) (*Dispatcher, *fleet.Registry) {
	t.Helper()
	cfg, err := edgeconfig.Parse([]byte("listen: {http: \"127.0.0.1:8080\", quic: \"127.0.0.1:7443\"}\nidentity: {mode: loopback}\n" + yaml))
	if err != nil {
		t.Fatal(err)
	}
	reg := fleet.New(fleet.Options{})
	s := sched.New(reg, sched.Options{})
	return New(cfg, SchedulerSlots(s), ServerNodes(nodeserver.NewServer(nodeserver.Options{}, reg)), Options{Served: mem}), reg
}

func onlineProvider(name string, targets ...string) *wirepb.Provider {
	p := &wirepb.Provider{Name: name, Adapter: "ollama", Capacity: 1, State: wirepb.ProviderState_PROVIDER_STATE_ONLINE}
	for _, tg := range targets {
		p.Targets = append(p.Targets, &wirepb.Target{Name: tg})
	}
	return p
}

// Issue 26: after a restart, a model the Edge served before is "not yet
// back" (503, retry) until the Node that served it has registered again,
// through a route too, and listed as such; a name nobody ever served is
// still unknown (404); once the window has passed, a model whose Node
// never came back is unknown again.
func TestAModelServedBeforeTheRestartIsNotYetBack(t *testing.T) {
	path := filepath.Join(t.TempDir(), served.FileName)
	served.Open(served.Options{Path: path}).Update([]served.Offer{
		{NodeID: "n1", Provider: "ollama", Adapter: "ollama", Target: "llama3:latest"},
		{NodeID: "n2", Provider: "ollama", Adapter: "ollama", Target: "qwen:latest"},
	})
	c := &testClock{t: time.Unix(1e9, 0)}
	mem := served.Open(served.Options{Path: path, Now: c.now, Window: time.Minute})
	d, reg := restarted(t, "routes: [{name: fast, model: fast, targets: [{target: \"llama3:latest\"}]}]\n", mem)
	all := auth.Principal{Name: "a", Routes: []string{edgeconfig.AllRoutes}}
	ask := func(model string) error {
		t.Helper()
		plan, err := d.Resolve(all, model)
		if err != nil {
			t.Fatal(err)
		}
		_, startErr := d.StartRun(t.Context(), &plan, &wirepb.RunRequest{}, Watch{})
		if avail := d.Available(plan); errors.Is(avail, ErrNotYetBack) != errors.Is(startErr, ErrNotYetBack) ||
			errors.Is(avail, ErrUnknownModel) != errors.Is(startErr, ErrUnknownModel) {
			t.Errorf("%s: Available %v disagrees with StartRun %v", model, avail, startErr)
		}
		return startErr
	}

	for _, model := range []string{"llama3", "fast", "qwen"} {
		err := ask(model)
		var nb *NotYetBackError
		if !errors.As(err, &nb) || !nb.Remembered || nb.RetryAfter < time.Second || !strings.Contains(err.Error(), "reconnecting") {
			t.Errorf("%s served before the restart: %v, want ErrNotYetBack with a retry", model, err)
		}
	}
	if err := ask("ghost"); !errors.Is(err, ErrUnknownModel) {
		t.Errorf("a model nobody ever served: %v, want ErrUnknownModel", err)
	}
	var listed []string
	for _, o := range d.Inventory(all) {
		if !o.Reconnecting || len(o.Candidates) != 0 {
			t.Errorf("offering %+v: want Reconnecting without candidates", o)
		}
		listed = append(listed, o.ID)
	}
	if want := []string{"fast", "llama3:latest", "qwen:latest"}; !slices.Equal(listed, want) {
		t.Errorf("listed %v, want %v", listed, want)
	}
	if inv := d.Inventory(auth.Principal{Name: "r", Routes: []string{"fast"}}); len(inv) != 1 || inv[0].ID != "fast" {
		t.Errorf("a principal of one route is listed %+v, want only its route", inv)
	}

	if v := d.NotYetBack(); len(v.Models) != 2 || v.Models[0].Model != "llama3:latest" || !slices.Equal(v.Models[0].Nodes, []string{"n1"}) ||
		v.Until == nil || !v.Until.Equal(c.now().Add(time.Minute)) || v.Grace {
		t.Errorf("admin view %+v", v)
	}
	readyNode(t, reg, fleet.ConnInfo{NodeID: "n1"}, onlineProvider("ollama", "llama3:latest"))
	mem.Update(served.Offered(reg))
	if err := d.Available(planFor(t, d, "llama3")); err != nil {
		t.Errorf("llama3 with n1 back: %v", err)
	}
	if inv := d.Inventory(all); len(inv) != 3 || inv[1].Reconnecting || len(inv[1].Candidates) != 1 {
		t.Errorf("inventory with n1 back %+v", inv)
	}

	c.add(time.Minute)
	if v := d.NotYetBack(); len(v.Models) != 0 || v.Until != nil {
		t.Errorf("admin view after the window %+v", v)
	}
	if err := ask("qwen"); !errors.Is(err, ErrUnknownModel) {
		t.Errorf("qwen, its Node not back after the window: %v, want ErrUnknownModel", err)
	}
}

// readyDuring is Slots whose first Acquire, once refused, lets a Node
// turn ready before the refusal reaches the dispatcher: the race of a
// request that arrives as a reconnecting Node finishes its handshake.
type readyDuring struct {
	Slots
	once  sync.Once
	ready func()
}

func (r *readyDuring) Acquire(ctx context.Context, req sched.Request) (Slot, error) {
	slot, err := r.Slots.Acquire(ctx, req)
	r.once.Do(r.ready)
	return slot, err
}

// Issue 26: a request that the scheduler refuses "no candidate" just
// before the Node that serves its model turns ready (so the model is no
// longer "not yet back" either) takes that Node's slot; it is not told
// that no ready Node offers the model, which CI once saw right after an
// Edge's restart.
func TestARequestRacingANodeTurningReadyGetsItsSlot(t *testing.T) {
	path := filepath.Join(t.TempDir(), served.FileName)
	served.Open(served.Options{Path: path}).Update([]served.Offer{
		{NodeID: "n1", Provider: "ollama", Adapter: "ollama", Target: "llama3:latest"},
	})
	mem := served.Open(served.Options{Path: path, Window: time.Minute})
	cfg, err := edgeconfig.Parse([]byte("listen: {http: \"127.0.0.1:8080\", quic: \"127.0.0.1:7443\"}\nidentity: {mode: loopback}\n"))
	if err != nil {
		t.Fatal(err)
	}
	reg := fleet.New(fleet.Options{})
	slots := &readyDuring{Slots: SchedulerSlots(sched.New(reg, sched.Options{}))}
	slots.ready = func() {
		readyNode(t, reg, fleet.ConnInfo{NodeID: "n1"}, onlineProvider("ollama", "llama3:latest"))
		mem.Update(served.Offered(reg))
	}
	d := New(cfg, slots, ServerNodes(nodeserver.NewServer(nodeserver.Options{}, reg)), Options{Served: mem})
	slot, err := d.acquire(t.Context(), "r1", new(planFor(t, d, "llama3")), nil, nil)
	if err != nil {
		t.Fatalf("acquire as n1 turns ready: %v, want n1's slot", err)
	}
	defer slot.Release()
	if c := slot.Candidate(); c.NodeID != "n1" {
		t.Errorf("slot on %+v, want n1", c)
	}
}

// Issue 26: an Edge without data_dir remembers nothing: for the window
// after its start, any model nobody offers is "not yet back", saying how
// long ago the Edge started; then unknown again.
func TestWithoutAMemoryEveryModelIsNotYetBackDuringTheGrace(t *testing.T) {
	c := &testClock{t: time.Unix(1e9, 0)}
	mem := served.Open(served.Options{Now: c.now, Window: time.Minute})
	d, _ := restarted(t, "", mem)
	var nb *NotYetBackError
	if err := d.Available(planFor(t, d, "ghost")); !errors.As(err, &nb) || nb.Remembered || !strings.Contains(err.Error(), "the Edge started") {
		t.Errorf("in the grace: %v, want ErrNotYetBack of the grace", err)
	}
	c.add(time.Minute)
	if err := d.Available(planFor(t, d, "ghost")); !errors.Is(err, ErrUnknownModel) {
		t.Errorf("after the grace: %v, want ErrUnknownModel", err)
	}
}
