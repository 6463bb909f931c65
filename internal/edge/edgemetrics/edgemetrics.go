// Package edgemetrics holds the Edge's Prometheus metrics, registered on a
// registry of their own (so tests can read them) and served at /metrics.
package edgemetrics

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/iop-dev/iop/internal/edge/cluster"
	"github.com/iop-dev/iop/internal/edge/fleet"
)

// Metrics are the Edge's instruments.
type Metrics struct {
	reg *prometheus.Registry

	// Requests counts client requests by API route ("openai_chat",
	// "ollama_chat", ...), model, principal and outcome ("ok",
	// "queue_full", "no_candidate", "response_stalled", "cancelled", ...),
	// labels in that order. The model is empty unless the scheduler took
	// the request for it (see Exchange.Record in the gateway).
	Requests *prometheus.CounterVec
	// TimeToFirstToken is the time from a request's arrival to the first
	// byte of output sent to the client, by API route and model.
	TimeToFirstToken *prometheus.HistogramVec
	// PromptTokens and CompletionTokens count the tokens providers
	// reported for the work they did, by model, principal and Node
	// (CountUsage).
	PromptTokens     *prometheus.CounterVec
	CompletionTokens *prometheus.CounterVec
	// TokensPerSecond is the pace of completed answers as the Edge
	// received them, by model (ObserveRate).
	TokensPerSecond *prometheus.HistogramVec
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
	// SessionTurns counts the turns of requests that name their session,
	// by outcome (SessionOutcomes): whether the turn ran where the
	// session's last one did (session affinity), and if not why.
	SessionTurns *prometheus.CounterVec
	// RouteChoices counts the candidates the scheduler picked, by why
	// (RouteChoiceReasons, issue 23): the model loaded there (warm), room
	// to load it, an idle model evicted for it, a spill past a busy warm
	// Node, cold, or not known.
	RouteChoices *prometheus.CounterVec
	// Refusals counts what the Edge turned away at its doors, by kind
	// (RefusalKinds): the log shows a sample of them.
	Refusals *prometheus.CounterVec
	// ConfigReloads counts configuration reloads (SIGHUP or POST
	// /admin/v1/reload) by result: applied, or refused (the file was
	// invalid or a credential unreadable, and the running configuration
	// stayed).
	ConfigReloads *prometheus.CounterVec
}

// Options are the optional parts of the metrics.
type Options struct {
	// EdgeID, when set, labels every series the Edge exports with
	// edge="<id>" (issue 22): several Edges scraped into one Prometheus
	// stay apart, and a sum over the label is the cluster's. Empty: no
	// edge label, as an Edge alone has always exported.
	EdgeID string
	// Cluster, when set, adds the cluster's figures read at scrape time:
	// iop_edge_cluster_members, _members_alive, _database_reachable (with a
	// cluster configured), _ledger_buffered and _ledger_dropped_total.
	Cluster ClusterStats
}

// ClusterStats are the cluster's figures (*cluster.Cluster, or
// *cluster.Single for an Edge alone).
type ClusterStats interface {
	Stats() cluster.Stats
}

// New creates the metrics and registers them, with collectors that read
// the node registry (connections by state, heartbeat round trips) and the
// queue depths from depth at scrape time.
func New(reg *fleet.Registry, depth func() map[string]int) *Metrics {
	return NewWith(reg, depth, Options{})
}

