package pluginhost

import (
	"errors"
	"fmt"
	"io"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/iop-dev/iop/internal/pluginpb"
	"github.com/iop-dev/iop/quicwire/wirepb"
	"github.com/iop-dev/iop/sdk"
)

// The host side's conversions between the plain sdk types and the wire
// messages: all of them, in this file. The Node relays wire messages and
// needs few of them; the conformance kit (sdk/sdktest) drives a plugin
// with sdk values and converts at its edge with the exported ones. The
// plugin side's counterparts are in sdk/convert.go; the tables both sides
// share (failure kinds, health statuses, headers) are in internal/pluginpb.
// roundtrip_test.go pins the two files together.

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

// usageFromWire returns the sdk form of u (nil for nil).
func usageFromWire(u *wirepb.Usage) *sdk.Usage {
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

// RequestToWire returns the wire form of a run, as Plugin.Execute takes
// it. req.Credential is not part of it: pass it to Execute beside the
// request. A Prompt or Suffix makes it a raw completion. A zero Deadline is
// none, and a zero StallTimeout is sent as 0, which the adapter reads as
// the default (R4).
func RequestToWire(req *sdk.Request) *wirepb.RunRequest {
	r := &wirepb.RunRequest{
		RunId:     req.RunID,
		SessionId: req.SessionID,
		Target:    req.Target,
		Options: &wirepb.RunOptions{
			Temperature:     req.Options.Temperature,
			TopP:            req.Options.TopP,
			MaxTokens:       req.Options.MaxTokens,
			Stop:            req.Options.Stop,
			Seed:            req.Options.Seed,
			Format:          req.Options.Format,
			FormatName:      req.Options.FormatName,
			FormatStrict:    req.Options.FormatStrict,
			Think:           req.Options.Think,
			ExtraJson:       req.Options.Extra,
			ToolChoice:      string(req.Options.ToolChoice),
			ReasoningEffort: req.Options.ReasoningEffort,
		},
	}
	r.ResponseStallTimeoutMs, r.DeadlineUnixMs = timingToWire(req.StallTimeout, req.Deadline)
	if req.Prompt != "" || req.Suffix != "" {
		r.Completion = &wirepb.CompletionInput{Prompt: req.Prompt, Suffix: req.Suffix}
	}
	for _, m := range req.Messages {
		msg := &wirepb.ChatMessage{
			Role:       m.Role,
			Content:    m.Content,
			Reasoning:  m.Reasoning,
			ToolCallId: m.ToolCallID,
			Name:       m.Name,
			Images:     m.Images,
		}
		for _, tc := range m.ToolCalls {
			msg.ToolCalls = append(msg.ToolCalls, toolCallToWire(tc))
		}
		r.Messages = append(r.Messages, msg)
	}
	for _, t := range req.Tools {
		r.Tools = append(r.Tools, &wirepb.Tool{Name: t.Name, Description: t.Description, ParametersJson: t.Parameters})
	}
	return r
}

// timingToWire writes a request's stall timeout and hard deadline in
// milliseconds (0: the default, and none).
func timingToWire(stall time.Duration, deadline time.Time) (stallMs, deadlineMs int64) {
	if !deadline.IsZero() {
		deadlineMs = deadline.UnixMilli()
	}
	return stall.Milliseconds(), deadlineMs
}

func credentialToWire(c *sdk.Credential) *pluginpb.Credential {
	if c == nil {
		return nil
	}
	return &pluginpb.Credential{Kind: c.Kind, Secret: c.Secret}
}

func toolCallToWire(tc sdk.ToolCall) *wirepb.ToolCall {
	return &wirepb.ToolCall{Index: int32(tc.Index), Id: tc.ID, Name: tc.Name, ArgumentsJson: []byte(tc.Arguments)}
}

func toolCallFromWire(tc *wirepb.ToolCall) *sdk.ToolCall {
	return &sdk.ToolCall{Index: int(tc.GetIndex()), ID: tc.GetId(), Name: tc.GetName(), Arguments: string(tc.GetArgumentsJson())}
}

// EventFromWire returns the sdk form of one of a run's events, as
// Plugin.Execute emits them: a text, reasoning, tool-call or usage delta.
// Any other event (a terminal) is an error.
func EventFromWire(ev *wirepb.RunEvent) (sdk.Event, error) {
	switch ev.GetType() {
	case wirepb.RunEventType_RUN_EVENT_TYPE_TEXT_DELTA:
		return sdk.Event{Kind: sdk.TextDelta, Text: ev.GetText()}, nil
	case wirepb.RunEventType_RUN_EVENT_TYPE_REASONING_DELTA:
		return sdk.Event{Kind: sdk.ReasoningDelta, Text: ev.GetText()}, nil
	case wirepb.RunEventType_RUN_EVENT_TYPE_TOOL_CALL_DELTA:
		return sdk.Event{Kind: sdk.ToolCallDelta, ToolCall: toolCallFromWire(ev.GetToolCall())}, nil
	case wirepb.RunEventType_RUN_EVENT_TYPE_USAGE:
		return sdk.Event{Kind: sdk.UsageReport, Usage: usageFromWire(ev.GetUsage())}, nil
	}
	return sdk.Event{}, fmt.Errorf("pluginhost: a %v event is not one of a run's progress events", ev.GetType())
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
		return &sdk.Result{DoneReason: term.GetDoneReason(), Usage: usageFromWire(term.GetUsage())}, nil
	}
	if f := term.GetFailure(); f != nil {
		return nil, errorFromFailure(f)
	}
	return nil, &sdk.Error{Kind: sdk.KindInternal, Message: "the run ended " + term.GetType().String()}
}

