// Package nodemetrics holds the Node's Prometheus metrics, registered on a
// registry of their own (so tests can read them) and served at /metrics on
// the Node's health listener (noded run --health-addr).
//
// What the Node decides is counted where it decides it (internal/node/execution):
// the terminal of every provider call, stall observations, plugin restarts
// and credential lease refusals. What the Node is (its providers' state,
// slots and circuit breakers, its connection to the Edge) is read from its
// sources at scrape time, so no bookkeeping can drift from them.
//
// The hot path stays cheap: a provider's counters are resolved once, when
// its instruments are made (Metrics.Provider), so a call's terminal is one
// map lookup and one atomic add, and nothing is counted per token.
package nodemetrics

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/iop-dev/iop/internal/node/edgeclient"
	"github.com/iop-dev/iop/quicwire/lease"
)

// Kinds of provider call: the kind label.
const (
	Run      = "run"      // a normalized run (R2)
	Tunnel   = "tunnel"   // a raw provider tunnel (R3)
	Metadata = "metadata" // a read-only tunnel without a capacity slot (a model list)
	Embed    = "embed"    // an embedding call
)

// Kinds are the kinds of provider call, in the order above.
var Kinds = []string{Run, Tunnel, Metadata, Embed}

// Outcomes are the terminals a provider call ends with, as the wire names
// them (execution.Cause's names): the outcome label.
var Outcomes = []string{"completed", "failed", "cancelled", "deadline_exceeded", "disconnected", "response_stalled"}

// Classifications are a stall's liveness classifications (R6).
var Classifications = []string{"request_stalled", "provider_unhealthy", "health_unknown"}

// Circuit breaker states of a provider's plugin supervisor.
const (
	// CircuitClosed: the plugin runs, or is restarted with backoff after
	// fewer failures in a row than the breaker's threshold.
	CircuitClosed = "closed"
	// CircuitOpen: the plugin failed the threshold's number of times in a
	// row; no start is tried until the cooldown ends.
	CircuitOpen = "open"
	// CircuitHalfOpen: the cooldown ended; one start attempt decides.
	CircuitHalfOpen = "half_open"
)

// circuitStates are the states of the circuit state set, in order.
var circuitStates = []string{CircuitClosed, CircuitOpen, CircuitHalfOpen}

// edgeStates are the states of the connection to the Edge.
var edgeStates = []edgeclient.State{edgeclient.StateConnecting, edgeclient.StateRegistering,
	edgeclient.StateReady, edgeclient.StateDraining, edgeclient.StateStopped}

// ProviderState is what a scrape reads of one provider.
type ProviderState struct {
	Name     string
	Online   bool
	InUse    int    // capacity slots taken
	Capacity int    // capacity slots in all
	Circuit  string // CircuitClosed, CircuitOpen or CircuitHalfOpen
}

// Options say where scrapes read the Node's state from; a nil function
// leaves its metrics out.
type Options struct {
	// Providers returns the state of every provider, in configuration
	// order.
	Providers func() []ProviderState
	// Edge returns the state of the connection to the Edge, for a Node
	// with one; Edges, if set, is used instead.
	Edge func() edgeclient.Status
	// Edges returns the state of every Edge connection (a cluster, issue
	// 22).
	Edges func() []edgeclient.EdgeStatus
}

// boundedLabels is said in the help of every metric labelled by provider,
// reason or failure: the values come from the configuration and from
// closed sets, so the series stay few.
const boundedLabels = "Label values are bounded: a provider is a configured provider's name (empty for a call naming no provider of this Node), the other labels closed sets."

// Metrics are the Node's instruments. A nil *Metrics records nothing.
type Metrics struct {
	reg *prometheus.Registry

	calls         *prometheus.CounterVec
	failures      *prometheus.CounterVec
	stalls        *prometheus.CounterVec
	restarts      *prometheus.CounterVec
	leaseRefusals *prometheus.CounterVec
	busy          *prometheus.CounterVec
}