// NewWith is New with opts: the edge label and the cluster's figures.
func NewWith(reg *fleet.Registry, depth func() map[string]int, opts Options) *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		Requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "iop_edge_requests_total",
			Help: "Client requests by API route, model, principal and outcome (ok, or why not). " + boundedLabels,
		}, []string{"route", "model", "principal", "outcome"}),
		TimeToFirstToken: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "iop_edge_time_to_first_token_seconds",
			Help:    "Time from request arrival to the first output byte sent to the client, by API route and model. " + boundedLabels,
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 18),
		}, []string{"route", "model"}),
		PromptTokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "iop_edge_prompt_tokens_total",
			Help: "Prompt tokens of runs, raw Ollama streams and embedding calls, as their providers reported them, by model, principal and node. " + boundedLabels,
		}, []string{"model", "principal", "node"}),
		CompletionTokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "iop_edge_completion_tokens_total",
			Help: "Completion tokens of runs and raw Ollama streams, as their providers reported them, by model, principal and node. " + boundedLabels,
		}, []string{"model", "principal", "node"}),
		TokensPerSecond: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "iop_edge_tokens_per_second",
			Help: "Pace of completed answers as the Edge received them: completion tokens after the first, over the time from the first output to the end, by model. " +
				boundedLabels,
			Buckets: prometheus.ExponentialBuckets(1, 2, 14),
		}, []string{"model"}),
		QueueWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "iop_edge_queue_wait_seconds", Help: "Time admitted requests waited for a slot, by model. " + boundedLabels,
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
		SessionTurns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "iop_edge_session_turns_total",
			Help: "Turns of requests that name their session, by outcome: new, stuck (where the last turn ran), moved_busy, moved_gone, moved_failover.",
		}, []string{"outcome"}),
		RouteChoices: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "iop_edge_route_choices_total",
			Help: "Candidates the scheduler picked, by reason: warm (the model loaded there), room (loaded there without evicting), evict (loaded in place of an idle model), spill (loaded elsewhere, but that is full or too busy), cold (every model there in use), unknown (the Node does not say).",
		}, []string{"reason"}),
		Refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "iop_edge_refusals_total", Help: "Connections, request bodies, handshakes and registrations refused at the Edge's doors, by kind.",
		}, []string{"kind"}),
		ConfigReloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "iop_edge_config_reloads_total", Help: "Configuration reloads (SIGHUP or POST /admin/v1/reload) by result: applied or refused.",
		}, []string{"result"}),
	}
	var r prometheus.Registerer = m.reg
	if opts.EdgeID != "" {
		r = prometheus.WrapRegistererWith(prometheus.Labels{"edge": opts.EdgeID}, m.reg)
	}
	if opts.Cluster != nil {
		r.MustRegister(&clusterCollector{stats: opts.Cluster})
	}
	r.MustRegister(m.ConfigReloads, m.Requests, m.TimeToFirstToken, m.PromptTokens, m.CompletionTokens, m.TokensPerSecond, m.QueueWait, m.Active, m.Cancellations, m.Failovers, m.Stalls, m.SessionTurns, m.RouteChoices, m.Refusals,
		&nodeCollector{reg: reg, depth: depth},
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	// The label values of closed sets start at zero, so that every series
	// is there from the first scrape: a rate or an alert over it works
	// before the first event, and a dashboard never queries a name the
	// Edge does not export yet.
	for vec, values := range map[*prometheus.CounterVec][]string{
		m.Failovers:     {"before_first_byte", "node_suspect", "response_stalled"},
		m.Stalls:        {"request_stalled", "provider_unhealthy", "health_unknown"},
		m.SessionTurns:  SessionOutcomes,
		m.RouteChoices:  RouteChoiceReasons,
		m.Cancellations: {"client_gone", "idle_timeout", "deadline"},
		m.Refusals:      RefusalKinds,
		m.ConfigReloads: {"applied", "refused"},
	} {
		for _, v := range values {
			vec.WithLabelValues(v)
		}
	}
	for _, kind := range []string{"run", "tunnel", "embed"} {
		m.Active.WithLabelValues(kind)
	}
	return m
}

// boundedLabels is said in the help of every metric labelled by model,
// principal or node: the values come from configuration and registration,
// never from what a client typed, so the series stay few.
const boundedLabels = "Label values are bounded: a model is a configured route's or a registered Node's target that the request was scheduled for (empty otherwise), a principal a configured name (or anonymous), a node a registered Node's id."

// CountUsage counts the tokens a provider reported for one piece of work:
// model as the client named it (it was scheduled, so it is a route's model
// or a Node's target), the principal's name and the Node's id. m may be
// nil.
func (m *Metrics) CountUsage(model, principal, node string, prompt, completion int64) {
	if m == nil {
		return
	}
	if prompt > 0 {
		m.PromptTokens.WithLabelValues(model, principal, node).Add(float64(prompt))
	}
	if completion > 0 {
		m.CompletionTokens.WithLabelValues(model, principal, node).Add(float64(completion))
	}
}

// ObserveRate records the pace of a completed answer of completion tokens
// whose output took d from its first token to its end: the tokens after
// the first, over d. An answer of fewer than two tokens, or with no time
// between its first output and its end, has no pace and is not observed.
// m may be nil.
func (m *Metrics) ObserveRate(model string, completion int64, d time.Duration) {
	if m == nil || completion < 2 || d <= 0 {
		return
	}
	m.TokensPerSecond.WithLabelValues(model).Observe(float64(completion-1) / d.Seconds())
}

// Handler serves the metrics in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

// Registry is the registry the metrics live on. A collector registered on
// it later has no edge label.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// nodeCollector reads connection states, heartbeat RTTs and queue depths at
// scrape time, so no bookkeeping can drift from the registry.
type nodeCollector struct {
	reg   *fleet.Registry
	depth func() map[string]int
}

var (
	connDesc  = prometheus.NewDesc("iop_edge_node_connections", "Node connections by state.", []string{"state"}, nil)
	rttDesc   = prometheus.NewDesc("iop_edge_heartbeat_rtt_seconds", "Round trip of the last answered heartbeat, by node. "+boundedLabels, []string{"node"}, nil)
	depthDesc = prometheus.NewDesc("iop_edge_queue_depth", "Requests waiting for a slot, by model. "+boundedLabels, []string{"model"}, nil)
	contDesc  = prometheus.NewDesc("iop_edge_node_identity_contested_total", "Registrations that superseded a live connection of the same Node from another address while two connections kept superseding each other (a stolen or cloned Node certificate; fleet.ContestWindow), by node. "+boundedLabels, []string{"node"}, nil)
	suspDesc  = prometheus.NewDesc("iop_edge_nodes_suspect", "Nodes not heard from at the transport level for a few seconds: they get no new work until they are.", nil, nil)
)

