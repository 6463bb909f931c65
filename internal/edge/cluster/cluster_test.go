package cluster_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/iop-dev/iop/internal/edge/cluster"
	"github.com/iop-dev/iop/internal/edge/clusterdb"
	"github.com/iop-dev/iop/internal/edge/fleet"
	"github.com/iop-dev/iop/internal/pgtest"
)

func TestMain(m *testing.M) {
	if spec := os.Getenv(helperEnv); spec != "" {
		helperEdge(spec)
		return
	}
	pgtest.Main(m)
}

// helperEnv makes the test binary a helper Edge process: "id dsn".
const helperEnv = "IOP_CLUSTER_TEST_EDGE"

// helperEdge joins the cluster as an Edge of its own process, says so on
// stdout, and runs until it is killed.
func helperEdge(spec string) {
	id, dsn, _ := strings.Cut(spec, " ")
	cfg, err := clusterdb.Config(dsn, id)
	if err != nil {
		panic(err)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		panic(err)
	}
	c, err := cluster.New(pool, cluster.Options{Self: cluster.Self{ID: id, QUICAddr: id + ".test:7443"}})
	if err != nil {
		panic(err)
	}
	if err := c.Start(context.Background()); err != nil {
		panic(err)
	}
	fmt.Println("joined")
	select {}
}

// member is one Edge of a test cluster: its pool and membership.
type member struct {
	*cluster.Cluster
	id   string
	pool *pgxpool.Pool
	reg  *fleet.Registry
}

// join starts the Edge id on the database at dsn, with a pool of its own
// (as each edged has), and stops it when the test ends unless the test
// killed or stopped it.
func join(t *testing.T, dsn, id string, opts cluster.Options) *member {
	t.Helper()
	cfg, err := clusterdb.Config(dsn, id)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	opts.Self = cluster.Self{ID: id, QUICAddr: id + ".test:7443", HTTPAddr: id + ".test:8080", Version: "test", ConfigHash: opts.Self.ConfigHash}
	if opts.Fleet == nil {
		opts.Fleet = fleet.New(fleet.Options{})
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})).With("edge", id)
	}
	c, err := cluster.New(pool, opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = c.Stop(ctx)
		pool.Close()
	})
	return &member{Cluster: c, id: id, pool: pool, reg: opts.Fleet}
}

func ids(ms []cluster.Member) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.ID
	}
	return out
}

// waitFor waits until ok holds of c's members, woken by Changed; it fails
// the test after within.
func waitFor(t *testing.T, c *member, within time.Duration, what string, ok func([]cluster.Member) bool) time.Duration {
	t.Helper()
	start := time.Now()
	deadline := time.NewTimer(within)
	defer deadline.Stop()
	for {
		changed := c.Changed()
		if ms := c.Members(); ok(ms) {
			return time.Since(start)
		}
		select {
		case <-changed:
		case <-deadline.C:
			t.Fatalf("%s: not within %v; members %v", what, within, ids(c.Members()))
		}
	}
}

func membersAre(want ...string) func([]cluster.Member) bool {
	return func(ms []cluster.Member) bool { return slices.Equal(ids(ms), want) }
}

// Issue 22: an Edge killed with kill -9 is dropped by the others within
// about a second: its session connection closes with its process, and the
// server releases its advisory lock at once.
func TestAKilledEdgeIsDroppedWithinSeconds(t *testing.T) {
	dsn := pgtest.Start(t)
	a, b, k := join(t, dsn, "edge-a", cluster.Options{}), join(t, dsn, "edge-b", cluster.Options{}), join(t, dsn, "edge-k", cluster.Options{})
	for _, m := range []*member{a, b, k} {
		waitFor(t, m, 10*time.Second, "all three see all three", membersAre("edge-a", "edge-b", "edge-k"))
	}
	killed := time.Now()
	k.Kill()
	for _, m := range []*member{a, b} {
		waitFor(t, m, 10*time.Second, "the killed Edge dropped", membersAre("edge-a", "edge-b"))
		took := time.Since(killed)
		t.Logf("kill -9 noticed by %s after %v", m.id, took)
		// Well under the heartbeat's 5 s: the lock noticed it, not the
		// heartbeat's age.
		if took > 4*time.Second {
			t.Errorf("the killed Edge was dropped after %v, want about a second", took)
		}
	}
	v := a.View(context.Background())
	if len(v.Edges) != 3 || v.Edges[2].ID != "edge-k" || v.Edges[2].Alive {
		t.Errorf("view edges = %+v, want edge-k shown dead", v.Edges)
	}
}

// The same with a real process killed with SIGKILL: the kernel closes its
// connections, PostgreSQL releases its lock, the others drop it.
func TestAProcessKilledWithSIGKILLIsDroppedWithinSeconds(t *testing.T) {
	dsn := pgtest.Start(t)
	a := join(t, dsn, "edge-a", cluster.Options{})
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=edge-p "+dsn)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "joined\n" {
		t.Fatalf("the helper Edge said %q, %v", line, err)
	}
	waitFor(t, a, 10*time.Second, "a sees the process", membersAre("edge-a", "edge-p"))
	killed := time.Now()
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, a, 10*time.Second, "the killed process dropped", membersAre("edge-a"))
	took := time.Since(killed)
	t.Logf("SIGKILL noticed after %v", took)
	if took > 4*time.Second {
		t.Errorf("the killed process was dropped after %v, want about a second", took)
	}
}

