package pluginhost

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/iop-dev/iop/internal/pluginpb"
	"github.com/iop-dev/iop/internal/shallow"
	"github.com/iop-dev/iop/quicwire/wirepb"
	"github.com/iop-dev/iop/sdk"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Configure hands the adapter its configuration. The adapter's refusal (an
// unknown key, say) comes back as an *sdk.Error of its kind.
func (p *Plugin) Configure(ctx context.Context, cfg sdk.Config) error {
	if err := p.usable(""); err != nil {
		return err
	}
	resp, err := p.rpc.Configure(ctx, &pluginpb.ConfigureRequest{ConfigJson: cfg})
	if err != nil {
		return p.callErr(ctx, err)
	}
	if f := resp.GetFailure(); f != nil {
		return errorFromFailure(f)
	}
	return nil
}

// TunnelRoute asks how the Node reaches the adapter's server itself for a
// raw tunnel (see sdk.TunnelRouter). Without the tunnel_route capability it
// fails with sdk.ErrUnsupported. The route is valid (sdk.TunnelRoute's
// Validate): the plugin side checks it before it is sent.
func (p *Plugin) TunnelRoute(ctx context.Context) (*sdk.TunnelRoute, error) {
	if err := p.usable(sdk.CapTunnelRoute); err != nil {
		return nil, err
	}
	resp, err := p.rpc.TunnelRoute(ctx, &pluginpb.TunnelRouteRequest{})
	if err != nil {
		return nil, p.callErr(ctx, err)
	}
	if f := resp.GetFailure(); f != nil {
		return nil, errorFromFailure(f)
	}
	route := tunnelRouteFromWire(resp)
	if err := route.Validate(); err != nil {
		return nil, p.protocolErr("tunnel route: %v", err)
	}
	return route, nil
}

// ListTargets lists the models the adapter's server offers. Without the
// list_targets capability it fails with sdk.ErrUnsupported.
func (p *Plugin) ListTargets(ctx context.Context) ([]sdk.Target, error) {
	if err := p.usable(sdk.CapListTargets); err != nil {
		return nil, err
	}
	resp, err := p.rpc.ListTargets(ctx, &pluginpb.ListTargetsRequest{})
	if err != nil {
		return nil, p.callErr(ctx, err)
	}
	if f := resp.GetFailure(); f != nil {
		return nil, errorFromFailure(f)
	}
	return targetsFromWire(resp.GetTargets()), nil
}

// Probe checks one exact target. Without the probe capability it fails with
// sdk.ErrUnsupported.
func (p *Plugin) Probe(ctx context.Context, target string) (sdk.Health, error) {
	if err := p.usable(sdk.CapProbe); err != nil {
		return sdk.Health{}, err
	}
	resp, err := p.rpc.Probe(ctx, &pluginpb.ProbeRequest{Target: target})
	if err != nil {
		return sdk.Health{}, p.callErr(ctx, err)
	}
	if f := resp.GetFailure(); f != nil {
		return sdk.Health{}, errorFromFailure(f)
	}
	return healthFromWire(resp), nil
}

// Execute runs one normalized run on the adapter. emit receives each
// non-terminal event in order, exactly as the plugin sent it, for the Node
// to relay. The plugin's one terminal event is returned as it crossed the
// plugin boundary, COMPLETED (its done reason and usage) or FAILED (its
// Failure), for the Node to relay too; ResultOf reads it as sdk values.
// An error means the call ended without a terminal from the plugin:
//
//   - If the process dies mid-run, the error matches ErrPluginExited and
//     sdk.ErrUnavailable.
//   - If ctx ends, the plugin's stream is cancelled (the adapter's ctx is
//     done) and Execute returns ctx.Err() at once.
//   - If emit fails, the stream is cancelled and its error returned.
//   - A stream without a terminal, with two, or with anything after the
//     terminal is an error matching ErrProtocol.
//
// A raw completion (req.Completion set) needs the complete capability: a
// plugin without it fails with sdk.ErrUnsupported before it is called (an
// adapter built before completions would run it as a chat without
// messages).
//
// The sealed lease and its binding are not sent to the plugin; cred is.
func (p *Plugin) Execute(ctx context.Context, req *wirepb.RunRequest, cred *sdk.Credential, emit func(*wirepb.RunEvent) error) (*wirepb.RunEvent, error) {
	if req.GetCountTokens() {
		return p.countTokens(ctx, req, cred, emit)
	}
	capability := ""
	if req.GetCompletion() != nil {
		capability = sdk.CapComplete
	}
	if err := p.usable(capability); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // ends the stream, whatever the reason we leave
	// Opening the plugin's stream and sending the request go deep in
	// gRPC, and this goroutine then waits for the events, through a
	// prefill for minutes: they run on a goroutine of its own, so this one
	// keeps a small stack while it waits (package shallow, issue 25).
	var stream grpc.ServerStreamingClient[wirepb.RunEvent]
	var err error
	shallow.Call(func() {
		stream, err = p.rpc.Execute(ctx, &pluginpb.ExecuteRequest{Run: withoutLease(req), Credential: credentialToWire(cred)})
	})
	if err != nil {
		return nil, p.callErr(ctx, err)
	}
	var seq uint64
	for {
		ev, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil, p.protocolErr("run %q ended without a terminal event", req.GetRunId())
		}
		if err != nil {
			return nil, p.callErr(ctx, err)
		}
		if ev.GetSeq() != seq+1 {
			return nil, p.protocolErr("run %q: event seq %d after %d", req.GetRunId(), ev.GetSeq(), seq)
		}
		seq = ev.GetSeq()
		switch ev.GetType() {
		case wirepb.RunEventType_RUN_EVENT_TYPE_TEXT_DELTA,
			wirepb.RunEventType_RUN_EVENT_TYPE_REASONING_DELTA,
			wirepb.RunEventType_RUN_EVENT_TYPE_TOOL_CALL_DELTA,
			wirepb.RunEventType_RUN_EVENT_TYPE_USAGE:
			if err := emit(ev); err != nil {
				return nil, err
			}
		case wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED, wirepb.RunEventType_RUN_EVENT_TYPE_FAILED:
			if ev.GetType() == wirepb.RunEventType_RUN_EVENT_TYPE_FAILED && ev.GetFailure() == nil {
				return nil, p.protocolErr("run %q failed without a failure", req.GetRunId())
			}
			if !endsAfterTerminal(stream.Recv) {
				return nil, p.protocolErr("run %q: event after the terminal event", req.GetRunId())
			}
			return terminalOnly(ev), nil
		default:
			// The other terminal types are the Node's to claim.
			return nil, p.protocolErr("run %q: plugin sent a %v event", req.GetRunId(), ev.GetType())
		}
	}
}

