package wake

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/iop-dev/iop/internal/edge/fleet"
	"github.com/iop-dev/iop/internal/edge/sched"
	"github.com/iop-dev/iop/quicwire"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// commands is a Commander that records the wake commands and answers
// them as a Node would: a Failure for a Node it does not list (fail).
type commands struct {
	mu   sync.Mutex
	sent []sent
	fail map[string]bool // wakers whose command fails
}

type sent struct{ via, node string }

func (c *commands) Command(_ context.Context, nodeID string, cmd *wirepb.CommandRequest) (*wirepb.CommandResult, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sent = append(c.sent, sent{via: nodeID, node: cmd.GetWakeNodeId()})
	if cmd.GetKind() != wirepb.CommandKind_COMMAND_KIND_WAKE {
		return nil, errors.New("not a wake command")
	}
	if c.fail[nodeID] {
		return &wirepb.CommandResult{Failure: &wirepb.Failure{Message: "network is unreachable"}}, nil
	}
	return &wirepb.CommandResult{}, nil
}

func (c *commands) all() []sent {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]sent(nil), c.sent...)
}

// fleetOf is a registry with Nodes made ready and fenced by name.
type fleetOf struct {
	t     *testing.T
	reg   *fleet.Registry
	conns map[string]*fleet.Conn
}

func newFleet(t *testing.T) *fleetOf {
	return &fleetOf{t: t, reg: fleet.New(fleet.Options{}), conns: map[string]*fleet.Conn{}}
}

// up registers node as ready, serving models, able to wake wakes.
func (f *fleetOf) up(node string, models []string, wakes ...string) {
	var targets []*wirepb.Target
	for _, m := range models {
		targets = append(targets, &wirepb.Target{Name: m})
	}
	var wt []*wirepb.WakeTarget
	for _, w := range wakes {
		wt = append(wt, &wirepb.WakeTarget{NodeId: w, Mac: "02:00:00:00:00:01", Broadcast: "10.0.0.255:9"})
	}
	c := f.reg.Register(fleet.ConnInfo{NodeID: node, WakeTargets: wt,
		Providers: []*wirepb.Provider{{Name: "ollama", Adapter: "ollama", Targets: targets}}})
	if err := f.reg.MarkReady(c, c.Generation(), nil); err != nil {
		f.t.Fatal(err)
	}
	f.conns[node] = c
}

// down fences node's connection: it went to sleep.
func (f *fleetOf) down(node string) {
	f.reg.Fence(f.conns[node], quicwire.CloseHeartbeatTimeout, "asleep")
}

func model(m string) Request {
	return Request{Model: m, Match: func(c sched.Candidate) bool { return c.Target == m }, Timeout: 2 * time.Minute}
}

// start runs a Tracker over f until the test ends.
func start(t *testing.T, f *fleetOf, cmd *commands, path string) (*Tracker, *Metrics) {
	m := NewMetrics(prometheus.NewRegistry())
	tr := New(Options{Source: f.reg, Commands: cmd, Path: path, Metrics: m})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); tr.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return tr, m
}

