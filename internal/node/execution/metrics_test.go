package execution

import (
	"context"
	"errors"
	"io"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/iop-dev/iop/internal/node/edgeclient"
	"github.com/iop-dev/iop/internal/node/nodemetrics"
	"github.com/iop-dev/iop/internal/transport"
	"github.com/iop-dev/iop/quicwire/lease"
	"github.com/iop-dev/iop/quicwire/wirepb"
	"github.com/iop-dev/iop/sdk"
)

// The Node counts what it decides where it decides it: every provider
// call's terminal by kind, provider and outcome (and a failure's kind),
// stall observations by classification, lease refusals by reason, plugin
// restarts; a scrape reads the circuit breaker's state.

// meteredSet is onlineSet with metrics: one online provider "p" (target
// "m") whose plugin is pl, its calls counted in m.
func meteredSet(t testing.TB, capacity int, pl Plugin) (*Provider, *Handler, *nodemetrics.Metrics) {
	t.Helper()
	m := nodemetrics.New(nodemetrics.Options{})
	_, prov, h := startSet(t, ProviderConfig{Name: "p", Adapter: "fake", Targets: []string{"m"}, Capacity: capacity, Metrics: m},
		pl, HandlerOptions{Metrics: m})
	return prov, h, m
}

// scrape is m's /metrics text.
func scrape(t testing.TB, m *nodemetrics.Metrics) string {
	t.Helper()
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	b, _ := io.ReadAll(rec.Body)
	return string(b)
}

// requireSeries fails unless the scrape has every one of series (whole
// lines: name, labels and value).
func requireSeries(t testing.TB, out string, series ...string) {
	t.Helper()
	lines := map[string]bool{}
	for _, l := range strings.Split(out, "\n") {
		lines[l] = true
	}
	for _, s := range series {
		if !lines[s] {
			t.Errorf("scrape lacks %s; it has:\n%s", s, grep(out, strings.SplitN(s, "{", 2)[0]))
		}
	}
}

// grep is out's lines that start with prefix.
func grep(out, prefix string) string {
	var b strings.Builder
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, prefix) {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

func TestCallsAreCountedByKindProviderAndOutcome(t *testing.T) {
	pl := newTunnelPlugin(echo)
	pl.fakePlugin.exec = func(_ context.Context, req *wirepb.RunRequest, emit func(*wirepb.RunEvent) error) (*sdk.Result, error) {
		if req.GetRunId() == "limited" {
			return nil, &sdk.Error{Kind: sdk.KindRateLimited, Message: "slow down"}
		}
		return &sdk.Result{DoneReason: "stop"}, emit(text("hi"))
	}
	pl.fakePlugin.embed = func(context.Context, *wirepb.EmbedRequest, func(*wirepb.EmbedVectors) error) (*sdk.Usage, error) {
		return &sdk.Usage{PromptTokens: 1}, nil
	}
	pl.caps = []string{sdk.CapTunnel, sdk.CapEmbed}
	prov, h, m := meteredSet(t, 1, pl)

	serve(h, t.Context(), run("ok"), newFakeStream())
	serve(h, t.Context(), run("limited"), newFakeStream())
	_, release, err := prov.Acquire() // every slot busy
	if err != nil {
		t.Fatal(err)
	}
	serve(h, t.Context(), run("busy"), newFakeStream())
	release()
	elsewhere := run("elsewhere")
	elsewhere.Provider = "not-on-this-node"
	serve(h, t.Context(), elsewhere, newFakeStream())
	serveTunnelOn(h, t.Context(), tunnelReq("t1"), newFakeTunnelStream(true, "body"))
	meta := tunnelReq("t2")
	meta.Metadata = true
	serveTunnelOn(h, t.Context(), meta, newFakeTunnelStream(true))
	st := newFakeStream()
	h.serveEmbed(t.Context(), nil, &wirepb.EmbedRequest{EmbedId: "e1", Target: "m", Inputs: []string{"a"}}, st)
	st.cancel()

	requireSeries(t, scrape(t, m),
		`iop_node_calls_total{kind="run",outcome="completed",provider="p"} 1`,
		`iop_node_calls_total{kind="run",outcome="failed",provider="p"} 2`,
		`iop_node_call_failures_total{failure="rate_limited",kind="run",provider="p"} 1`,
		`iop_node_call_failures_total{failure="capacity_exhausted",kind="run",provider="p"} 1`,
		`iop_node_calls_total{kind="run",outcome="failed",provider=""} 1`,
		`iop_node_call_failures_total{failure="model_not_found",kind="run",provider=""} 1`,
		`iop_node_calls_total{kind="tunnel",outcome="completed",provider="p"} 1`,
		`iop_node_calls_total{kind="metadata",outcome="completed",provider="p"} 1`,
		`iop_node_calls_total{kind="embed",outcome="completed",provider="p"} 1`,
		`iop_node_calls_total{kind="run",outcome="response_stalled",provider="p"} 0`, // resolved, so graphs start at 0
	)
}

// R5, R6: each finalized stall observation is counted by its provider and
// liveness classification.
func TestStallObservationsAreCountedByClassification(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var fenced atomic.Int32
		pl := newFakePlugin(stallingRun(1, &fenced))
		pl.probe = health(sdk.HealthUnavailable)
		_, h, m := meteredSet(t, 1, pl)
		st := newFakeStream()
		h.serveRun(t.Context(), transport.NewSession("node-a", 1, time.Now()), stallReq("s1"), st)
		st.cancel()
		requireSeries(t, scrape(t, m),
			`iop_node_stalls_total{classification="provider_unhealthy",provider="p"} 1`,
			`iop_node_stalls_total{classification="request_stalled",provider="p"} 0`,
			`iop_node_calls_total{kind="run",outcome="response_stalled",provider="p"} 1`,
		)
	})
}

