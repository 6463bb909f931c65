package gateway

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"testing/synctest"
	"time"

	"github.com/iop-dev/iop/internal/edge/auth"
	"github.com/iop-dev/iop/internal/edge/edgeconfig"
	"github.com/iop-dev/iop/internal/edge/nodes"
	"github.com/iop-dev/iop/internal/edge/nodeserver"
	"github.com/iop-dev/iop/internal/edge/sched"
	"github.com/iop-dev/iop/quicwire"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// The one mapping of what went wrong to what every client API answers.
func TestStartFailuresHaveOneStatusAndCodeEach(t *testing.T) {
	for _, tt := range []struct {
		name   string
		err    error
		cause  error
		status int
		code   string
	}{
		{"unknown model", fmt.Errorf("%w: x", ErrUnknownModel), nil, 404, "model_not_found"},
		{"forbidden", fmt.Errorf("%w: x", ErrForbidden), nil, 404, "model_not_found"},
		{"known but nobody can serve it", &sched.RefusalError{Reason: sched.ReasonNoCandidate, Model: "m"}, nil, 503, "no_candidate"},
		{"queue timeout", &sched.RefusalError{Reason: sched.ReasonQueueTimeout, Model: "m"}, nil, 429, "queue_timeout"},
		{"client gone while queued", errors.New("sched: queued"), ErrClientGone, 499, "cancelled"},
		{"idle while starting", errors.New("x"), ErrIdleTimeout, 504, "idle_timeout"},
		{"credential", ErrCredentialUnavailable, nil, 503, "credential_unavailable"},
		{"every candidate stalled", &RunFailedError{Event: &wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_RESPONSE_STALLED}}, nil, 504, "response_stalled"},
		{"dispatch", errors.New("boom"), nil, 502, "dispatch_failed"},
	} {
		f := StartFailure(tt.err, tt.cause, "m")
		if f.Status != tt.status || f.Code != tt.code {
			t.Errorf("%s: %d %s, want %d %s", tt.name, f.Status, f.Code, tt.status, tt.code)
		}
	}
	if f := StartFailure(ErrUnknownModel, nil, "ghost"); f.Model != "ghost" || f.Message != `model "ghost" not found` {
		t.Errorf("unknown model failure %+v", f)
	}
	if f := StartFailure(&sched.RefusalError{Reason: sched.ReasonQueueFull, Model: "m"}, nil, "m"); f.RetryAfter < time.Second || f.Refusal != "queue_full" {
		t.Errorf("a busy refusal carries no Retry-After or reason: %+v", f)
	}
}

// SPEC P1, issue 11: a model that no route names and no Node offers is
// unknown (404 in every API); one that a route names, or that a Node still
// in the registry offers (even a fenced one), is known and 503 when nobody
// can serve it now.
func TestAModelNobodyOffersIsUnknownOneThatIsGoneIsUnavailable(t *testing.T) {
	cfg, err := edgeconfig.Parse([]byte(`
listen: {http: "127.0.0.1:8080", quic: "127.0.0.1:7443"}
identity: {mode: loopback}
routes: [{name: r, model: routed}]
`))
	if err != nil {
		t.Fatal(err)
	}
	reg := nodes.New(nodes.Options{})
	s := sched.New(reg, sched.Options{})
	g := New(cfg, s, nodeserver.NewServer(nodeserver.Options{}, reg), Options{})
	all := auth.Principal{Name: "a", Routes: []string{edgeconfig.AllRoutes}}
	start := func(model string) error {
		_, err := g.StartRun(t.Context(), all, model, &wirepb.RunRequest{}, nil)
		return err
	}
	if err := start("ghost"); !errors.Is(err, ErrUnknownModel) {
		t.Errorf("a model nobody offers: %v, want ErrUnknownModel", err)
	}
	if err := start("routed"); !errors.Is(err, sched.ErrNoCandidate) || errors.Is(err, ErrUnknownModel) {
		t.Errorf("a routed model with no Node: %v, want no_candidate", err)
	}
	c := reg.Register(nodes.ConnInfo{NodeID: "n1", Providers: []*wirepb.Provider{{Name: "p", Adapter: "ollama", Capacity: 1,
		State: wirepb.ProviderState_PROVIDER_STATE_ONLINE, Targets: []*wirepb.Target{{Name: "gone:latest"}}}}})
	reg.Fence(c, quicwire.CloseHeartbeatTimeout, "test")
	if err := start("gone"); !errors.Is(err, sched.ErrNoCandidate) || errors.Is(err, ErrUnknownModel) {
		t.Errorf("a model whose only Node is fenced: %v, want no_candidate (known, unavailable)", err)
	}
	if f := StartFailure(fmt.Errorf("x: %w", ErrUnknownModel), nil, "ghost"); f.Status != http.StatusNotFound {
		t.Errorf("unknown model status %d", f.Status)
	}
}

// A Node that says its slots are all taken, while the Edge's count had one
// free, is still finishing a call the Edge already let go of: the request
// waits a moment and tries the same candidate again, a bounded number of
// times, rather than being refused with one candidate (busyOnNode).
func TestABusyNodeIsRetriedNotLeft(t *testing.T) {
	busy := &wirepb.Failure{Kind: wirepb.FailureKind_FAILURE_KIND_CAPACITY_EXHAUSTED}
	if !busyOnNode(&RunFailedError{Event: &wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_FAILED, Failure: busy}}) ||
		!busyOnNode(&nodeserver.TunnelError{Outcome: wirepb.TunnelOutcome_TUNNEL_OUTCOME_FAILED, Failure: busy}) {
		t.Error("capacity_exhausted is not taken for a busy Node")
	}
	if busyOnNode(&RunFailedError{Event: &wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_DISCONNECTED}}) || busyOnNode(errors.New("x")) {
		t.Error("another failure is taken for a busy Node")
	}
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		n := 0
		for holdOff(t.Context(), n) {
			n++
		}
		if n != maxHoldOffs || time.Since(start) != 20*time.Millisecond*(1<<maxHoldOffs-1) {
			t.Errorf("%d hold-offs in %v", n, time.Since(start))
		}
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		if holdOff(ctx, 0) {
			t.Error("a hold-off outlived its context")
		}
	})
}