// Many requests for a sleeping Node's model send one wake, through the
// Node that lists it; they all go on when the Node registers, and the
// wake's time is what it took (issue 23).
func TestManyRequestsSendOneWakeAndGoOnWhenTheNodeIsReady(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFleet(t)
		cmd := &commands{}
		tr, m := start(t, f, cmd, "")
		f.up("gpu-1", []string{"small"}, "gpu-2")
		f.up("gpu-2", []string{"big"})
		synctest.Wait()
		f.down("gpu-2")
		synctest.Wait()
		if got := state(tr, "gpu-2"); got != Sleeping {
			t.Fatalf("gpu-2 is %s, want sleeping", got)
		}

		errs := make(chan error, 5)
		for range 5 {
			go func() { errs <- tr.Wake(context.Background(), model("big")) }()
		}
		synctest.Wait()
		if got := cmd.all(); len(got) != 1 || got[0] != (sent{via: "gpu-1", node: "gpu-2"}) {
			t.Fatalf("commands %v, want one wake of gpu-2 via gpu-1", got)
		}
		if got := state(tr, "gpu-2"); got != Waking {
			t.Fatalf("gpu-2 is %s, want waking", got)
		}

		time.Sleep(3 * time.Second)
		f.up("gpu-2", []string{"big"})
		for range 5 {
			if err := <-errs; err != nil {
				t.Fatalf("a request's wake: %v", err)
			}
		}
		if got := len(cmd.all()); got != 1 {
			t.Errorf("%d commands, want 1", got)
		}
		v := view(tr, "gpu-2")
		if v.State != Awake || v.LastWakeMillis != 3000 || v.LastVia != "gpu-1" {
			t.Errorf("after waking: %+v, want awake, 3000 ms via gpu-1", v)
		}
		if got := testutil.ToFloat64(m.Wakes.WithLabelValues(ResultSucceeded)); got != 1 {
			t.Errorf("succeeded %v, want 1", got)
		}
		if got := testutil.ToFloat64(m.Wakes.WithLabelValues(ResultSent)); got != 1 {
			t.Errorf("sent %v, want 1", got)
		}
	})
}

// A Node that does not come back gets the packet again every ResendEvery,
// at most MaxSends times, and its requests are answered at the wake
// timeout with an error that names it.
func TestWakeResendsThenTimesOut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFleet(t)
		cmd := &commands{}
		tr, m := start(t, f, cmd, "")
		f.up("gpu-1", nil, "gpu-2")
		f.up("gpu-2", []string{"big"})
		synctest.Wait()
		f.down("gpu-2")
		synctest.Wait()

		start := time.Now()
		errc := make(chan error, 1)
		go func() { errc <- tr.Wake(context.Background(), model("big")) }()
		time.Sleep(ResendEvery + time.Second)
		if got := len(cmd.all()); got != 2 {
			t.Fatalf("%d packets after %s, want 2 (sent, then sent again)", got, ResendEvery+time.Second)
		}
		err := <-errc
		var te *TimeoutError
		if !errors.As(err, &te) || te.Node != "gpu-2" || te.Via != "gpu-1" {
			t.Fatalf("got %v, want a timeout naming gpu-2 and gpu-1", err)
		}
		if took := time.Since(start); took != 2*time.Minute {
			t.Errorf("answered after %s, want the wake timeout, 2m", took)
		}
		if !strings.Contains(err.Error(), `node "gpu-2"`) || !strings.Contains(err.Error(), "retry") {
			t.Errorf("message %q", err)
		}
		if got := len(cmd.all()); got != MaxSends {
			t.Errorf("%d packets, want MaxSends (%d)", got, MaxSends)
		}
		if got := testutil.ToFloat64(m.Wakes.WithLabelValues(ResultTimedOut)); got != 1 {
			t.Errorf("timed_out %v, want 1", got)
		}
		if v := view(tr, "gpu-2"); v.State != Sleeping || v.LastTimedOutAt == nil {
			t.Errorf("after the timeout: %+v, want sleeping with the time out recorded", v)
		}
	})
}

// A waker whose command fails (it cannot send the packet) is not asked
// again while another can be.
func TestWakeMovesToAnotherWakerWhenOneFails(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFleet(t)
		cmd := &commands{fail: map[string]bool{"gpu-1": true}}
		tr, m := start(t, f, cmd, "")
		f.up("gpu-1", nil, "gpu-2")
		f.up("gpu-3", nil, "gpu-2")
		f.up("gpu-2", []string{"big"})
		synctest.Wait()
		f.down("gpu-2")
		synctest.Wait()
		go func() { _ = tr.Wake(context.Background(), model("big")) }()
		time.Sleep(ResendEvery + time.Second)
		got := cmd.all()
		if len(got) != 2 || got[0].via != "gpu-1" || got[1].via != "gpu-3" {
			t.Fatalf("commands %v, want gpu-1 (failed), then gpu-3", got)
		}
		if got := testutil.ToFloat64(m.Wakes.WithLabelValues(ResultSendFailed)); got != 1 {
			t.Errorf("send_failed %v, want 1", got)
		}
		f.up("gpu-2", []string{"big"})
		synctest.Wait()
	})
}

