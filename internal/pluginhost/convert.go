package pluginhost

import (
	"errors"
	"time"

	"github.com/iop-dev/iop/internal/pluginpb"
	"github.com/iop-dev/iop/quicwire/wirepb"
	"github.com/iop-dev/iop/sdk"
	"google.golang.org/protobuf/proto"
)

// The host side's conversions between the plain sdk types and the wire
// messages. The plugin side's counterparts are in package sdk (convert.go);
// the failure-kind table both use is in internal/pluginpb.

// FailureToWire returns the wire Failure for err, for the Node's terminal
// events: an *sdk.Error's kind, message, retryability and upstream status;
// a protocol violation (ErrProtocol) as kind protocol; any other error as
// internal with its text. Nil for nil.
func FailureToWire(err error) *wirepb.Failure {
	if err == nil {
		return nil
	}
	var e *sdk.Error
	if !errors.As(err, &e) {
		return pluginpb.NewFailure(int(sdk.KindInternal), err.Error(), false, 0)
	}
	msg := e.Message
	if msg == "" && e.Err != nil {
		msg = e.Err.Error()
	}
	f := pluginpb.NewFailure(int(e.Kind), msg, e.Retryable, e.UpstreamStatus)
	if errors.Is(err, ErrProtocol) {
		f.Kind = wirepb.FailureKind_FAILURE_KIND_PROTOCOL
	}
	return f
}

// errorFromFailure rebuilds the adapter's error from its wire Failure, so
// that errors.Is with the sdk sentinels works on the host.
func errorFromFailure(f *wirepb.Failure) *sdk.Error {
	return &sdk.Error{
		Kind:           sdk.Kind(pluginpb.KindFromWire(f.GetKind())),
		Message:        f.GetMessage(),
		Retryable:      f.GetRetryable(),
		UpstreamStatus: int(f.GetUpstreamStatus()),
	}
}

// terminalOnly is the terminal ev as the Node relays it: its type, done
// reason, usage and failure; anything else the plugin put on it is not
// part of a terminal and is dropped.
func terminalOnly(ev *wirepb.RunEvent) *wirepb.RunEvent {
	return &wirepb.RunEvent{Type: ev.GetType(), DoneReason: ev.GetDoneReason(), Usage: ev.GetUsage(), Failure: ev.GetFailure()}
}

// ResultOf reads a terminal that Execute or Embed returned as sdk values:
// a COMPLETED terminal's done reason and usage, or the *sdk.Error rebuilt
// from a FAILED one's Failure (so that errors.Is with the sdk sentinels
// works).
func ResultOf(term *wirepb.RunEvent) (*sdk.Result, error) {
	if term.GetType() == wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED {
		return &sdk.Result{DoneReason: term.GetDoneReason(), Usage: UsageFromWire(term.GetUsage())}, nil
	}
	if f := term.GetFailure(); f != nil {
		return nil, errorFromFailure(f)
	}
	return nil, &sdk.Error{Kind: sdk.KindInternal, Message: "the run ended " + term.GetType().String()}
}

// UsageToWire returns the wire form of u (nil for nil).
func UsageToWire(u *sdk.Usage) *wirepb.Usage {
	if u == nil {
		return nil
	}
	return &wirepb.Usage{
		PromptTokens:         u.PromptTokens,
		CompletionTokens:     u.CompletionTokens,
		TotalDurationNs:      int64(u.TotalDuration),
		LoadDurationNs:       int64(u.LoadDuration),
		PromptEvalDurationNs: int64(u.PromptEvalDuration),
		EvalDurationNs:       int64(u.EvalDuration),
	}
}

// UsageFromWire returns the sdk form of u (nil for nil).
func UsageFromWire(u *wirepb.Usage) *sdk.Usage {
	if u == nil {
		return nil
	}
	return &sdk.Usage{
		PromptTokens:       u.GetPromptTokens(),
		CompletionTokens:   u.GetCompletionTokens(),
		TotalDuration:      time.Duration(u.GetTotalDurationNs()),
		LoadDuration:       time.Duration(u.GetLoadDurationNs()),
		PromptEvalDuration: time.Duration(u.GetPromptEvalDurationNs()),
		EvalDuration:       time.Duration(u.GetEvalDurationNs()),
	}
}

func credentialToWire(c *sdk.Credential) *pluginpb.Credential {
	if c == nil {
		return nil
	}
	return &pluginpb.Credential{Kind: c.Kind, Secret: c.Secret}
}

func healthFromWire(s pluginpb.HealthStatus) sdk.HealthStatus {
	switch s {
	case pluginpb.HealthStatus_HEALTH_STATUS_AVAILABLE:
		return sdk.HealthAvailable
	case pluginpb.HealthStatus_HEALTH_STATUS_UNAVAILABLE:
		return sdk.HealthUnavailable
	}
	return sdk.HealthUnknown
}

// runWithoutLease returns r without its sealed lease and binding: the Node
// opens the lease and lends the plugin only the credential, so sealed
// leases never leave the Node. r itself is not changed.
func runWithoutLease(r *wirepb.RunRequest) *wirepb.RunRequest {
	if len(r.GetSealedLease()) == 0 && r.GetBinding() == nil {
		return r
	}
	c := proto.CloneOf(r)
	c.SealedLease, c.Binding = nil, nil
	return c
}

// tunnelWithoutLease is runWithoutLease for a tunnel request.
func tunnelWithoutLease(r *wirepb.TunnelRequest) *wirepb.TunnelRequest {
	if len(r.GetSealedLease()) == 0 && r.GetBinding() == nil {
		return r
	}
	c := proto.CloneOf(r)
	c.SealedLease, c.Binding = nil, nil
	return c
}