// R11, S4: a refused lease is counted by its reason, beside the call's
// lease_rejected failure.
func TestLeaseRefusalsAreCountedByReason(t *testing.T) {
	k := newLeaseKit(t)
	_, h, m := meteredSet(t, 1, okPlugin())
	h.leases = k.opener
	c := k.claims("l1")
	c.Generation = 6 // the connection's is 7
	if term := serveWith(h, k.sess, leaseRun("r1", k.seal(t, c))); term.GetFailure().GetReason() != string(lease.Stale) {
		t.Fatalf("terminal %v, want a stale lease refused", term)
	}
	requireSeries(t, scrape(t, m),
		`iop_node_lease_refusals_total{reason="stale"} 1`,
		`iop_node_call_failures_total{failure="lease_rejected",kind="run",provider="p"} 1`,
	)
}

// Plugin restarts are counted; the circuit breaker's state is read at
// scrape time: open through the cooldown, half-open for the one attempt
// after it, closed once the plugin is up.
func TestRestartsAndTheCircuitAreShown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := nodemetrics.New(nodemetrics.Options{})
		var fail atomic.Bool
		fail.Store(true)
		trial := make(chan struct{})
		set := NewSet()
		sup := DefaultSupervision
		sup.Backoff = edgeclient.Backoff{Initial: time.Second, Max: time.Second}
		var launches atomic.Int32
		prov := NewProvider(ProviderConfig{Name: "p", Targets: []string{"m"}, Capacity: 2, Metrics: m, Launch: func(ctx context.Context) (Plugin, error) {
			if launches.Add(1) > int32(sup.BreakerThreshold) {
				<-trial // the half-open attempt waits here until the test has looked
			}
			if fail.Load() {
				return nil, errors.New("boom")
			}
			return newFakePlugin(idle), nil
		}}, sup, discard(), set.Notify)
		set.Add(prov)
		set.Start()
		defer set.Stop()

		time.Sleep(time.Minute) // the threshold's failures, with backoff
		synctest.Wait()
		if got := prov.Circuit(); got != nodemetrics.CircuitOpen {
			t.Fatalf("circuit %q after %d failures, want open", got, launches.Load())
		}
		time.Sleep(sup.BreakerCooldown)
		synctest.Wait()
		if got := prov.Circuit(); got != nodemetrics.CircuitHalfOpen {
			t.Fatalf("circuit %q during the attempt after the cooldown, want half_open", got)
		}
		fail.Store(false)
		close(trial)
		synctest.Wait()
		if got := prov.Circuit(); got != nodemetrics.CircuitClosed {
			t.Fatalf("circuit %q with the plugin up, want closed", got)
		}
		m2 := nodemetrics.New(nodemetrics.Options{Providers: func() []nodemetrics.ProviderState {
			return []nodemetrics.ProviderState{{Name: "p", Online: prov.Online(), InUse: prov.InUse(), Capacity: prov.Capacity(), Circuit: prov.Circuit()}}
		}})
		requireSeries(t, scrape(t, m),
			`iop_node_plugin_restarts_total{provider="p"} 5`, // every start after the first
		)
		requireSeries(t, scrape(t, m2),
			`iop_node_plugin_circuit{provider="p",state="closed"} 1`,
			`iop_node_plugin_circuit{provider="p",state="open"} 0`,
			`iop_node_provider_online{provider="p"} 1`,
			`iop_node_provider_capacity{provider="p"} 2`,
		)
	})
}
