package wake

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics count the wakes (issue 23). A nil *Metrics records nothing.
type Metrics struct {
	// Wakes counts magic packets sent, sends that failed, and attempts
	// that succeeded or timed out: iop_edge_wakes_total{result}.
	Wakes *prometheus.CounterVec
	// Seconds is how long woken Nodes took, from the first request that
	// needed one to its Node being ready: iop_edge_wake_seconds.
	Seconds prometheus.Histogram
}

// Results of iop_edge_wakes_total.
const (
	ResultSent       = "sent"
	ResultSendFailed = "send_failed"
	ResultSucceeded  = "succeeded"
	ResultTimedOut   = "timed_out"
)

// NewMetrics makes the wake metrics and registers them on reg (the
// Edge's, edgemetrics.Metrics.Registry).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Wakes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "iop_edge_wakes_total",
			Help: "Wake on demand: magic packets sent through a waker Node (sent), wake commands that failed (send_failed), and wake attempts whose Node registered (succeeded) or did not within scheduling.wake_timeout (timed_out).",
		}, []string{"result"}),
		Seconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "iop_edge_wake_seconds",
			Help:    "How long a woken Node took, from the first request that needed it to its Node being ready.",
			Buckets: []float64{1, 2, 5, 10, 20, 30, 60, 120, 300},
		}),
	}
	for _, r := range []string{ResultSent, ResultSendFailed, ResultSucceeded, ResultTimedOut} {
		m.Wakes.WithLabelValues(r)
	}
	reg.MustRegister(m.Wakes, m.Seconds)
	return m
}

func (m *Metrics) sent() {
	if m != nil {
		m.Wakes.WithLabelValues(ResultSent).Inc()
	}
}

func (m *Metrics) sendFailed() {
	if m != nil {
		m.Wakes.WithLabelValues(ResultSendFailed).Inc()
	}
}

func (m *Metrics) succeeded(took time.Duration) {
	if m != nil {
		m.Wakes.WithLabelValues(ResultSucceeded).Inc()
		m.Seconds.Observe(took.Seconds())
	}
}

func (m *Metrics) timedOut() {
	if m != nil {
		m.Wakes.WithLabelValues(ResultTimedOut).Inc()
	}
}
