package sdk

import (
	"context"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"

	"github.com/iop-dev/iop/internal/pluginpb"
	"github.com/iop-dev/iop/quicwire/wirepb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// adapterServer serves an Adapter over the plugin protocol. Every call into
// the adapter goes through guard, so a panic becomes a KindInternal failure
// of that call and the process survives.
type adapterServer struct {
	pluginpb.UnimplementedAdapterServer
	a   Adapter
	log *slog.Logger
}

var _ pluginpb.AdapterServer = (*adapterServer)(nil)

func newAdapterServer(a Adapter, log *slog.Logger) *adapterServer {
	return &adapterServer{a: a, log: log}
}

// guard calls f, turning a panic into a KindInternal error that says which
// method panicked. The stack goes to the log, not to the host's error.
func guard[T any](s *adapterServer, method string, f func() (T, error)) (res T, err error) {
	defer func() {
		if r := recover(); r != nil {
			s.log.Error("adapter panicked", "method", method, "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
			err = &Error{Kind: KindInternal, Message: fmt.Sprintf("adapter panicked in %s: %v", method, r)}
		}
	}()
	return f()
}

func (s *adapterServer) Describe(context.Context, *pluginpb.DescribeRequest) (*pluginpb.DescribeResponse, error) {
	info, err := guard(s, "Info", func() (Info, error) { return s.a.Info(), nil })
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return describeToWire(info, capabilities(s.a)), nil
}

// capabilities is Capabilities, never nil, so that `describe` prints [].
func capabilities(a Adapter) []string {
	caps := Capabilities(a)
	if caps == nil {
		caps = []string{}
	}
	return caps
}

func (s *adapterServer) Configure(ctx context.Context, req *pluginpb.ConfigureRequest) (*pluginpb.ConfigureResponse, error) {
	_, err := guard(s, "Configure", func() (struct{}, error) {
		return struct{}{}, s.a.Configure(ctx, Config(req.GetConfigJson()))
	})
	return &pluginpb.ConfigureResponse{Failure: failureToWire(err)}, nil
}

func (s *adapterServer) ListTargets(ctx context.Context, _ *pluginpb.ListTargetsRequest) (*pluginpb.ListTargetsResponse, error) {
	tl, ok := s.a.(TargetLister)
	if !ok {
		return &pluginpb.ListTargetsResponse{Failure: failureToWire(unsupported(CapListTargets))}, nil
	}
	targets, err := guard(s, "ListTargets", func() ([]Target, error) { return tl.ListTargets(ctx) })
	if err != nil {
		return &pluginpb.ListTargetsResponse{Failure: failureToWire(err)}, nil
	}
	return &pluginpb.ListTargetsResponse{Targets: targetsToWire(targets)}, nil
}

func (s *adapterServer) Probe(ctx context.Context, req *pluginpb.ProbeRequest) (*pluginpb.ProbeResponse, error) {
	p, ok := s.a.(Prober)
	if !ok {
		return &pluginpb.ProbeResponse{Failure: failureToWire(unsupported(CapProbe))}, nil
	}
	h, err := guard(s, "Probe", func() (Health, error) { return p.Probe(ctx, req.GetTarget()) })
	if err != nil {
		return &pluginpb.ProbeResponse{Failure: failureToWire(err)}, nil
	}
	return healthToWire(h), nil
}

func (s *adapterServer) TunnelRoute(ctx context.Context, _ *pluginpb.TunnelRouteRequest) (*pluginpb.TunnelRouteResponse, error) {
	r, ok := s.a.(TunnelRouter)
	if !ok {
		return &pluginpb.TunnelRouteResponse{Failure: failureToWire(unsupported(CapTunnelRoute))}, nil
	}
	route, err := guard(s, "TunnelRoute", func() (*TunnelRoute, error) { return r.TunnelRoute(ctx) })
	if err == nil {
		if verr := route.Validate(); verr != nil {
			err = &Error{Kind: KindInternal, Message: "adapter's tunnel route: " + verr.Error()}
		}
	}
	if err != nil {
		return &pluginpb.TunnelRouteResponse{Failure: failureToWire(err)}, nil
	}
	return tunnelRouteToWire(route), nil
}

func (s *adapterServer) Close(ctx context.Context, _ *pluginpb.CloseRequest) (*pluginpb.CloseResponse, error) {
	c, ok := s.a.(Closer)
	if !ok {
		return &pluginpb.CloseResponse{}, nil
	}
	_, err := guard(s, "Close", func() (struct{}, error) { return struct{}{}, c.Close(ctx) })
	return &pluginpb.CloseResponse{Failure: failureToWire(err)}, nil
}

// CountTokens counts a run's prompt with the adapter's tokenizer.
func (s *adapterServer) CountTokens(ctx context.Context, req *pluginpb.ExecuteRequest) (*pluginpb.CountTokensResponse, error) {
	tc, ok := s.a.(TokenCounter)
	if !ok {
		return &pluginpb.CountTokensResponse{Failure: failureToWire(unsupported(CapCountTokens))}, nil
	}
	if req.GetRun() == nil {
		return &pluginpb.CountTokensResponse{Failure: failureToWire(&Error{Kind: KindInvalidRequest, Message: "count request without a run"})}, nil
	}
	r := requestFromWire(req.GetRun(), req.GetCredential())
	n, err := guard(s, "CountTokens", func() (int64, error) { return tc.CountTokens(ctx, r) })
	if err == nil && n < 0 {
		err = &Error{Kind: KindInternal, Message: fmt.Sprintf("adapter counted %d tokens", n)}
	}
	if err != nil {
		return &pluginpb.CountTokensResponse{Failure: failureToWire(err)}, nil
	}
	return &pluginpb.CountTokensResponse{Tokens: n}, nil
}

func unsupported(capability string) *Error {
	return &Error{Kind: KindUnsupported, Message: "adapter does not implement " + capability}
}

// Execute runs one run. Exactly one terminal: claimed here, after the
// adapter's Execute has returned and the sink is closed, so no event can
// follow it.
func (s *adapterServer) Execute(req *pluginpb.ExecuteRequest, stream pluginpb.Adapter_ExecuteServer) error {
	ctx := stream.Context()
	run := req.GetRun()
	sink := &eventSink{stream: stream, ctx: ctx, runID: run.GetRunId(), sessionID: run.GetSessionId()}
	var res *Result
	var err error
	switch c, completer := s.a.(Completer); {
	case run == nil:
		err = &Error{Kind: KindInvalidRequest, Message: "execute request without a run"}
	case run.GetCompletion() != nil && !completer:
		err = unsupported(CapComplete) // never run as a chat: it has no messages
	case run.GetCompletion() != nil:
		r := requestFromWire(run, req.GetCredential())
		res, err = guard(s, "Complete", func() (*Result, error) { return c.Complete(ctx, r, sink) })
	default:
		r := requestFromWire(run, req.GetCredential())
		res, err = guard(s, "Execute", func() (*Result, error) { return s.a.Execute(ctx, r, sink) })
	}
	return sink.finish(terminalEvent(res, err))
}

// Embed computes one call's embeddings and sends them in frames, in input
// order. Exactly one terminal: sent here, last, once the adapter's result
// has been checked (one vector per input, one length, finite values) and
// its vectors sent.
func (s *adapterServer) Embed(call *pluginpb.EmbedCall, stream pluginpb.Adapter_EmbedServer) error {
	ctx := stream.Context()
	var res *EmbedResult
	err := checkEmbedRequest(call.GetRequest())
	e, ok := s.a.(Embedder)
	switch {
	case !ok:
		err = unsupported(CapEmbed)
	case err == nil:
		req := embedRequestFromWire(call.GetRequest(), call.GetCredential())
		if res, err = guard(s, "Embed", func() (*EmbedResult, error) { return e.Embed(ctx, req) }); err == nil {
			err = checkEmbedResult(call.GetRequest(), res)
		}
	}
	if err == nil {
		for _, f := range embedFrames(res.Vectors) {
			if err := stream.Send(f); err != nil {
				return err
			}
		}
	}
	if ctx.Err() != nil {
		return nil // nobody is listening; the host ends the call itself
	}
	return stream.Send(embedTerminal(res, err))
}

// eventSink is the EventSink of one run: it numbers events from 1, stamps
// them with the run's ids and refuses them once the run is over.
type eventSink struct {
	stream    pluginpb.Adapter_ExecuteServer
	ctx       context.Context // the run's: done when the host cancels or goes
	runID     string
	sessionID string

	mu   sync.Mutex // serializes Send on the stream; guards the fields below
	seq  uint64
	done bool
}

// Send validates ev and delivers it to the host, in order.
func (s *eventSink) Send(ctx context.Context, ev Event) error {
	out, err := eventToWire(ev)
	if err != nil {
		return err
	}
	if ctx.Err() != nil || s.ctx.Err() != nil {
		return ErrHostGone
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.done {
		return ErrHostGone
	}
	if err := s.send(out); err != nil {
		return fmt.Errorf("%w: %v", ErrHostGone, err)
	}
	return nil
}

// send stamps and sends ev. The caller holds s.mu.
func (s *eventSink) send(ev *wirepb.RunEvent) error {
	s.seq++
	ev.Seq = s.seq
	ev.RunId = s.runID
	ev.SessionId = s.sessionID
	return s.stream.Send(ev)
}

// finish sends the terminal event and refuses every later Send.
func (s *eventSink) finish(terminal *wirepb.RunEvent) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.done = true
	if s.ctx.Err() != nil {
		return nil // nobody is listening; the host ends the run itself
	}
	return s.send(terminal)
}
