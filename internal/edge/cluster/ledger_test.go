package cluster_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/iop-dev/iop/internal/edge/cluster"
	"github.com/iop-dev/iop/internal/pgtest"
)

// clock is a manual clock for the ledger's minutes.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Date(2026, 5, 1, 12, 0, 10, 0, time.UTC)} }

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// ledgerMember is an Edge whose ledger writes only when the test says.
func ledgerMember(t *testing.T, dsn, id string, clk *clock, max int) *member {
	t.Helper()
	return join(t, dsn, id, cluster.Options{Ledger: cluster.LedgerOptions{Flush: time.Hour, Now: clk.now, MaxBuffered: max}})
}

// count reads one number from m's database.
func count(t *testing.T, m *member, sql string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := m.pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// totals is the ledger's report grouped by dims over the whole test's day.
func totals(t *testing.T, m *member, by ...string) cluster.UsageReport {
	t.Helper()
	day := time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC)
	r, err := m.Usage(context.Background(), cluster.UsageQuery{From: day, To: day.Add(24 * time.Hour), By: by})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// Issue 22: usage is aggregated in memory and written in batches, one
// statement each, adding to the rows already there; every Edge's rows add
// up in the report.
func TestTheLedgerWritesBatchesThatAddUp(t *testing.T) {
	dsn := pgtest.Start(t)
	clk := newClock()
	a, b := ledgerMember(t, dsn, "edge-a", clk, 0), ledgerMember(t, dsn, "edge-b", clk, 0)
	for range 500 {
		a.Record("alice", "llama3.2", "n1", 10, 2)
	}
	for range 100 {
		a.Record("bob", "qwen", "n2", 5, 1)
	}
	if n := a.Ledger().Buffered(); n != 2 {
		t.Errorf("600 requests buffered as %d aggregates, want 2 (one per principal, model, Node and minute)", n)
	}
	ctx := context.Background()
	if err := a.Ledger().WriteLedger(ctx); err != nil {
		t.Fatal(err)
	}
	clk.advance(time.Minute)
	for range 300 {
		a.Record("alice", "llama3.2", "n1", 10, 2)
		b.Record("alice", "llama3.2", "n2", 1, 1)
	}
	if err := a.Ledger().WriteLedger(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.Ledger().WriteLedger(ctx); err != nil {
		t.Fatal(err)
	}
	if n := count(t, a, `SELECT count(*) FROM iop_usage_batches WHERE edge_id = 'edge-a'`); n != 2 {
		t.Errorf("edge-a wrote %d batches, want 2 (one statement per flush)", n)
	}
	if n := count(t, a, `SELECT count(*) FROM iop_usage`); n != 4 {
		t.Errorf("iop_usage has %d rows, want 4 (a minute, an Edge, a principal, a model and a Node each)", n)
	}
	if a.Ledger().Buffered() != 0 {
		t.Errorf("buffered after a write: %d", a.Ledger().Buffered())
	}
	r := totals(t, a)
	want := cluster.Counts{Requests: 1200, PromptTokens: 500*10 + 100*5 + 300*10 + 300*1, CompletionTokens: 500*2 + 100 + 300*2 + 300}
	if r.Total != want || len(r.Rows) != 1 {
		t.Errorf("total %+v (%d rows), want %+v", r.Total, len(r.Rows), want)
	}
	byNode := totals(t, b, cluster.ByPrincipal, cluster.ByNode)
	got := map[cluster.UsageDims]cluster.Counts{}
	for _, row := range byNode.Rows {
		got[row.UsageDims] = row.Counts
	}
	for dims, c := range map[cluster.UsageDims]cluster.Counts{
		{Principal: "alice", Node: "n1"}: {Requests: 800, PromptTokens: 8000, CompletionTokens: 1600},
		{Principal: "alice", Node: "n2"}: {Requests: 300, PromptTokens: 300, CompletionTokens: 300},
		{Principal: "bob", Node: "n2"}:   {Requests: 100, PromptTokens: 500, CompletionTokens: 100},
	} {
		if got[dims] != c {
			t.Errorf("%+v: %+v, want %+v", dims, got[dims], c)
		}
	}
	// What an Edge holds unwritten is in its own report already.
	a.Record("carol", "m", "n1", 7, 7)
	if r := totals(t, a, cluster.ByPrincipal); r.Total.Requests != 1201 || r.Rows[len(r.Rows)-1].Principal != "carol" {
		t.Errorf("the unwritten request is not in the report: %+v", r)
	}
}

// Issue 22: with the database stopped the ledger buffers, and catches up
// when it is back: nothing recorded is lost, nothing counted twice.
func TestTheLedgerCatchesUpAfterTheDatabaseStops(t *testing.T) {
	srv := pgtest.NewServer(t)
	dsn := srv.CreateDatabase(t)
	clk := newClock()
	a := ledgerMember(t, dsn, "edge-a", clk, 0)
	ctx := context.Background()
	a.Record("alice", "m", "n1", 1, 1)
	if err := a.Ledger().WriteLedger(ctx); err != nil {
		t.Fatal(err)
	}
	srv.Stop(t)
	for i := range 180 {
		a.Record("alice", "m", "n1", 10, 1)
		if i%60 == 0 {
			if err := a.Ledger().WriteLedger(ctx); err == nil {
				t.Fatal("a write with the database stopped succeeded")
			}
		}
		clk.advance(time.Second)
	}
	// Four minutes (12:00:10 to 12:03:09), and the batch of a write whose
	// outcome the broken connection hid, held to be sent again.
	if n := a.Ledger().Buffered(); n < 4 || n > 5 {
		t.Errorf("four minutes of usage buffered as %d aggregates, want 4 (5 with a batch held)", n)
	}
	srv.Start(t)
	deadline := time.Now().Add(15 * time.Second)
	for {
		err := a.Ledger().WriteLedger(ctx)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the ledger does not write after the database is back: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	r := totals(t, a)
	if want := (cluster.Counts{Requests: 181, PromptTokens: 1801, CompletionTokens: 181}); r.Total != want {
		t.Errorf("after the catch-up: %+v, want %+v", r.Total, want)
	}
	if a.Ledger().Buffered() != 0 || a.Ledger().Dropped() != 0 {
		t.Errorf("buffered %d dropped %d after the catch-up", a.Ledger().Buffered(), a.Ledger().Dropped())
	}
}

// Past its bound the buffer drops the oldest minute's aggregates, counted;
// the newest usage is kept and written.
func TestTheBufferDropsTheOldestMinutePastItsBound(t *testing.T) {
	srv := pgtest.NewServer(t)
	dsn := srv.CreateDatabase(t)
	clk := newClock()
	a := ledgerMember(t, dsn, "edge-a", clk, 4)
	srv.Stop(t)
	for minute := range 4 {
		a.Record("alice", "m", "n1", 1, 0)
		a.Record("bob", "m", "n1", 1, 0)
		if minute == 1 {
			_ = a.Ledger().WriteLedger(context.Background()) // fails: the batch stays held
		}
		clk.advance(time.Minute)
	}
	if n, d := a.Ledger().Buffered(), a.Ledger().Dropped(); n != 4 || d != 4 {
		t.Errorf("buffered %d, dropped %d; want the newest 2 minutes (4 aggregates) kept, the oldest 4 dropped", n, d)
	}
	srv.Start(t)
	deadline := time.Now().Add(15 * time.Second)
	for a.Ledger().WriteLedger(context.Background()) != nil {
		if time.Now().After(deadline) {
			t.Fatal("the ledger does not write after the database is back")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if n := count(t, a, `SELECT count(DISTINCT minute) FROM iop_usage`); n != 2 {
		t.Errorf("%d minutes written, want the newest 2", n)
	}
	if n := count(t, a, `SELECT count(*) FROM iop_usage WHERE minute = $1`, time.Date(2026, 5, 1, 12, 3, 0, 0, time.UTC)); n != 2 {
		t.Errorf("the last minute has %d rows, want 2", n)
	}
}

// A batch sent twice under its id (its first write's outcome was lost with
// its connection) is counted once.
func TestABatchSentAgainIsCountedOnce(t *testing.T) {
	dsn := pgtest.Start(t)
	a := ledgerMember(t, dsn, "edge-a", newClock(), 0)
	ctx := context.Background()
	for range 2 {
		if err := a.Ledger().SendBatch(ctx, 7, "alice", 100); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Ledger().SendBatch(ctx, 8, "alice", 100); err != nil {
		t.Fatal(err)
	}
	if r := totals(t, a); r.Total.PromptTokens != 200 || r.Total.Requests != 2 {
		t.Errorf("total %+v, want batch 7 once and batch 8", r.Total)
	}
}

// An Edge alone keeps its usage in memory: the same report, from there.
func TestASingleEdgeReportsItsUsageFromMemory(t *testing.T) {
	clk := newClock()
	s := cluster.NewSingle(cluster.Self{ID: "solo"}, nil, cluster.LedgerOptions{Now: clk.now})
	s.Record("alice", "m", "n1", 3, 4)
	clk.advance(time.Minute)
	s.Record("alice", "m", "n1", 3, 4)
	s.Record("bob", "m", "n2", 1, 1)
	day := time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC)
	r, err := s.Usage(context.Background(), cluster.UsageQuery{From: day, To: day.Add(24 * time.Hour), By: []string{cluster.ByPrincipal, cluster.ByEdge}})
	if err != nil {
		t.Fatal(err)
	}
	if r.Source != "memory" || len(r.Rows) != 2 || r.Rows[0].Principal != "alice" || r.Rows[0].Edge != "solo" ||
		r.Rows[0].Counts != (cluster.Counts{Requests: 2, PromptTokens: 6, CompletionTokens: 8}) {
		t.Errorf("report %+v", r)
	}
	// Only the minutes of the window count.
	r, _ = s.Usage(context.Background(), cluster.UsageQuery{From: day.Add(12*time.Hour + time.Minute), To: day.Add(24 * time.Hour)})
	if r.Total.Requests != 2 {
		t.Errorf("the last minute's total: %+v", r.Total)
	}
	if _, err := s.Usage(context.Background(), cluster.UsageQuery{By: []string{"colour"}}); err == nil {
		t.Error("a report by an unknown dimension was made")
	}
}
