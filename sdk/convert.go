package sdk

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"time"

	"github.com/iop-dev/iop/internal/pluginpb"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// The plugin side's conversions between the wire messages (which cross the
// plugin boundary unchanged) and the plain Go types adapter authors see:
// all of them, in this file. The host's counterparts are in
// internal/pluginhost/convert.go; the tables both sides share (failure
// kinds, health statuses, headers) are in internal/pluginpb. pluginhost's
// round-trip test pins the two files together.

// defaultStallTimeout is what a wire response_stall_timeout_ms of 0 means (R4).
const defaultStallTimeout = 300 * time.Second

// requestFromWire builds the adapter's view of a run.
func requestFromWire(r *wirepb.RunRequest, cred *pluginpb.Credential) *Request {
	req := &Request{
		RunID:      r.GetRunId(),
		SessionID:  r.GetSessionId(),
		Target:     r.GetTarget(),
		Credential: credentialFromWire(cred),
	}
	req.StallTimeout, req.Deadline = timingFromWire(r.GetResponseStallTimeoutMs(), r.GetDeadlineUnixMs())
	if c := r.GetCompletion(); c != nil {
		req.Prompt, req.Suffix = c.GetPrompt(), c.GetSuffix()
	}
	for _, m := range r.GetMessages() {
		msg := Message{
			Role:       m.GetRole(),
			Content:    m.GetContent(),
			Reasoning:  m.GetReasoning(),
			ToolCallID: m.GetToolCallId(),
			Name:       m.GetName(),
			Images:     m.GetImages(),
		}
		for _, tc := range m.GetToolCalls() {
			msg.ToolCalls = append(msg.ToolCalls, toolCallFromWire(tc))
		}
		req.Messages = append(req.Messages, msg)
	}
	for _, t := range r.GetTools() {
		req.Tools = append(req.Tools, Tool{
			Name:        t.GetName(),
			Description: t.GetDescription(),
			Parameters:  t.GetParametersJson(),
		})
	}
	if o := r.GetOptions(); o != nil {
		req.Options = Options{
			Temperature:     o.Temperature,
			TopP:            o.TopP,
			MaxTokens:       o.MaxTokens,
			Stop:            o.GetStop(),
			Seed:            o.Seed,
			Format:          o.GetFormat(),
			FormatName:      o.GetFormatName(),
			FormatStrict:    o.GetFormatStrict(),
			Think:           o.Think,
			ReasoningEffort: o.GetReasoningEffort(),
			Extra:           o.GetExtraJson(),
			ToolChoice:      ToolChoice(o.GetToolChoice()),
		}
	}
	return req
}

// timingFromWire reads a request's stall timeout (0: the default, R4) and
// hard deadline (0: none).
func timingFromWire(stallMs, deadlineMs int64) (stall time.Duration, deadline time.Time) {
	stall = defaultStallTimeout
	if stallMs > 0 {
		stall = time.Duration(stallMs) * time.Millisecond
	}
	if deadlineMs > 0 {
		deadline = time.UnixMilli(deadlineMs)
	}
	return stall, deadline
}

func credentialFromWire(c *pluginpb.Credential) *Credential {
	if c == nil {
		return nil
	}
	return &Credential{Kind: c.GetKind(), Secret: c.GetSecret()}
}

func toolCallFromWire(tc *wirepb.ToolCall) ToolCall {
	return ToolCall{
		Index:     int(tc.GetIndex()),
		ID:        tc.GetId(),
		Name:      tc.GetName(),
		Arguments: string(tc.GetArgumentsJson()),
	}
}

// errInvalidEvent is wrapped by the error EventSink.Send returns for an
// event the adapter should not have sent.
var errInvalidEvent = errors.New("sdk: invalid event")