// New creates the metrics and registers them, with a collector that reads
// opts at scrape time and the Go runtime's and the process's collectors.
func New(opts Options) *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "iop_node_calls_total",
			Help: "Provider calls ended, by kind (run, tunnel, metadata, embed), provider and terminal outcome (completed, failed, cancelled, deadline_exceeded, disconnected, response_stalled); refusals before the provider was called included. " + boundedLabels,
		}, []string{"kind", "provider", "outcome"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "iop_node_call_failures_total",
			Help: "Provider calls that ended failed, by kind, provider and failure kind (capacity_exhausted, provider_unavailable, lease_rejected, rate_limited, ...). " + boundedLabels,
		}, []string{"kind", "provider", "failure"}),
		stalls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "iop_node_stalls_total",
			Help: "Stall observations the Node made (R5, R6), by provider and liveness classification (request_stalled, provider_unhealthy, health_unknown). " + boundedLabels,
		}, []string{"provider", "classification"}),
		restarts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "iop_node_plugin_restarts_total",
			Help: "Starts of a provider's adapter plugin after it exited or failed to start, by provider. " + boundedLabels,
		}, []string{"provider"}),
		leaseRefusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "iop_node_lease_refusals_total",
			Help: "Credential leases the Node refused (no provider call followed), by reason (revoked, disabled, expired, stale, replayed, wrong_recipient, mismatched, malformed). " + boundedLabels,
		}, []string{"reason"}),
		busy: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "iop_node_busy_refusals_total",
			Help: "Runs, tunnels and embedding calls the Node refused before their first byte (stream code busy) because every slot of their provider was taken; the slots are shared by every Edge the Node is connected to. By provider. " + boundedLabels,
		}, []string{"provider"}),
	}
	m.reg.MustRegister(m.calls, m.failures, m.stalls, m.restarts, m.leaseRefusals, m.busy, &stateCollector{opts: opts},
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	// The reasons are a closed set: they start at zero, so that the series
	// are there before the first refusal (as a provider's are, Provider).
	for _, r := range []lease.Reason{lease.Revoked, lease.Disabled, lease.Expired, lease.Stale, lease.Replayed,
		lease.WrongRecipient, lease.Mismatched, lease.Malformed} {
		m.leaseRefusals.WithLabelValues(string(r))
	}
	return m
}

// Handler serves the metrics in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

// Registry is the registry the metrics live on.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// LeaseRefused counts a credential lease refused for reason.
func (m *Metrics) LeaseRefused(reason string) {
	if m != nil {
		m.leaseRefusals.WithLabelValues(reason).Inc()
	}
}

// Provider returns the instruments of the provider named name ("" for
// calls that name no provider of this Node), with its counters resolved:
// call it once per provider, not per call. A nil *Metrics gives a nil
// *Provider, which records nothing.
func (m *Metrics) Provider(name string) *Provider {
	if m == nil {
		return nil
	}
	p := &Provider{m: m, name: name, calls: make(map[[2]string]prometheus.Counter, len(Kinds)*len(Outcomes)),
		stalls: make(map[string]prometheus.Counter, len(Classifications)), restarts: m.restarts.WithLabelValues(name), busy: m.busy.WithLabelValues(name)}
	for _, k := range Kinds {
		for _, o := range Outcomes {
			p.calls[[2]string{k, o}] = m.calls.WithLabelValues(k, name, o)
		}
	}
	for _, c := range Classifications {
		p.stalls[c] = m.stalls.WithLabelValues(name, c)
	}
	return p
}

// Provider is one provider's instruments. Its methods are safe for
// concurrent use; on a nil *Provider they do nothing.
type Provider struct {
	m        *Metrics
	name     string
	calls    map[[2]string]prometheus.Counter // by kind, outcome; read only
	stalls   map[string]prometheus.Counter    // by classification; read only
	restarts prometheus.Counter
	busy     prometheus.Counter
}

// Ended counts a call of kind that ended with outcome; failure is the
// failure kind of a failed call ("rate_limited", ...), "" otherwise.
func (p *Provider) Ended(kind, outcome, failure string) {
	if p == nil {
		return
	}
	if c, ok := p.calls[[2]string{kind, outcome}]; ok {
		c.Inc()
	} else {
		p.m.calls.WithLabelValues(kind, p.name, outcome).Inc()
	}
	if failure != "" {
		p.m.failures.WithLabelValues(kind, p.name, failure).Inc() // rare: resolved when it happens
	}
}

// Stalled counts a stall observation with its liveness classification.
func (p *Provider) Stalled(classification string) {
	if p == nil {
		return
	}
	if c, ok := p.stalls[classification]; ok {
		c.Inc()
		return
	}
	p.m.stalls.WithLabelValues(p.name, classification).Inc()
}