func (c *nodeCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- connDesc
	ch <- rttDesc
	ch <- depthDesc
	ch <- suspDesc
	ch <- contDesc
}

func (c *nodeCollector) Collect(ch chan<- prometheus.Metric) {
	counts := map[fleet.State]int{fleet.Registering: 0, fleet.Ready: 0, fleet.Draining: 0, fleet.Fenced: 0}
	suspect := 0
	for _, v := range c.reg.Snapshot() {
		counts[v.State]++
		if v.Suspect {
			suspect++
		}
		if v.LastHeartbeatRTTMillis != nil && v.State != fleet.Fenced {
			ch <- prometheus.MustNewConstMetric(rttDesc, prometheus.GaugeValue, *v.LastHeartbeatRTTMillis/float64(time.Second/time.Millisecond), v.ID)
		}
	}
	for state, n := range counts {
		ch <- prometheus.MustNewConstMetric(connDesc, prometheus.GaugeValue, float64(n), string(state))
	}
	ch <- prometheus.MustNewConstMetric(suspDesc, prometheus.GaugeValue, float64(suspect))
	for node, n := range c.reg.Contested() {
		ch <- prometheus.MustNewConstMetric(contDesc, prometheus.CounterValue, float64(n), node)
	}
	if c.depth != nil {
		for model, n := range c.depth() {
			ch <- prometheus.MustNewConstMetric(depthDesc, prometheus.GaugeValue, float64(n), model)
		}
	}
}

// SessionOutcomes are the outcomes of a session's turn
// (dispatch.TurnOutcomes).
var SessionOutcomes = []string{"new", "stuck", "moved_busy", "moved_gone", "moved_failover"}

// RouteChoiceReasons are the reasons of iop_edge_route_choices_total
// (sched.Choices).
var RouteChoiceReasons = []string{"warm", "room", "evict", "spill", "cold", "unknown"}

// RefusalKinds are the kinds of iop_edge_refusals_total, each exported at 0
// from the start so that a rate over them is defined before the first one.
var RefusalKinds = []string{
	// the client listener (internal/edge/frontdoor)
	"http_connections", "http_connections_per_source", "http_idle_closed",
	"body_memory", "body_memory_principal", "body_memory_connection", "slow_body", "tls_handshake",
	// requests let in without a key that only a web page would send
	// (internal/edge/auth/browser.go)
	"browser_host", "browser_cross_site", "browser_content_type",
	// Node connections, joins and the admin socket
	"node_identity", "registration", "join", "admin_socket",
	// Ollama key signatures (OLLAMA_AUTH=1 clients, internal/edge/auth)
	"ollama_signature",
}

// clusterCollector reads the cluster's figures at scrape time.
type clusterCollector struct{ stats ClusterStats }

var (
	membersDesc   = prometheus.NewDesc("iop_edge_cluster_members", "Edges of the cluster this Edge knows of (its view; dead ones until they are forgotten), this one included.", nil, nil)
	aliveDesc     = prometheus.NewDesc("iop_edge_cluster_members_alive", "Edges of the cluster alive now as this Edge sees them (holding their database lock, heartbeat fresh), this one included.", nil, nil)
	reachableDesc = prometheus.NewDesc("iop_edge_cluster_database_reachable", "1 while the cluster's database answers this Edge, 0 while it does not (the Edge then keeps what it last knew). Only with a cluster configured.", nil, nil)
	bufferedDesc  = prometheus.NewDesc("iop_edge_cluster_ledger_buffered", "Usage aggregates (a minute, principal, model and Node each) waiting to be written to the cluster's usage ledger.", nil, nil)
	droppedDesc   = prometheus.NewDesc("iop_edge_cluster_ledger_dropped_total", "Usage aggregates dropped unwritten: the ledger's buffer was full while the database was away.", nil, nil)
)

func (c *clusterCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- membersDesc
	ch <- aliveDesc
	ch <- reachableDesc
	ch <- bufferedDesc
	ch <- droppedDesc
}

func (c *clusterCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.stats.Stats()
	ch <- prometheus.MustNewConstMetric(membersDesc, prometheus.GaugeValue, float64(s.Members))
	ch <- prometheus.MustNewConstMetric(aliveDesc, prometheus.GaugeValue, float64(s.Alive))
	if s.Clustered {
		reachable := 0.0
		if s.DatabaseReachable {
			reachable = 1
		}
		ch <- prometheus.MustNewConstMetric(reachableDesc, prometheus.GaugeValue, reachable)
	}
	ch <- prometheus.MustNewConstMetric(bufferedDesc, prometheus.GaugeValue, float64(s.LedgerBuffered))
	ch <- prometheus.MustNewConstMetric(droppedDesc, prometheus.CounterValue, float64(s.LedgerDropped))
}