// A planned stop: the Edge marks itself stopping (the others see it within
// about a second, by NOTIFY), then leaves (it is gone from their lists).
func TestStoppingAndLeavingAreSeenAtOnce(t *testing.T) {
	dsn := pgtest.Start(t)
	a, b := join(t, dsn, "edge-a", cluster.Options{}), join(t, dsn, "edge-b", cluster.Options{})
	waitFor(t, a, 10*time.Second, "a sees b", membersAre("edge-a", "edge-b"))
	b.MarkStopping()
	took := waitFor(t, a, 5*time.Second, "a sees b stopping", func(ms []cluster.Member) bool {
		return len(ms) == 2 && ms[1].Stopping
	})
	t.Logf("stopping seen after %v", took)
	if !b.Members()[1].Stopping {
		t.Errorf("b does not show itself stopping: %+v", b.Members())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := b.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	took = waitFor(t, a, 5*time.Second, "a sees b leave", membersAre("edge-a"))
	t.Logf("leave seen after %v", took)
	// b left before it let go of its lock: a saw its row go, not b die.
	if v := a.View(ctx); len(v.Edges) != 1 {
		t.Errorf("a left Edge stays in the view: %+v", v.Edges)
	}
}

// Fail static: with the database gone an Edge keeps the members it last
// knew, says the database is unreachable, and recovers when it is back.
func TestTheDatabaseGoneKeepsTheLastKnownMembers(t *testing.T) {
	srv := pgtest.NewServer(t)
	dsn := srv.CreateDatabase(t)
	a, b := join(t, dsn, "edge-a", cluster.Options{}), join(t, dsn, "edge-b", cluster.Options{})
	waitFor(t, a, 10*time.Second, "a sees b", membersAre("edge-a", "edge-b"))
	connect(t, b.reg, "n1")
	waitView(t, a, 10*time.Second, "n1=edge-b")
	srv.Stop(t)
	waitStats(t, a, 10*time.Second, "a notices the database gone", func(s cluster.Stats) bool { return !s.DatabaseReachable })
	if got := ids(a.Members()); !slices.Equal(got, []string{"edge-a", "edge-b"}) {
		t.Errorf("members with the database gone = %v, want the last known", got)
	}
	// The reads answer at once, from what was last read.
	start := time.Now()
	v := a.View(context.Background())
	if v.Database != "unreachable" || len(v.Edges) != 2 || !slices.Equal(edgesOf(v), []string{"n1=edge-b"}) {
		t.Errorf("view with the database gone: database %q, edges %+v, nodes %q", v.Database, v.Edges, edgesOf(v))
	}
	if _, err := a.Usage(context.Background(), cluster.UsageQuery{From: start.Add(-time.Hour), To: start}); !errors.Is(err, cluster.ErrUnreachable) {
		t.Errorf("usage with the database gone: %v, want ErrUnreachable", err)
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("the reads took %v with the database gone, want an answer at once", took)
	}
	srv.Start(t)
	waitStats(t, a, 15*time.Second, "a reaches the database again", func(s cluster.Stats) bool { return s.DatabaseReachable && s.Alive == 2 })
	b.MarkStopping()
	waitFor(t, a, 10*time.Second, "a sees b's state again", func(ms []cluster.Member) bool { return len(ms) == 2 && ms[1].Stopping })
}

// waitStats polls c's figures (they change without a signal) until ok.
func waitStats(t *testing.T, c *member, within time.Duration, what string, ok func(cluster.Stats) bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for !ok(c.Stats()) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v; stats %+v", what, within, c.Stats())
		}
		<-tick.C
	}
}

// Two processes with the same edge_id: the second does not take the
// first's place while the first holds the id's lock, and takes it when the
// first dies (an Edge restarted on another machine).
func TestTheSameIDTwiceDoesNotTakeOver(t *testing.T) {
	dsn := pgtest.Start(t)
	a := join(t, dsn, "edge-a", cluster.Options{Self: cluster.Self{ConfigHash: "first"}})
	b := join(t, dsn, "edge-b", cluster.Options{})
	hashOfA := func(want string) func([]cluster.Member) bool {
		return func(ms []cluster.Member) bool { return len(ms) == 2 && ms[0].ConfigHash == want }
	}
	waitFor(t, b, 10*time.Second, "b sees a", hashOfA("first"))
	join(t, dsn, "edge-a", cluster.Options{Self: cluster.Self{ConfigHash: "second"}})
	// Three heartbeats of a later (their times move on) the row is still
	// a's, not the second process's.
	var beats []time.Time
	waitMembers(t, b, 10*time.Second, "three heartbeats of a", func(ms []cluster.Member) bool {
		if len(ms) != 2 || ms[0].ConfigHash != "first" {
			t.Fatalf("the second process took edge-a's row: %+v", ms)
		}
		if n := len(beats); n == 0 || beats[n-1] != ms[0].HeartbeatAt {
			beats = append(beats, ms[0].HeartbeatAt)
		}
		return len(beats) > 3
	})
	a.Kill()
	took := waitFor(t, b, 10*time.Second, "the second process takes over", hashOfA("second"))
	t.Logf("the second process took over %v after the first was killed", took)
}

// waitMembers polls c's members (heartbeat times change without a signal)
// until ok.
func waitMembers(t *testing.T, c *member, within time.Duration, what string, ok func([]cluster.Member) bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for !ok(c.Members()) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v; members %+v", what, within, c.Members())
		}
		<-tick.C
	}
}
