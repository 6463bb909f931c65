package pluginhost

import (
	"errors"
	"fmt"
	"testing"

	"github.com/iop-dev/iop/internal/pluginpb"
	"github.com/iop-dev/iop/quicwire/wirepb"
	"github.com/iop-dev/iop/sdk"
)

func TestFailureToWire(t *testing.T) {
	cases := []struct {
		name string
		err  error
		want *wirepb.Failure
	}{
		{"nil", nil, nil},
		{"plain error", errors.New("disk full"), &wirepb.Failure{Kind: wirepb.FailureKind_FAILURE_KIND_INTERNAL, Message: "disk full"}},
		{"wrapped sdk error", fmt.Errorf("call: %w", &sdk.Error{Kind: sdk.KindRateLimited, Message: "slow down", Retryable: true, UpstreamStatus: 429}),
			&wirepb.Failure{Kind: wirepb.FailureKind_FAILURE_KIND_RATE_LIMITED, Message: "slow down", Retryable: true, UpstreamStatus: 429}},
		{"message from the cause", &sdk.Error{Kind: sdk.KindUnavailable, Err: errors.New("connection refused")},
			&wirepb.Failure{Kind: wirepb.FailureKind_FAILURE_KIND_PROVIDER_UNAVAILABLE, Message: "connection refused"}},
		{"protocol violation", &sdk.Error{Kind: sdk.KindInternal, Message: "two terminals", Err: ErrProtocol},
			&wirepb.Failure{Kind: wirepb.FailureKind_FAILURE_KIND_PROTOCOL, Message: "two terminals"}},
	}
	for _, c := range cases {
		got := FailureToWire(c.err)
		if got.GetKind() != c.want.GetKind() || got.GetMessage() != c.want.GetMessage() ||
			got.GetRetryable() != c.want.GetRetryable() || got.GetUpstreamStatus() != c.want.GetUpstreamStatus() || (got == nil) != (c.want == nil) {
			t.Errorf("%s: FailureToWire = %v, want %v", c.name, got, c.want)
		}
	}
}

// Every kind survives a round trip through the wire.
func TestFailureRoundTripKeepsTheKind(t *testing.T) {
	for k := sdk.KindInternal; k <= sdk.KindUnsupported; k++ {
		in := &sdk.Error{Kind: k, Message: "m", Retryable: true, UpstreamStatus: 503}
		out := errorFromFailure(FailureToWire(in))
		if *out != *in {
			t.Errorf("%v: round trip gave %+v", k, out)
		}
	}
}

// Sealed leases never leave the Node; the caller's request is untouched.
func TestLeaseIsStrippedFromPluginRequests(t *testing.T) {
	req := &wirepb.RunRequest{RunId: "r", SealedLease: []byte("sealed"), Binding: &wirepb.LeaseBinding{Principal: "p"}}
	out := withoutLease(req)
	if out.GetSealedLease() != nil || out.GetBinding() != nil || out.GetRunId() != "r" {
		t.Errorf("plugin request %v", out)
	}
	if string(req.GetSealedLease()) != "sealed" || req.GetBinding() == nil {
		t.Error("the caller's request changed")
	}
	plain := &wirepb.RunRequest{RunId: "r"}
	if withoutLease(plain) != plain {
		t.Error("a request without a lease was copied")
	}
	tun := &wirepb.TunnelRequest{TunnelId: "t", SealedLease: []byte("x"), Binding: &wirepb.LeaseBinding{Principal: "p"}}
	if out := withoutLease(tun); out.GetSealedLease() != nil || out.GetBinding() != nil || out.GetTunnelId() != "t" || tun.GetSealedLease() == nil {
		t.Error("tunnel lease not stripped, or the caller's request changed")
	}
	emb := &wirepb.EmbedRequest{EmbedId: "e", SealedLease: []byte("x"), Binding: &wirepb.LeaseBinding{Principal: "p"}}
	if out := withoutLease(emb); out.GetSealedLease() != nil || out.GetBinding() != nil || out.GetEmbedId() != "e" || emb.GetBinding() == nil {
		t.Error("embed lease not stripped, or the caller's request changed")
	}
}

// Issue 23: how a server reports what it has loaded crosses the plugin
// boundary with the route.
func TestTunnelRouteKeepsItsLoadedReport(t *testing.T) {
	for _, want := range []sdk.LoadedReport{sdk.LoadedUnknown, sdk.LoadedOllamaPS, sdk.LoadedAll} {
		if got := tunnelRouteFromWire(&pluginpb.TunnelRouteResponse{BaseUrl: "http://h", Loaded: string(want)}).Loaded; got != want {
			t.Errorf("loaded report %q came back as %q", want, got)
		}
	}
}