// eventToWire validates ev and returns its wire form. Events are never
// terminal: a run's outcome is Execute's return value.
func eventToWire(ev Event) (*wirepb.RunEvent, error) {
	bad := func(format string, args ...any) error {
		return &Error{Kind: KindInternal, Message: fmt.Sprintf("invalid %v event: ", ev.Kind) + fmt.Sprintf(format, args...), Err: errInvalidEvent}
	}
	out := &wirepb.RunEvent{}
	switch ev.Kind {
	case TextDelta, ReasoningDelta:
		if ev.ToolCall != nil || ev.Usage != nil {
			return nil, bad("a text delta carries only Text")
		}
		out.Type = wirepb.RunEventType_RUN_EVENT_TYPE_TEXT_DELTA
		if ev.Kind == ReasoningDelta {
			out.Type = wirepb.RunEventType_RUN_EVENT_TYPE_REASONING_DELTA
		}
		out.Text = ev.Text
	case ToolCallDelta:
		if ev.ToolCall == nil {
			return nil, bad("ToolCall is nil")
		}
		if ev.Text != "" || ev.Usage != nil {
			return nil, bad("a tool-call delta carries only ToolCall")
		}
		if ev.ToolCall.Index < 0 || ev.ToolCall.Index > math.MaxInt32 {
			return nil, bad("tool-call index %d out of range", ev.ToolCall.Index)
		}
		out.Type = wirepb.RunEventType_RUN_EVENT_TYPE_TOOL_CALL_DELTA
		out.ToolCall = &wirepb.ToolCall{
			Index:         int32(ev.ToolCall.Index),
			Id:            ev.ToolCall.ID,
			Name:          ev.ToolCall.Name,
			ArgumentsJson: []byte(ev.ToolCall.Arguments),
		}
	case UsageReport:
		if ev.Usage == nil {
			return nil, bad("Usage is nil")
		}
		if ev.Text != "" || ev.ToolCall != nil {
			return nil, bad("a usage event carries only Usage")
		}
		out.Type = wirepb.RunEventType_RUN_EVENT_TYPE_USAGE
		out.Usage = usageToWire(ev.Usage)
	default:
		return nil, &Error{Kind: KindInternal, Err: errInvalidEvent, Message: fmt.Sprintf(
			"invalid event kind %d: events are text, reasoning, tool-call or usage deltas; "+
				"a run's outcome is Execute's return value", int(ev.Kind))}
	}
	return out, nil
}

// usageToWire returns the wire form of u (nil for nil). The host has the
// same mapping (pluginhost.UsageToWire) for the Node's own terminals.
func usageToWire(u *Usage) *wirepb.Usage {
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

// terminalEvent is the run's one terminal: COMPLETED with res, or FAILED
// with err.
func terminalEvent(res *Result, err error) *wirepb.RunEvent {
	if err != nil {
		return &wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_FAILED, Failure: failureToWire(err)}
	}
	if res == nil {
		res = &Result{}
	}
	return &wirepb.RunEvent{
		Type:       wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED,
		DoneReason: res.DoneReason,
		Usage:      usageToWire(res.Usage),
	}
}

// failureToWire returns the wire Failure of err: its *Error's kind,
// message, retryability and upstream status, or an internal failure with
// err's text for any other error. (The host's pluginhost.FailureToWire
// does the same for the Node's own failures, and adds the protocol kind.)
func failureToWire(err error) *wirepb.Failure {
	if err == nil {
		return nil
	}
	var e *Error
	if !errors.As(err, &e) {
		return pluginpb.NewFailure(int(KindInternal), err.Error(), false, 0)
	}
	msg := e.Message
	if msg == "" && e.Err != nil {
		msg = e.Err.Error()
	}
	return pluginpb.NewFailure(int(e.Kind), msg, e.Retryable, e.UpstreamStatus)
}

// embedRequestFromWire builds the adapter's view of an embedding call.
func embedRequestFromWire(r *wirepb.EmbedRequest, cred *pluginpb.Credential) *EmbedRequest {
	req := &EmbedRequest{
		EmbedID:    r.GetEmbedId(),
		SessionID:  r.GetSessionId(),
		Target:     r.GetTarget(),
		Inputs:     r.GetInputs(),
		Dimensions: int(r.GetDimensions()),
		Extra:      r.GetExtraJson(),
		Credential: credentialFromWire(cred),
	}
	req.StallTimeout, req.Deadline = timingFromWire(r.GetResponseStallTimeoutMs(), r.GetDeadlineUnixMs())
	return req
}