// countTokens answers a run that asks for its prompt's token count
// (RunRequest.count_tokens) as a run's events: one USAGE with the count,
// then COMPLETED with done_reason "count". It needs the count_tokens
// capability: without it, sdk.ErrUnsupported before the plugin is called.
func (p *Plugin) countTokens(ctx context.Context, req *wirepb.RunRequest, cred *sdk.Credential, emit func(*wirepb.RunEvent) error) (*wirepb.RunEvent, error) {
	if err := p.usable(sdk.CapCountTokens); err != nil {
		return nil, err
	}
	resp, err := p.rpc.CountTokens(ctx, &pluginpb.ExecuteRequest{Run: withoutLease(req), Credential: credentialToWire(cred)})
	if err != nil {
		return nil, p.callErr(ctx, err)
	}
	if f := resp.GetFailure(); f != nil {
		return &wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_FAILED, Failure: f}, nil
	}
	if err := emit(&wirepb.RunEvent{Seq: 1, Type: wirepb.RunEventType_RUN_EVENT_TYPE_USAGE,
		Usage: &wirepb.Usage{PromptTokens: resp.GetTokens()}}); err != nil {
		return nil, err
	}
	return &wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED, DoneReason: CountDone}, nil
}

// CountDone is the done reason of a counted run.
const CountDone = "count"

// endsAfterTerminal reports whether nothing follows a terminal on a stream.
// A stream that breaks after its terminal counts as ended: the outcome is
// known.
func endsAfterTerminal[T any](recv func() (T, error)) bool {
	_, err := recv()
	return err != nil
}

// usable fails a call that cannot be made: the plugin is closed or its
// process has exited, or it lacks capability (when not "").
func (p *Plugin) usable(capability string) error {
	select {
	case <-p.closing:
		return &sdk.Error{Kind: sdk.KindUnavailable, Message: fmt.Sprintf("plugin %s is closed", p.name), Err: ErrClosed}
	default:
	}
	if p.hasExited() {
		return p.exitErr()
	}
	if capability != "" && !p.has(capability) {
		return &sdk.Error{Kind: sdk.KindUnsupported, Message: fmt.Sprintf("adapter %s does not implement %s", p.name, capability)}
	}
	return nil
}

func (p *Plugin) exitErr() error {
	return &sdk.Error{
		Kind:    sdk.KindUnavailable,
		Message: fmt.Sprintf("plugin %s exited (%s)", p.name, p.exitStatus()),
		Err:     ErrPluginExited,
	}
}

func (p *Plugin) protocolErr(format string, args ...any) error {
	return &sdk.Error{
		Kind:    sdk.KindInternal,
		Message: fmt.Sprintf("plugin %s broke the plugin protocol: ", p.name) + fmt.Sprintf(format, args...),
		Err:     ErrProtocol,
	}
}

// callErr explains a failed call: ctx's error if ctx ended; ErrClosed or
// ErrPluginExited if the plugin went away under the call (a dead process
// shows first as a broken connection, so its exit gets a moment to be
// confirmed); otherwise the gRPC status as an *sdk.Error.
func (p *Plugin) callErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	st := status.Convert(err)
	if st.Code() == codes.Unavailable || st.Code() == codes.Canceled {
		t := time.NewTimer(exitConfirmWait)
		defer t.Stop()
		select {
		case <-p.exited:
			return p.exitErr()
		case <-p.closing:
			return p.usable("")
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	kind := sdk.KindInternal
	switch st.Code() {
	case codes.Unavailable:
		kind = sdk.KindUnavailable
	case codes.Unimplemented:
		kind = sdk.KindUnsupported
	}
	return &sdk.Error{Kind: kind, Message: fmt.Sprintf("plugin %s: %s", p.name, st.Message()), Err: err}
}