// EmbedRequestToWire returns the wire form of an embedding call, as
// Plugin.Embed takes it. As with RequestToWire, req.Credential is passed
// beside it, and zero timings are sent as 0. A negative Dimensions is
// sent as 0, the model's own.
func EmbedRequestToWire(req *sdk.EmbedRequest) *wirepb.EmbedRequest {
	r := &wirepb.EmbedRequest{
		EmbedId:    req.EmbedID,
		SessionId:  req.SessionID,
		Target:     req.Target,
		Inputs:     req.Inputs,
		Dimensions: uint32(max(req.Dimensions, 0)),
		ExtraJson:  req.Extra,
	}
	r.ResponseStallTimeoutMs, r.DeadlineUnixMs = timingToWire(req.StallTimeout, req.Deadline)
	return r
}

// EmbedResultOf reads an embedding call's outcome as sdk values: the
// vectors of frames (as Plugin.Embed emitted them, in order) and the
// usage of a COMPLETED terminal, or the *sdk.Error of a FAILED one.
func EmbedResultOf(term *wirepb.RunEvent, frames []*wirepb.EmbedVectors) (*sdk.EmbedResult, error) {
	res, err := ResultOf(term)
	if err != nil {
		return nil, err
	}
	out := &sdk.EmbedResult{Usage: res.Usage}
	for _, f := range frames {
		for _, v := range f.GetVectors() {
			out.Vectors = append(out.Vectors, v.GetValues())
		}
	}
	return out, nil
}

// TunnelRequestToWire returns the wire form of a tunnel request, as
// Plugin.Tunnel takes it. req.Credential and req.Body are passed beside
// it.
func TunnelRequestToWire(req *sdk.TunnelRequest) *wirepb.TunnelRequest {
	return &wirepb.TunnelRequest{
		TunnelId:  req.TunnelID,
		SessionId: req.SessionID,
		Target:    req.Target,
		Method:    req.Method,
		Path:      req.Path,
		Headers:   pluginpb.HeadersToWire(req.Header),
	}
}

