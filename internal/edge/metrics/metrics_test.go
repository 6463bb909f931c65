package metrics_test

import (
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/iop-dev/iop/internal/edge/metrics"
	"github.com/iop-dev/iop/internal/edge/nodes"
)

func scrape(t *testing.T, m *metrics.Metrics) string {
	t.Helper()
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	b, _ := io.ReadAll(rec.Body)
	return string(b)
}

// Connection states, heartbeat RTTs and queue depths are read from their
// sources at scrape time; counters show what was counted.
func TestScrapeShowsNodesQueuesAndCounters(t *testing.T) {
	reg := nodes.New(nil, 0)
	c := reg.Register(nodes.ConnInfo{NodeID: "n1", RTT: func() (time.Duration, time.Time) { return 2 * time.Millisecond, time.Now() }})
	reg.MarkReady(c, c.Generation(), nil)
	reg.Register(nodes.ConnInfo{NodeID: "n2"})
	m := metrics.New(reg, func() map[string]int { return map[string]int{"llama3.2": 3} })
	m.Requests.WithLabelValues("openai_chat", "ok").Inc()
	m.Stalls.WithLabelValues("request_stalled").Inc()
	out := scrape(t, m)
	for _, want := range []string{
		`iop_edge_node_connections{state="ready"} 1`,
		`iop_edge_node_connections{state="registering"} 1`,
		`iop_edge_node_connections{state="fenced"} 0`,
		`iop_edge_heartbeat_rtt_seconds{node="n1"} 0.002`,
		`iop_edge_queue_depth{model="llama3.2"} 3`,
		`iop_edge_requests_total{outcome="ok",route="openai_chat"} 1`,
		`iop_edge_stalls_total{classification="request_stalled"} 1`,
		`go_goroutines`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("scrape lacks %s", want)
		}
	}
}
