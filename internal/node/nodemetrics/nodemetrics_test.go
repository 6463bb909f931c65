package nodemetrics_test

import (
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/iop-dev/iop/internal/node/edgeclient"
	"github.com/iop-dev/iop/internal/node/nodemetrics"
)

func scrape(t *testing.T, m *nodemetrics.Metrics) string {
	t.Helper()
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	b, _ := io.ReadAll(rec.Body)
	return string(b)
}

// A scrape reads the providers and the connection to the Edge from their
// sources; counters show what was counted, on the provider's resolved
// children and beside them.
func TestScrapeShowsProvidersTheEdgeAndCounters(t *testing.T) {
	m := nodemetrics.New(nodemetrics.Options{
		Providers: func() []nodemetrics.ProviderState {
			return []nodemetrics.ProviderState{
				{Name: "ollama", Online: true, InUse: 3, Capacity: 4, Circuit: nodemetrics.CircuitClosed},
				{Name: "vllm", Online: false, Capacity: 8, Circuit: nodemetrics.CircuitOpen},
			}
		},
		Edge: func() edgeclient.Status {
			return edgeclient.Status{State: edgeclient.StateReady, Connects: 2, LastRTT: 3 * time.Millisecond}
		},
	})
	p := m.Provider("ollama")
	p.Ended(nodemetrics.Run, "completed", "")
	p.Ended(nodemetrics.Tunnel, "failed", "provider_unavailable")
	p.Ended(nodemetrics.Run, "some_future_outcome", "") // not resolved ahead: still counted
	p.Stalled("request_stalled")
	p.Restarted()
	m.LeaseRefused("expired")

	out := scrape(t, m)
	for _, want := range []string{
		`iop_node_provider_online{provider="ollama"} 1`,
		`iop_node_provider_online{provider="vllm"} 0`,
		`iop_node_provider_slots_in_use{provider="ollama"} 3`,
		`iop_node_provider_capacity{provider="vllm"} 8`,
		`iop_node_plugin_circuit{provider="vllm",state="open"} 1`,
		`iop_node_plugin_circuit{provider="vllm",state="closed"} 0`,
		`iop_node_plugin_circuit{provider="ollama",state="closed"} 1`,
		`iop_node_edge_state{state="ready"} 1`,
		`iop_node_edge_state{state="connecting"} 0`,
		`iop_node_edge_connections_total 2`,
		`iop_node_heartbeat_rtt_seconds 0.003`,
		`iop_node_calls_total{kind="run",outcome="completed",provider="ollama"} 1`,
		`iop_node_calls_total{kind="tunnel",outcome="failed",provider="ollama"} 1`,
		`iop_node_calls_total{kind="run",outcome="some_future_outcome",provider="ollama"} 1`,
		`iop_node_call_failures_total{failure="provider_unavailable",kind="tunnel",provider="ollama"} 1`,
		`iop_node_stalls_total{classification="request_stalled",provider="ollama"} 1`,
		`iop_node_plugin_restarts_total{provider="ollama"} 1`,
		`iop_node_lease_refusals_total{reason="expired"} 1`,
		`iop_node_lease_refusals_total{reason="wrong_recipient"} 0`, // a closed set: there from the start
		`process_cpu_seconds_total`,
	} {
		if !strings.Contains(out, want+"\n") && !strings.Contains(out, want+" ") {
			t.Errorf("scrape lacks %s", want)
		}
	}
}

// A nil *Metrics, and the nil *Provider it gives, record nothing and do
// not panic: a Node built without metrics (tests, tools) pays nothing.
func TestNilMetricsRecordNothing(t *testing.T) {
	var m *nodemetrics.Metrics
	p := m.Provider("x")
	p.Ended(nodemetrics.Run, "completed", "")
	p.Stalled("request_stalled")
	p.Restarted()
	m.LeaseRefused("expired")
	if p != nil {
		t.Errorf("a nil Metrics gave a provider %v", p)
	}
}

// Every metric labelled by provider or reason says in its help that the
// values are bounded.
func TestLabelledMetricsSayTheirLabelsAreBounded(t *testing.T) {
	m := nodemetrics.New(nodemetrics.Options{Providers: func() []nodemetrics.ProviderState {
		return []nodemetrics.ProviderState{{Name: "p", Circuit: nodemetrics.CircuitClosed}}
	}})
	p := m.Provider("p")
	p.Ended(nodemetrics.Run, "failed", "rate_limited")
	m.LeaseRefused("stale")
	fams, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	for _, f := range fams {
		labelled := false
		for _, l := range f.GetMetric()[0].GetLabel() {
			labelled = labelled || l.GetName() == "provider" || l.GetName() == "reason"
		}
		if !labelled {
			continue
		}
		seen++
		if !strings.Contains(f.GetHelp(), "bounded") {
			t.Errorf("%s: help does not say the labels are bounded: %q", f.GetName(), f.GetHelp())
		}
	}
	if seen != 10 {
		t.Errorf("%d metrics labelled by provider or reason, want 10", seen)
	}
}

// Issue 22: a Node of a cluster has a connection per Edge. Its state is
// its best connection's, each state counts its connections, and the
// registrations add up.
func TestScrapeShowsEveryEdgeConnection(t *testing.T) {
	m := nodemetrics.New(nodemetrics.Options{Edges: func() []edgeclient.EdgeStatus {
		return []edgeclient.EdgeStatus{
			{Addr: "e1:7443", Status: edgeclient.Status{State: edgeclient.StateConnecting, Connects: 1}},
			{Addr: "e2:7443", Status: edgeclient.Status{State: edgeclient.StateReady, Connects: 2, LastRTT: 5 * time.Millisecond}},
			{Addr: "e3:7443", Status: edgeclient.Status{State: edgeclient.StateReady, Connects: 1, LastRTT: 2 * time.Millisecond}},
		}
	}})
	out := scrape(t, m)
	for _, want := range []string{
		`iop_node_edge_state{state="ready"} 1`,
		`iop_node_edge_state{state="connecting"} 0`,
		`iop_node_edge_connections{state="ready"} 2`,
		`iop_node_edge_connections{state="connecting"} 1`,
		`iop_node_edge_connections_total 4`,
		`iop_node_heartbeat_rtt_seconds 0.002`,
	} {
		if !strings.Contains(out, want+"\n") {
			t.Errorf("scrape lacks %s", want)
		}
	}
}
