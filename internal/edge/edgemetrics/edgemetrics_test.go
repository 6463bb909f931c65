package edgemetrics_test

import (
	"context"
	"errors"
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/iop-dev/iop/internal/edge/cluster"
	"github.com/iop-dev/iop/internal/edge/edgemetrics"
	"github.com/iop-dev/iop/internal/edge/fleet"
	"github.com/iop-dev/iop/quicwire"
)

// rttLink is a Node connection whose last heartbeat round trip took rtt
// and ended at at. It opens no streams and closes nothing.
type rttLink struct {
	rtt time.Duration
	at  time.Time
}

func (l rttLink) RTT() (time.Duration, time.Time) { return l.rtt, l.at }
func (rttLink) Close(quicwire.CloseCode, string)  {}
func (rttLink) OpenStream(context.Context, time.Duration) (*quic.Stream, error) {
	return nil, errors.New("rttLink opens no streams")
}

func scrape(t *testing.T, m *edgemetrics.Metrics) string {
	t.Helper()
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	b, _ := io.ReadAll(rec.Body)
	return string(b)
}

// Connection states, heartbeat RTTs and queue depths are read from their
// sources at scrape time; counters show what was counted.
func TestScrapeShowsNodesQueuesAndCounters(t *testing.T) {
	reg := fleet.New(fleet.Options{})
	c := reg.Register(fleet.ConnInfo{NodeID: "n1", Link: rttLink{2 * time.Millisecond, time.Now()}})
	reg.MarkReady(c, c.Generation(), nil)
	reg.Register(fleet.ConnInfo{NodeID: "n2"})
	m := edgemetrics.New(reg, func() map[string]int { return map[string]int{"llama3.2": 3} })
	m.Requests.WithLabelValues("openai_chat", "llama3.2", "alice", "ok").Inc()
	m.Stalls.WithLabelValues("request_stalled").Inc()
	out := scrape(t, m)
	for _, want := range []string{
		`iop_edge_node_connections{state="ready"} 1`,
		`iop_edge_node_connections{state="registering"} 1`,
		`iop_edge_node_connections{state="fenced"} 0`,
		`iop_edge_heartbeat_rtt_seconds{node="n1"} 0.002`,
		`iop_edge_queue_depth{model="llama3.2"} 3`,
		`iop_edge_requests_total{model="llama3.2",outcome="ok",principal="alice",route="openai_chat"} 1`,
		`iop_edge_stalls_total{classification="request_stalled"} 1`,
		`iop_edge_stalls_total{classification="health_unknown"} 0`, // closed sets start at zero
		`iop_edge_failovers_total{reason="node_suspect"} 0`,
		`iop_edge_cancellations_total{cause="client_gone"} 0`,
		`iop_edge_refusals_total{kind="registration"} 0`,
		`iop_edge_refusals_total{kind="join"} 0`,
		`iop_edge_active{kind="embed"} 0`,
		`go_goroutines`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("scrape lacks %s", want)
		}
	}
}

// Tokens are counted by model, principal and Node; an answer's pace is the
// tokens after the first over the time from the first to the end, and an
// answer without one (a single token, no time) is not observed.
func TestUsageIsCountedByModelPrincipalAndNode(t *testing.T) {
	m := edgemetrics.New(fleet.New(fleet.Options{}), nil)
	m.CountUsage("llama3.2", "alice", "gpu-1", 12, 101)
	m.CountUsage("llama3.2", "alice", "gpu-1", 3, 0)
	m.CountUsage("qwen3", "bob", "gpu-2", 0, 7)
	m.ObserveRate("llama3.2", 101, 2*time.Second) // 50 tokens/s
	m.ObserveRate("llama3.2", 1, time.Second)     // no pace
	m.ObserveRate("llama3.2", 5, 0)               // no pace
	var nilMetrics *edgemetrics.Metrics
	nilMetrics.CountUsage("x", "y", "z", 1, 1) // records nothing, does not panic
	nilMetrics.ObserveRate("x", 10, time.Second)

	out := scrape(t, m)
	for _, want := range []string{
		`iop_edge_prompt_tokens_total{model="llama3.2",node="gpu-1",principal="alice"} 15`,
		`iop_edge_completion_tokens_total{model="llama3.2",node="gpu-1",principal="alice"} 101`,
		`iop_edge_completion_tokens_total{model="qwen3",node="gpu-2",principal="bob"} 7`,
		`iop_edge_tokens_per_second_bucket{model="llama3.2",le="32"} 0`,
		`iop_edge_tokens_per_second_bucket{model="llama3.2",le="64"} 1`,
		`iop_edge_tokens_per_second_count{model="llama3.2"} 1`,
		`iop_edge_tokens_per_second_sum{model="llama3.2"} 50`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("scrape lacks %s", want)
		}
	}
	if strings.Contains(out, `iop_edge_prompt_tokens_total{model="qwen3"`) {
		t.Errorf("a zero count made a series:\n%s", out)
	}
}

