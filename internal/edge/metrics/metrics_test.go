package metrics_test

import (
	"context"
	"errors"
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/iop-dev/iop/internal/edge/metrics"
	"github.com/iop-dev/iop/internal/edge/nodes"
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
func (rttLink) OpenStream(context.Context) (*quic.Stream, error) {
	return nil, errors.New("rttLink opens no streams")
}

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
	reg := nodes.New(nodes.Options{})
	c := reg.Register(nodes.ConnInfo{NodeID: "n1", Link: rttLink{2 * time.Millisecond, time.Now()}})
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