// TunnelRequestFromWire is a tunnel request as an adapter sees it, for the
// Node's own relay (sdk.RelayTunnel) of an adapter that gives a route.
func TunnelRequestFromWire(req *wirepb.TunnelRequest, body io.Reader, cred *sdk.Credential) *sdk.TunnelRequest {
	return &sdk.TunnelRequest{
		TunnelID:   req.GetTunnelId(),
		SessionID:  req.GetSessionId(),
		Target:     req.GetTarget(),
		Method:     req.GetMethod(),
		Path:       req.GetPath(),
		Header:     pluginpb.HeadersFromWire(req.GetHeaders()),
		Body:       body,
		Credential: cred,
	}
}

// WriteTunnelFrame hands one frame that Plugin.Tunnel emitted to resp, as
// an adapter's Tunneler wrote it: the response head to WriteHeader, a body
// chunk to Write. For the terminal frame it returns the tunnel's outcome:
// nil when it completed, the adapter's *sdk.Error when it failed. An error
// from resp is returned as it is.
func WriteTunnelFrame(resp sdk.TunnelResponse, f *wirepb.TunnelFrame) error {
	switch fr := f.GetFrame().(type) {
	case *wirepb.TunnelFrame_Head:
		return resp.WriteHeader(int(fr.Head.GetStatus()), pluginpb.HeadersFromWire(fr.Head.GetHeaders()))
	case *wirepb.TunnelFrame_Body:
		_, err := resp.Write(fr.Body)
		return err
	case *wirepb.TunnelFrame_Terminal:
		switch t := fr.Terminal; t.GetOutcome() {
		case wirepb.TunnelOutcome_TUNNEL_OUTCOME_COMPLETED:
			return nil
		case wirepb.TunnelOutcome_TUNNEL_OUTCOME_FAILED:
			if t.GetFailure() != nil {
				return errorFromFailure(t.GetFailure())
			}
		}
		return &sdk.Error{Kind: sdk.KindInternal, Message: "the tunnel ended " + fr.Terminal.GetOutcome().String()}
	}
	return &sdk.Error{Kind: sdk.KindInternal, Message: "an empty tunnel frame"}
}

// infoFromWire is the adapter's Info as it described itself.
func infoFromWire(d *pluginpb.DescribeResponse) sdk.Info {
	return sdk.Info{
		Name:         d.GetName(),
		Version:      d.GetVersion(),
		Description:  d.GetDescription(),
		ConfigFields: d.GetConfigFields(),
	}
}

func targetsFromWire(targets []*wirepb.Target) []sdk.Target {
	out := make([]sdk.Target, 0, len(targets))
	for _, t := range targets {
		out = append(out, sdk.Target{Name: t.GetName()})
	}
	return out
}

// tunnelRouteFromWire is the route an adapter gave.
func tunnelRouteFromWire(r *pluginpb.TunnelRouteResponse) *sdk.TunnelRoute {
	return &sdk.TunnelRoute{BaseURL: r.GetBaseUrl(), Header: pluginpb.HeadersFromWire(r.GetHeaders()), Bearer: r.GetBearer(),
		Loaded: sdk.LoadedReport(r.GetLoaded())}
}

func healthFromWire(r *pluginpb.ProbeResponse) sdk.Health {
	return sdk.Health{Status: sdk.HealthStatus(pluginpb.HealthFromWire(r.GetStatus())), Detail: r.GetDetail()}
}

// leased is a request that may carry a sealed lease and its binding.
type leased interface {
	proto.Message
	GetSealedLease() []byte
	GetBinding() *wirepb.LeaseBinding
}

// withoutLease returns r without its sealed lease and binding (the fields
// of those names, which run, embed and tunnel requests share): the Node
// opens the lease and lends the plugin only the credential, so sealed
// leases never leave the Node. r itself is not changed.
func withoutLease[M leased](r M) M {
	if len(r.GetSealedLease()) == 0 && r.GetBinding() == nil {
		return r
	}
	c := proto.CloneOf(r)
	m := c.ProtoReflect()
	fields := m.Descriptor().Fields()
	m.Clear(fields.ByName("sealed_lease"))
	m.Clear(fields.ByName("binding"))
	return c
}