// Every metric labelled by model, principal or node says in its help that
// the values are bounded, and how.
func TestLabelledMetricsSayTheirLabelsAreBounded(t *testing.T) {
	reg := fleet.New(fleet.Options{})
	c := reg.Register(fleet.ConnInfo{NodeID: "n1", Link: rttLink{2 * time.Millisecond, time.Now()}})
	reg.MarkReady(c, c.Generation(), nil)
	m := edgemetrics.New(reg, func() map[string]int { return map[string]int{"m": 1} })
	m.QueueWait.WithLabelValues("m").Observe(1)
	m.Requests.WithLabelValues("openai_chat", "m", "p", "ok").Inc()
	m.TimeToFirstToken.WithLabelValues("openai_chat", "m").Observe(1)
	m.CountUsage("m", "p", "n", 1, 2)
	m.ObserveRate("m", 3, time.Second)
	fams, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	for _, f := range fams {
		if !strings.HasPrefix(f.GetName(), "iop_edge_") {
			continue
		}
		labelled := false
		for _, l := range f.GetMetric()[0].GetLabel() {
			labelled = labelled || l.GetName() == "model" || l.GetName() == "principal" || l.GetName() == "node"
		}
		if !labelled {
			continue
		}
		seen++
		if !strings.Contains(f.GetHelp(), "bounded") {
			t.Errorf("%s is labelled by model, principal or node, and its help does not say the values are bounded: %q", f.GetName(), f.GetHelp())
		}
	}
	if seen != 8 {
		t.Errorf("%d metrics labelled by model, principal or node, want 8", seen)
	}
}

// stats is a cluster's figures, fixed.
type stats cluster.Stats

func (s stats) Stats() cluster.Stats { return cluster.Stats(s) }

// Issue 22: with the Edge's id given, every series it exports carries
// edge="<id>", under the same names; the cluster's figures are read at
// scrape time.
func TestEveryMetricCarriesTheEdgeLabel(t *testing.T) {
	reg := fleet.New(fleet.Options{})
	c := reg.Register(fleet.ConnInfo{NodeID: "n1", Link: rttLink{2 * time.Millisecond, time.Now()}})
	reg.MarkReady(c, c.Generation(), nil)
	m := edgemetrics.NewWith(reg, func() map[string]int { return map[string]int{"m": 1} }, edgemetrics.Options{
		EdgeID:  "edge-1",
		Cluster: stats{Clustered: true, Members: 3, Alive: 2, DatabaseReachable: true, LedgerBuffered: 5, LedgerDropped: 7},
	})
	m.Requests.WithLabelValues("openai_chat", "m", "alice", "ok").Inc()
	m.CountUsage("m", "alice", "n1", 1, 2)
	fams, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		for _, s := range f.GetMetric() {
			edge := ""
			for _, l := range s.GetLabel() {
				if l.GetName() == "edge" {
					edge = l.GetValue()
				}
			}
			if edge != "edge-1" {
				t.Errorf("%s %v has no edge label", f.GetName(), s.GetLabel())
			}
		}
	}
	out := scrape(t, m)
	for _, want := range []string{
		`iop_edge_requests_total{edge="edge-1",model="m",outcome="ok",principal="alice",route="openai_chat"} 1`,
		`iop_edge_prompt_tokens_total{edge="edge-1",model="m",node="n1",principal="alice"} 1`,
		`iop_edge_node_connections{edge="edge-1",state="ready"} 1`,
		`iop_edge_heartbeat_rtt_seconds{edge="edge-1",node="n1"} 0.002`,
		`go_goroutines{edge="edge-1"}`,
		`iop_edge_cluster_members{edge="edge-1"} 3`,
		`iop_edge_cluster_members_alive{edge="edge-1"} 2`,
		`iop_edge_cluster_database_reachable{edge="edge-1"} 1`,
		`iop_edge_cluster_ledger_buffered{edge="edge-1"} 5`,
		`iop_edge_cluster_ledger_dropped_total{edge="edge-1"} 7`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("scrape lacks %s", want)
		}
	}
}

// An Edge alone: one member, and no database to be reachable or not.
func TestAnEdgeAloneHasNoDatabaseMetric(t *testing.T) {
	solo := cluster.NewSingle(cluster.Self{ID: "solo"}, nil, cluster.LedgerOptions{})
	out := scrape(t, edgemetrics.NewWith(fleet.New(fleet.Options{}), nil, edgemetrics.Options{Cluster: solo}))
	if !strings.Contains(out, "iop_edge_cluster_members_alive 1") || strings.Contains(out, "iop_edge_cluster_database_reachable") {
		t.Errorf("an Edge alone's cluster metrics:\n%s", grep(out, "iop_edge_cluster_"))
	}
}

func grep(out, prefix string) string {
	var lines []string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, prefix) {
			lines = append(lines, l)
		}
	}
	return strings.Join(lines, "\n")
}