// embedFrames cuts vectors into EmbedVectors frames of at most
// wirepb.MaxEmbedFrameValues values (one vector at least), in order.
func embedFrames(vectors [][]float32) []*wirepb.EmbedFrame {
	var frames []*wirepb.EmbedFrame
	var cur *wirepb.EmbedVectors
	values := 0
	for i, v := range vectors {
		if cur == nil || values+len(v) > wirepb.MaxEmbedFrameValues {
			cur = &wirepb.EmbedVectors{First: uint32(i)}
			frames = append(frames, &wirepb.EmbedFrame{Frame: &wirepb.EmbedFrame_Vectors{Vectors: cur}})
			values = 0
		}
		cur.Vectors = append(cur.Vectors, &wirepb.Vector{Values: v})
		values += len(v)
	}
	return frames
}

// embedTerminal is the one terminal of an embedding call: COMPLETED with
// the usage, or FAILED with err.
func embedTerminal(res *EmbedResult, err error) *wirepb.EmbedFrame {
	ev := terminalEvent(nil, err)
	if err == nil && res != nil {
		ev.Usage = usageToWire(res.Usage)
	}
	return &wirepb.EmbedFrame{Frame: &wirepb.EmbedFrame_Terminal{Terminal: ev}}
}

// tunnelRequestFromWire builds the adapter's view of a tunnel request; the
// caller sets its Body.
func tunnelRequestFromWire(r *wirepb.TunnelRequest, cred *pluginpb.Credential) *TunnelRequest {
	return &TunnelRequest{
		TunnelID:   r.GetTunnelId(),
		SessionID:  r.GetSessionId(),
		Target:     r.GetTarget(),
		Method:     r.GetMethod(),
		Path:       r.GetPath(),
		Header:     pluginpb.HeadersFromWire(r.GetHeaders()),
		Credential: credentialFromWire(cred),
	}
}

// tunnelHead is the frame of a tunnel's response head.
func tunnelHead(status int, header http.Header) *wirepb.TunnelFrame {
	return &wirepb.TunnelFrame{Frame: &wirepb.TunnelFrame_Head{Head: &wirepb.TunnelResponseHead{
		Status: int32(status), Headers: pluginpb.HeadersToWire(header),
	}}}
}

// tunnelTerminal is a tunnel's one terminal frame: completed, or failed
// with err.
func tunnelTerminal(err error) *wirepb.TunnelFrame {
	term := &wirepb.TunnelTerminal{Outcome: wirepb.TunnelOutcome_TUNNEL_OUTCOME_COMPLETED}
	if err != nil {
		term = &wirepb.TunnelTerminal{Outcome: wirepb.TunnelOutcome_TUNNEL_OUTCOME_FAILED, Failure: failureToWire(err)}
	}
	return &wirepb.TunnelFrame{Frame: &wirepb.TunnelFrame_Terminal{Terminal: term}}
}

func targetsToWire(targets []Target) []*wirepb.Target {
	out := make([]*wirepb.Target, 0, len(targets))
	for _, t := range targets {
		out = append(out, &wirepb.Target{Name: t.Name})
	}
	return out
}

func healthToWire(h Health) *pluginpb.ProbeResponse {
	return &pluginpb.ProbeResponse{Status: pluginpb.HealthToWire(int(h.Status)), Detail: h.Detail}
}

func describeToWire(info Info, caps []string) *pluginpb.DescribeResponse {
	return &pluginpb.DescribeResponse{
		Name:            info.Name,
		Version:         info.Version,
		Description:     info.Description,
		ConfigFields:    info.ConfigFields,
		Capabilities:    caps,
		ProtocolVersion: pluginpb.ProtocolVersion,
	}
}

// tunnelRouteToWire is the wire form of a valid route.
func tunnelRouteToWire(r *TunnelRoute) *pluginpb.TunnelRouteResponse {
	return &pluginpb.TunnelRouteResponse{BaseUrl: r.BaseURL, Headers: pluginpb.HeadersToWire(r.Header), Bearer: r.Bearer,
		Loaded: string(r.Loaded)}
}
