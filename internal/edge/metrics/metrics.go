// Package metrics holds the Edge's Prometheus metrics, registered on a
// registry of their own (so tests can read them) and served at /metrics.
package metrics

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/iop-dev/iop/internal/edge/nodes"
)

// Metrics are the Edge's instruments.
type Metrics struct {
	reg *prometheus.Registry

	// Requests counts client requests by API route ("openai_chat",
	// "ollama_chat", ...) and outcome ("ok", "queue_full", "no_candidate",
	// "stalled", "cancelled", ...).
	Requests *prometheus.CounterVec
	// TimeToFirstToken is the time from a request's arrival to the first
	// byte of output sent to the client, by API route.
	TimeToFirstToken *prometheus.HistogramVec
	// QueueWait is how long admitted requests waited for a slot, by model.
	QueueWait *prometheus.HistogramVec
	// Active is the number of runs, tunnels and embedding calls in flight,
	// by kind ("run", "tunnel", "embed").
	Active *prometheus.GaugeVec
	// Cancellations counts requests ended because the client went away or
	// timed out, by cause.
	Cancellations *prometheus.CounterVec
	// Failovers counts requests moved to another candidate before their
	// first byte, by reason.
	Failovers *prometheus.CounterVec
	// Stalls counts response_stalled outcomes by liveness classification.
	Stalls *prometheus.CounterVec
	// Refusals counts what the Edge turned away at its doors, by kind
	// (http_connections, body_memory, slow_body, tls_handshake,
	// node_identity, registration): the log shows a sample of them.
	Refusals *prometheus.CounterVec
}

// New creates the metrics and registers them, with collectors that read
// the node registry (connections by state, heartbeat round trips) and the
// queue depths from depth at scrape time.
func New(reg *nodes.Registry, depth func() map[string]int) *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		Requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "iop_edge_requests_total", Help: "Client requests by API route and outcome.",
		}, []string{"route", "outcome"}),
		TimeToFirstToken: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "iop_edge_time_to_first_token_seconds", Help: "Time from request arrival to the first output byte sent to the client.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 18),
		}, []string{"route"}),
		QueueWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "iop_edge_queue_wait_seconds", Help: "Time admitted requests waited for a slot.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 18),
		}, []string{"model"}),
		Active: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "iop_edge_active", Help: "Runs, tunnels and embedding calls in flight, by kind.",
		}, []string{"kind"}),
		Cancellations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "iop_edge_cancellations_total", Help: "Requests cancelled, by cause (client_gone, idle_timeout, deadline).",
		}, []string{"cause"}),
		Failovers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "iop_edge_failovers_total", Help: "Requests moved to another candidate before their first byte, by reason.",
		}, []string{"reason"}),
		Stalls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "iop_edge_stalls_total", Help: "response_stalled outcomes by liveness classification.",
		}, []string{"classification"}),
		Refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "iop_edge_refusals_total", Help: "Connections, request bodies, handshakes and registrations refused at the Edge's doors, by kind.",
		}, []string{"kind"}),
	}
	m.reg.MustRegister(m.Requests, m.TimeToFirstToken, m.QueueWait, m.Active, m.Cancellations, m.Failovers, m.Stalls, m.Refusals,
		&nodeCollector{reg: reg, depth: depth},
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Handler serves the metrics in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

// Registry is the registry the metrics live on.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// nodeCollector reads connection states, heartbeat RTTs and queue depths at
// scrape time, so no bookkeeping can drift from the registry.
type nodeCollector struct {
	reg   *nodes.Registry
	depth func() map[string]int
}

var (
	connDesc  = prometheus.NewDesc("iop_edge_node_connections", "Node connections by state.", []string{"state"}, nil)
	rttDesc   = prometheus.NewDesc("iop_edge_heartbeat_rtt_seconds", "Round trip of the last answered heartbeat, by node.", []string{"node"}, nil)
	depthDesc = prometheus.NewDesc("iop_edge_queue_depth", "Requests waiting for a slot, by model.", []string{"model"}, nil)
	suspDesc  = prometheus.NewDesc("iop_edge_nodes_suspect", "Nodes not heard from at the transport level for a few seconds: they get no new work until they are.", nil, nil)
)

func (c *nodeCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- connDesc
	ch <- rttDesc
	ch <- depthDesc
	ch <- suspDesc
}

func (c *nodeCollector) Collect(ch chan<- prometheus.Metric) {
	counts := map[nodes.State]int{nodes.Registering: 0, nodes.Ready: 0, nodes.Draining: 0, nodes.Fenced: 0}
	suspect := 0
	for _, v := range c.reg.Snapshot() {
		counts[v.State]++
		if v.Suspect {
			suspect++
		}
		if v.LastHeartbeatRTTMillis != nil && v.State != nodes.Fenced {
			ch <- prometheus.MustNewConstMetric(rttDesc, prometheus.GaugeValue, *v.LastHeartbeatRTTMillis/float64(time.Second/time.Millisecond), v.ID)
		}
	}
	for state, n := range counts {
		ch <- prometheus.MustNewConstMetric(connDesc, prometheus.GaugeValue, float64(n), string(state))
	}
	ch <- prometheus.MustNewConstMetric(suspDesc, prometheus.GaugeValue, float64(suspect))
	if c.depth != nil {
		for model, n := range c.depth() {
			ch <- prometheus.MustNewConstMetric(depthDesc, prometheus.GaugeValue, float64(n), model)
		}
	}
}