// With no waker connected the request is not held: the error says which
// Node sleeps and who could wake it. A model no sleeping Node served, or
// waking turned off, is not the Tracker's.
func TestNoConnectedWakerIsAnsweredAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFleet(t)
		cmd := &commands{}
		tr, _ := start(t, f, cmd, "")
		f.up("gpu-1", nil, "gpu-2")
		f.up("gpu-2", []string{"big"})
		synctest.Wait()
		f.down("gpu-2")
		f.down("gpu-1")
		synctest.Wait()

		err := tr.Wake(context.Background(), model("big"))
		var nw *NoWakerError
		if !errors.As(err, &nw) || !errors.Is(err, ErrCannotWake) {
			t.Fatalf("got %v, want a NoWakerError", err)
		}
		if want := "node gpu-2 is asleep and no connected node can wake it"; !strings.HasPrefix(err.Error(), want) {
			t.Errorf("message %q, want it to start %q", err, want)
		}
		if err := tr.Check(model("big")); !errors.As(err, &nw) {
			t.Errorf("Check: %v", err)
		}
		if err := tr.Wake(context.Background(), model("other")); !errors.Is(err, ErrNotAsleep) {
			t.Errorf("a model no sleeping Node served: %v", err)
		}
		off := model("big")
		off.Timeout = 0
		if err := tr.Wake(context.Background(), off); !errors.Is(err, ErrNotAsleep) {
			t.Errorf("waking off: %v", err)
		}
		if len(cmd.all()) != 0 {
			t.Errorf("commands sent: %v", cmd.all())
		}
	})
}

// The Edge remembers a sleeping Node's models and wakers in data_dir: a
// restarted Edge lists it and, once its waker is connected, wakes it.
func TestMemorySurvivesARestart(t *testing.T) {
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, FileName)
	synctest.Test(t, func(t *testing.T) {
		f := newFleet(t)
		tr, _ := start(t, f, &commands{}, path)
		f.up("gpu-1", nil, "gpu-2")
		f.up("gpu-2", []string{"big"})
		synctest.Wait()
		f.down("gpu-2")
		synctest.Wait()
		_ = tr
	})
	synctest.Test(t, func(t *testing.T) {
		f := newFleet(t)
		cmd := &commands{}
		tr, _ := start(t, f, cmd, path)
		synctest.Wait()
		if got := tr.Asleep(); len(got) != 1 || got[0].NodeID != "gpu-2" || got[0].Target != "big" {
			t.Fatalf("asleep after a restart: %v", got)
		}
		var nw *NoWakerError
		if err := tr.Check(model("big")); !errors.As(err, &nw) {
			t.Fatalf("before the waker is back: %v", err)
		}
		f.up("gpu-1", nil, "gpu-2")
		synctest.Wait()
		go func() { _ = tr.Wake(context.Background(), model("big")) }()
		synctest.Wait()
		if got := cmd.all(); len(got) != 1 || got[0].via != "gpu-1" {
			t.Fatalf("commands %v", got)
		}
		f.up("gpu-2", []string{"big"})
		synctest.Wait()
	})
}

// A waker that no longer lists a Node is no longer its waker; a Node no
// one lists is not shown.
func TestAWakerThatDropsANodeForgetsIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFleet(t)
		tr, _ := start(t, f, &commands{}, "")
		f.up("gpu-1", nil, "gpu-2")
		f.up("gpu-2", []string{"big"})
		synctest.Wait()
		if got := tr.Snapshot(); len(got) != 1 || got[0].Node != "gpu-2" || got[0].State != Awake {
			t.Fatalf("snapshot %+v", got)
		}
		f.up("gpu-1", nil)
		synctest.Wait()
		if got := tr.Snapshot(); len(got) != 0 {
			t.Fatalf("snapshot %+v, want none", got)
		}
	})
}

func view(tr *Tracker, node string) NodeView {
	for _, v := range tr.Snapshot() {
		if v.Node == node {
			return v
		}
	}
	return NodeView{}
}

func state(tr *Tracker, node string) State { return view(tr, node).State }
