package dispatch

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/iop-dev/iop/internal/edge/auth"
	"github.com/iop-dev/iop/internal/edge/edgeconfig"
	"github.com/iop-dev/iop/internal/edge/fleet"
	"github.com/iop-dev/iop/internal/edge/nodeserver"
	"github.com/iop-dev/iop/internal/edge/sched"
	"github.com/iop-dev/iop/internal/edge/served"
	"github.com/iop-dev/iop/internal/edge/wake"
	"github.com/iop-dev/iop/quicwire"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// wakeCommands answers every wake command as a Node that sent the packet.
type wakeCommands struct{ n chan string }

func (c wakeCommands) Command(_ context.Context, via string, cmd *wirepb.CommandRequest) (*wirepb.CommandResult, error) {
	c.n <- via + ">" + cmd.GetWakeNodeId()
	return &wirepb.CommandResult{}, nil
}

// withWaker is a dispatcher over a real scheduler, registry and wake
// Tracker (its Run until the test ends), with yaml's configuration.
func withWaker(t *testing.T, yaml string) (*Dispatcher, *fleet.Registry, wakeCommands) {
	t.Helper()
	cfg, err := edgeconfig.Parse([]byte("listen: {http: \"127.0.0.1:8080\", quic: \"127.0.0.1:7443\"}\nidentity: {mode: loopback}\n" + yaml))
	if err != nil {
		t.Fatal(err)
	}
	reg := fleet.New(fleet.Options{})
	cmds := wakeCommands{n: make(chan string, 16)}
	tr := wake.New(wake.Options{Source: reg, Commands: cmds})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); tr.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	s := sched.New(reg, sched.Options{})
	return New(cfg, SchedulerSlots(s), ServerNodes(nodeserver.NewServer(nodeserver.Options{}, reg)), Options{Waker: tr}), reg, cmds
}

// sleeper registers gpu-1, which can wake gpu-2, and gpu-2 serving big,
// then puts gpu-2 to sleep.
func sleeper(t *testing.T, reg *fleet.Registry) *fleet.Conn {
	waker := readyNode(t, reg, fleet.ConnInfo{NodeID: "gpu-1", WakeTargets: []*wirepb.WakeTarget{{NodeId: "gpu-2", Mac: "02:00:00:00:00:02", Broadcast: "10.0.0.255:9"}}},
		onlineProvider("ollama", "small:latest"))
	c := readyNode(t, reg, fleet.ConnInfo{NodeID: "gpu-2"}, onlineProvider("ollama", "big:latest"))
	synctest.Wait()
	reg.Fence(c, quicwire.CloseHeartbeatTimeout, "asleep")
	synctest.Wait()
	return waker
}

// A request for a model only a sleeping Node served is held while a
// connected Node wakes it, and runs there once it registers (issue 23);
// the model is listed meanwhile, asleep, and counts as available.
func TestARequestWakesTheSleepingNodeThatServedItsModel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d, reg, cmds := withWaker(t, "")
		sleeper(t, reg)
		plan := planFor(t, d, "big")
		if err := d.Available(plan); err != nil {
			t.Fatalf("Available: %v, want nil (a request wakes it)", err)
		}
		inv := d.Inventory(auth.Principal{Name: "a", Routes: []string{edgeconfig.AllRoutes}})
		i := slices.IndexFunc(inv, func(o Offering) bool { return o.ID == "big:latest" })
		if i < 0 || !slices.Equal(inv[i].Asleep, []string{"gpu-2"}) || len(inv[i].Candidates) != 0 {
			t.Fatalf("inventory %+v, want big:latest asleep on gpu-2", inv)
		}

		type result struct {
			slot Slot
			err  error
		}
		got := make(chan result, 1)
		go func() {
			s, err := d.acquire(context.Background(), "r1", &plan, nil, nil)
			got <- result{s, err}
		}()
		if c := <-cmds.n; c != "gpu-1>gpu-2" {
			t.Fatalf("command %q", c)
		}
		time.Sleep(4 * time.Second)
		readyNode(t, reg, fleet.ConnInfo{NodeID: "gpu-2"}, onlineProvider("ollama", "big:latest"))
		r := <-got
		if r.err != nil {
			t.Fatalf("acquire: %v", r.err)
		}
		defer r.slot.Release()
		if c := r.slot.Candidate(); c.NodeID != "gpu-2" {
			t.Fatalf("ran on %+v, want gpu-2", c)
		}
	})
}

