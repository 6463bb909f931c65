package cluster_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/iop-dev/iop/internal/edge/cluster"
	"github.com/iop-dev/iop/internal/edge/fleet"
	"github.com/iop-dev/iop/internal/pgtest"
)

// connect registers node on reg and makes it ready.
func connect(t *testing.T, reg *fleet.Registry, node string) *fleet.Conn {
	t.Helper()
	c := reg.Register(fleet.ConnInfo{NodeID: node})
	if err := reg.MarkReady(c, c.Generation(), nil); err != nil {
		t.Fatal(err)
	}
	return c
}

// edgesOf is each Node of v with the Edges it is connected to:
// "n1=edge-a,edge-b".
func edgesOf(v cluster.View) []string {
	var out []string
	for _, n := range v.Nodes {
		s := n.ID + "="
		for i, l := range n.Edges {
			if i > 0 {
				s += ","
			}
			s += l.Edge
		}
		out = append(out, s)
	}
	return out
}

// waitView polls c's view (another Edge's rows change without a signal
// here) until it shows want.
func waitView(t *testing.T, c *member, within time.Duration, want ...string) time.Duration {
	t.Helper()
	start := time.Now()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		got := edgesOf(c.View(context.Background()))
		if slices.Equal(got, want) {
			return time.Since(start)
		}
		if time.Since(start) > within {
			t.Fatalf("%s's view: Nodes %q, want %q within %v", c.id, got, want, within)
		}
		<-tick.C
	}
}

// Issue 22: any Edge's view shows, for every Node, the Edges it is
// connected to; the rows of a dead Edge are ignored at once and removed.
func TestTheViewShowsEachNodesEdges(t *testing.T) {
	dsn := pgtest.Start(t)
	a, b := join(t, dsn, "edge-a", cluster.Options{}), join(t, dsn, "edge-b", cluster.Options{})
	waitFor(t, a, 10*time.Second, "a sees b", membersAre("edge-a", "edge-b"))
	connect(t, a.reg, "n1")
	connect(t, a.reg, "n2")
	connect(t, b.reg, "n1")
	took := waitView(t, a, 10*time.Second, "n1=edge-a,edge-b", "n2=edge-a")
	t.Logf("b's Node seen by a after %v", took)
	waitView(t, b, 10*time.Second, "n1=edge-a,edge-b", "n2=edge-a")
	v := a.View(context.Background())
	if l := v.Nodes[0].Edges[1]; l.State != fleet.Ready || l.Generation == 0 || l.Since.IsZero() {
		t.Errorf("n1 on edge-b = %+v, want ready with its generation", l)
	}
	if v.Edges[0].Nodes != 2 || v.Edges[1].Nodes != 1 {
		t.Errorf("Nodes per Edge: %+v", v.Edges)
	}

	// n2 fenced on a: not connected there any more.
	c2, _ := a.reg.Current("n2")
	a.reg.Fence(c2, 0, "test")
	waitView(t, b, 10*time.Second, "n1=edge-a,edge-b")

	b.Kill()
	waitView(t, a, 5*time.Second, "n1=edge-a")
	// The dead Edge's rows are removed from the table, not only ignored.
	deadline := time.Now().Add(5 * time.Second)
	for rows(t, a, "edge-b") != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the dead Edge's Node rows stay in iop_edge_nodes")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func rows(t *testing.T, m *member, edge string) int {
	t.Helper()
	var n int
	if err := m.pool.QueryRow(context.Background(), `SELECT count(*) FROM iop_edge_nodes WHERE edge_id = $1`, edge).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// A burst of registrations is written in a few batches (at most one write
// every NodesBatch), not one write per Node.
func TestNodeChangesAreWrittenInBatches(t *testing.T) {
	dsn := pgtest.Start(t)
	a := join(t, dsn, "edge-a", cluster.Options{NodesBatch: 500 * time.Millisecond, NodesResync: time.Hour})
	b := join(t, dsn, "edge-b", cluster.Options{})
	waitFor(t, b, 10*time.Second, "b sees a", membersAre("edge-a", "edge-b"))
	before := a.NodeWrites()
	start := time.Now()
	var want []string
	for i := range 100 {
		id := fmt.Sprintf("n%03d", i)
		connect(t, a.reg, id)
		want = append(want, id+"=edge-a")
	}
	waitView(t, b, 10*time.Second, want...)
	writes := a.NodeWrites() - before
	took := time.Since(start)
	t.Logf("100 registrations: %d writes in %v", writes, took)
	if limit := uint64(took/(500*time.Millisecond)) + 2; writes > limit {
		t.Errorf("%d writes for 100 registrations in %v, want at most %d (one per 500 ms)", writes, took, limit)
	}
}