// Busy counts a call refused with the busy stream code: every slot of the
// provider was taken.
func (p *Provider) Busy() {
	if p != nil {
		p.busy.Inc()
	}
}

// Restarted counts a start of the provider's plugin after it exited or
// failed to start.
func (p *Provider) Restarted() {
	if p != nil {
		p.restarts.Inc()
	}
}

// stateCollector reads the providers' and the connection's state at
// scrape time.
type stateCollector struct{ opts Options }

var (
	onlineDesc   = prometheus.NewDesc("iop_node_provider_online", "1 when the provider is online (its plugin runs and its model server listed its targets), by provider. "+boundedLabels, []string{"provider"}, nil)
	inUseDesc    = prometheus.NewDesc("iop_node_provider_slots_in_use", "Capacity slots of the provider taken by calls in flight, by provider. "+boundedLabels, []string{"provider"}, nil)
	capacityDesc = prometheus.NewDesc("iop_node_provider_capacity", "Capacity slots of the provider, by provider. "+boundedLabels, []string{"provider"}, nil)
	circuitDesc  = prometheus.NewDesc("iop_node_plugin_circuit", "State of the provider's plugin circuit breaker: 1 for the current state (closed, open, half_open), 0 for the others, by provider. "+boundedLabels, []string{"provider", "state"}, nil)
	edgeDesc     = prometheus.NewDesc("iop_node_edge_state", "State of the Node's connection to its Edges: 1 for the best state any Edge connection is in (ready, registering, draining, connecting, stopped, in that order), 0 for the others.", []string{"state"}, nil)
	edgesDesc    = prometheus.NewDesc("iop_node_edge_connections", "Edge connections of the Node (one per Edge of its cluster), by state.", []string{"state"}, nil)
	connectsDesc = prometheus.NewDesc("iop_node_edge_connections_total", "Connections to an Edge that registered, every Edge together.", nil, nil)
	rttDesc      = prometheus.NewDesc("iop_node_heartbeat_rtt_seconds", "Round trip of the last answered heartbeat to the Edge; with several Edges, the shortest of the ready connections'.", nil, nil)
)

// stateRank orders connection states from the best: the Node's state is
// its best connection's.
var stateRank = map[edgeclient.State]int{edgeclient.StateReady: 0, edgeclient.StateRegistering: 1,
	edgeclient.StateDraining: 2, edgeclient.StateConnecting: 3, edgeclient.StateStopped: 4}

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{onlineDesc, inUseDesc, capacityDesc, circuitDesc, edgeDesc, edgesDesc, connectsDesc, rttDesc} {
		ch <- d
	}
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	one := func(b bool) float64 {
		if b {
			return 1
		}
		return 0
	}
	if c.opts.Providers != nil {
		for _, p := range c.opts.Providers() {
			gauge(onlineDesc, one(p.Online), p.Name)
			gauge(inUseDesc, float64(p.InUse), p.Name)
			gauge(capacityDesc, float64(p.Capacity), p.Name)
			for _, s := range circuitStates {
				gauge(circuitDesc, one(p.Circuit == s), p.Name, s)
			}
		}
	}
	var edges []edgeclient.EdgeStatus
	switch {
	case c.opts.Edges != nil:
		edges = c.opts.Edges()
	case c.opts.Edge != nil:
		edges = []edgeclient.EdgeStatus{{Status: c.opts.Edge()}}
	default:
		return
	}
	best, connects, rtt := edgeclient.StateStopped, 0, time.Duration(0)
	count := make(map[edgeclient.State]int, len(edgeStates))
	for _, e := range edges {
		count[e.State]++
		connects += e.Connects
		if stateRank[e.State] < stateRank[best] {
			best = e.State
		}
		if e.LastRTT > 0 && (rtt == 0 || e.LastRTT < rtt) && e.State == edgeclient.StateReady {
			rtt = e.LastRTT
		}
	}
	for _, s := range edgeStates {
		gauge(edgeDesc, one(best == s), string(s))
		gauge(edgesDesc, float64(count[s]), string(s))
	}
	ch <- prometheus.MustNewConstMetric(connectsDesc, prometheus.CounterValue, float64(connects))
	if rtt > 0 {
		gauge(rttDesc, rtt.Seconds())
	}
}