// Ready, Ollama's load call, wakes the sleeping Node and returns once it
// is ready, where Available only says a request would wake it (issue 23).
func TestReadyWakesTheSleeperAndWaitsForIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d, reg, cmds := withWaker(t, "")
		sleeper(t, reg)
		plan := planFor(t, d, "big")
		ready := make(chan error, 1)
		go func() { ready <- d.Ready(context.Background(), plan) }()
		if c := <-cmds.n; c != "gpu-1>gpu-2" {
			t.Fatalf("command %q", c)
		}
		synctest.Wait()
		select {
		case err := <-ready:
			t.Fatalf("Ready returned %v before the Node registered", err)
		default:
		}
		readyNode(t, reg, fleet.ConnInfo{NodeID: "gpu-2"}, onlineProvider("ollama", "big:latest"))
		if err := <-ready; err != nil {
			t.Fatalf("Ready: %v", err)
		}
		if err := d.Ready(context.Background(), plan); err != nil {
			t.Fatalf("Ready with the Node awake: %v", err)
		}
		select {
		case c := <-cmds.n:
			t.Fatalf("a second wake %q for a Node awake", c)
		default:
		}
	})
}

// A Node that does not wake in time: the request is answered 503 retry
// (ErrNotYetBack with Retry-After), naming the Node.
func TestANodeThatDoesNotWakeIsNotYetBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d, reg, cmds := withWaker(t, "scheduling: {wake_timeout: 30s}\n")
		sleeper(t, reg)
		go func() {
			for range cmds.n {
			}
		}()
		start := time.Now()
		_, err := d.acquire(context.Background(), "r1", new(planFor(t, d, "big")), nil, nil)
		var nb *NotYetBackError
		if !errors.As(err, &nb) || nb.RetryAfter != WakeRetry || !strings.Contains(err.Error(), `node "gpu-2"`) {
			t.Fatalf("got %v, want ErrNotYetBack naming gpu-2 with Retry-After", err)
		}
		if took := time.Since(start); took != 30*time.Second {
			t.Errorf("answered after %s, want the wake timeout", took)
		}
		close(cmds.n)
	})
}

// With its waker gone, the request is answered at once, as a Node not
// ready is (503 no_candidate), with the reason; with waking off, as
// before it.
func TestNoWakerOrWakingOffAnswersAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d, reg, _ := withWaker(t, "")
		waker := sleeper(t, reg)
		reg.Fence(waker, quicwire.CloseHeartbeatTimeout, "gone")
		synctest.Wait()
		_, err := d.acquire(context.Background(), "r1", new(planFor(t, d, "big")), nil, nil)
		if !errors.Is(err, sched.ErrNoCandidate) || !strings.Contains(err.Error(), "node gpu-2 is asleep and no connected node can wake it") {
			t.Fatalf("got %v", err)
		}
		if err := d.Available(planFor(t, d, "big")); !errors.Is(err, sched.ErrNoCandidate) {
			t.Errorf("Available: %v", err)
		}
	})
	synctest.Test(t, func(t *testing.T) {
		d, reg, _ := withWaker(t, "scheduling: {wake_timeout: 0s}\n")
		sleeper(t, reg)
		_, err := d.acquire(context.Background(), "r1", new(planFor(t, d, "big")), nil, nil)
		if !errors.Is(err, sched.ErrNoCandidate) || strings.Contains(err.Error(), "asleep") {
			t.Fatalf("waking off: %v, want the plain no_candidate", err)
		}
		inv := d.Inventory(auth.Principal{Name: "a", Routes: []string{edgeconfig.AllRoutes}})
		if slices.ContainsFunc(inv, func(o Offering) bool { return len(o.Asleep) > 0 }) {
			t.Errorf("waking off lists asleep models: %+v", inv)
		}
	})
}

// Just after a restart, a sleeping Node whose waker has not reconnected
// yet is not yet back (503 retry), as the Edge's other remembered models
// are: its waker is likely on its way back too.
func TestAfterARestartASleeperWithoutItsWakerIsNotYetBack(t *testing.T) {
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	servedPath := filepath.Join(dir, served.FileName)
	served.Open(served.Options{Path: servedPath}).Update([]served.Offer{{NodeID: "gpu-2", Provider: "ollama", Adapter: "ollama", Target: "big:latest"}})
	wakePath := filepath.Join(dir, wake.FileName)
	if err := os.WriteFile(wakePath, []byte(`{"version": 1, "nodes": [{"node": "gpu-2",
		"offers": [{"provider": "ollama", "adapter": "ollama", "target": "big:latest"}],
		"wakers": [{"node": "gpu-1", "mac": "02:00:00:00:00:02", "broadcast": "10.0.0.255:9"}]}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := edgeconfig.Parse([]byte("listen: {http: \"127.0.0.1:8080\", quic: \"127.0.0.1:7443\"}\nidentity: {mode: loopback}\n"))
	if err != nil {
		t.Fatal(err)
	}
	reg := fleet.New(fleet.Options{})
	tr := wake.New(wake.Options{Source: reg, Path: wakePath})
	d := New(cfg, SchedulerSlots(sched.New(reg, sched.Options{})), ServerNodes(nodeserver.NewServer(nodeserver.Options{}, reg)),
		Options{Served: served.Open(served.Options{Path: servedPath}), Waker: tr})
	_, err = d.acquire(context.Background(), "r1", new(planFor(t, d, "big")), nil, nil)
	if !errors.Is(err, ErrNotYetBack) {
		t.Fatalf("got %v, want not yet back", err)
	}
}
