package sdktest

import (
	"cmp"
	"context"
	"errors"
	"fmt"

	"github.com/iop-dev/iop/internal/pluginhost"
	"github.com/iop-dev/iop/quicwire/wirepb"
	"github.com/iop-dev/iop/sdk"
)

// The Session's calls into the subject, in the sdk's own types. This file
// is the kit's edge: each call converts its sdk values to the plugin
// protocol (pluginhost's conversions), calls the plugin through the
// Node's own host, over gRPC, and converts the answer back. Nothing of the
// wire is seen beyond it.

// Info returns the adapter's Info, as it described itself over the plugin
// protocol when it started.
func (s *Session) Info(ctx context.Context) (sdk.Info, error) {
	p, err := s.running(ctx)
	if err != nil {
		return sdk.Info{}, err
	}
	return p.Info(), nil
}

// Capabilities returns the capabilities the plugin reports (sdk.Cap*), in
// the adapter's order.
func (s *Session) Capabilities(ctx context.Context) ([]string, error) {
	p, err := s.running(ctx)
	if err != nil {
		return nil, err
	}
	return p.Capabilities(), nil
}

// Configure hands cfg to the running plugin, as the Node does; the
// adapter's refusal comes back as an *sdk.Error of its kind. The session
// does not configure the plugin again with Options.Config until it starts
// a new one: a check that configures something else should configure
// Options.Config again (or Restart) before it ends.
func (s *Session) Configure(ctx context.Context, cfg sdk.Config) error {
	p, err := s.running(ctx)
	if err != nil {
		return err
	}
	return p.Configure(ctx, cfg)
}

// ListTargets lists the models the adapter's server offers. Without the
// list_targets capability it fails with sdk.ErrUnsupported.
func (s *Session) ListTargets(ctx context.Context) ([]sdk.Target, error) {
	p, err := s.running(ctx)
	if err != nil {
		return nil, err
	}
	return p.ListTargets(ctx)
}

// Probe checks one exact target. Without the probe capability it fails
// with sdk.ErrUnsupported.
func (s *Session) Probe(ctx context.Context, target string) (sdk.Health, error) {
	p, err := s.running(ctx)
	if err != nil {
		return sdk.Health{}, err
	}
	return p.Probe(ctx, target)
}

// Execute runs req on the subject and returns the events it streamed, in
// order, and its outcome: the Result it completed with, or its error (an
// *sdk.Error of the adapter's kind, so that errors.Is with the sdk
// sentinels works). A Prompt or Suffix makes req a raw completion, which
// needs the complete capability. See Stream for the details.
func (s *Session) Execute(ctx context.Context, req *sdk.Request) ([]sdk.Event, *sdk.Result, error) {
	var events []sdk.Event
	res, err := s.Stream(ctx, req, func(ev sdk.Event) error {
		events = append(events, ev)
		return nil
	})
	return events, res, err
}

// Stream runs req on the subject as the Node does, and hands each event
// to emit as it arrives. It returns the run's outcome: the Result it
// completed with, or its error. An empty RunID or SessionID is given a
// fresh one; a nil Credential is Options.Credential. When ctx ends, the
// run is cancelled (the adapter's ctx is done) and Stream returns ctx's
// error at once; when emit fails, the run is cancelled and emit's error
// returned. A plugin that breaks the plugin protocol (events out of order,
// an event of another run, no outcome or two) fails the run with an
// error of kind internal that says so.
func (s *Session) Stream(ctx context.Context, req *sdk.Request, emit func(sdk.Event) error) (*sdk.Result, error) {
	if req == nil {
		return nil, errors.New("sdktest: a run with a nil request")
	}
	p, err := s.running(ctx)
	if err != nil {
		return nil, err
	}
	r := pluginhost.RequestToWire(req)
	r.RunId = s.orNewID(r.GetRunId(), "run")
	r.SessionId = cmp.Or(r.GetSessionId(), sessionID)
	term, err := p.Execute(ctx, r, s.credential(req.Credential), func(ev *wirepb.RunEvent) error {
		if ev.GetRunId() != r.GetRunId() {
			return &sdk.Error{Kind: sdk.KindInternal, Err: pluginhost.ErrProtocol, Message: fmt.Sprintf(
				"the plugin broke the plugin protocol: event %d of run %q is stamped with run %q", ev.GetSeq(), r.GetRunId(), ev.GetRunId())}
		}
		e, err := pluginhost.EventFromWire(ev)
		if err != nil {
			return &sdk.Error{Kind: sdk.KindInternal, Err: pluginhost.ErrProtocol, Message: "the plugin broke the plugin protocol: " + err.Error()}
		}
		return emit(e)
	})
	if err != nil {
		return nil, err
	}
	return pluginhost.ResultOf(term)
}

// CountTokens counts req's prompt with the subject's tokenizer, as the
// Node does for a count run (RunRequest.count_tokens). Without the
// count_tokens capability it fails with sdk.ErrUnsupported; an adapter
// whose server cannot tokenize fails the same way.
func (s *Session) CountTokens(ctx context.Context, req *sdk.Request) (int64, error) {
	if req == nil {
		return 0, errors.New("sdktest: a count with a nil request")
	}
	p, err := s.running(ctx)
	if err != nil {
		return 0, err
	}
	r := pluginhost.RequestToWire(req)
	r.RunId = s.orNewID(r.GetRunId(), "run")
	r.SessionId = cmp.Or(r.GetSessionId(), sessionID)
	r.CountTokens = true
	var tokens int64
	term, err := p.Execute(ctx, r, s.credential(req.Credential), func(ev *wirepb.RunEvent) error {
		tokens = ev.GetUsage().GetPromptTokens()
		return nil
	})
	if err != nil {
		return 0, err
	}
	if _, err := pluginhost.ResultOf(term); err != nil {
		return 0, err
	}
	return tokens, nil
}

// Embed computes one call's embeddings on the subject and returns them:
// one vector per input, in order, and the usage, or the call's error.
// Without the embed capability it fails with sdk.ErrUnsupported. An empty
// EmbedID or SessionID is given a fresh one; a nil Credential is
// Options.Credential.
func (s *Session) Embed(ctx context.Context, req *sdk.EmbedRequest) (*sdk.EmbedResult, error) {
	if req == nil {
		return nil, errors.New("sdktest: an embedding call with a nil request")
	}
	p, err := s.running(ctx)
	if err != nil {
		return nil, err
	}
	r := pluginhost.EmbedRequestToWire(req)
	r.EmbedId = s.orNewID(r.GetEmbedId(), "embed")
	r.SessionId = cmp.Or(r.GetSessionId(), sessionID)
	var frames []*wirepb.EmbedVectors
	term, err := p.Embed(ctx, r, s.credential(req.Credential), func(f *wirepb.EmbedVectors) error {
		frames = append(frames, f)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return pluginhost.EmbedResultOf(term, frames)
}

// Tunnel relays one raw HTTP request through the subject and writes the
// server's answer to resp as the adapter's Tunneler wrote it: WriteHeader
// once, then the body. It returns nil once the answer is complete, or the
// tunnel's error (the adapter's, as an *sdk.Error of its kind; or resp's,
// which cancels the tunnel). Without the tunnel capability it fails with
// sdk.ErrUnsupported. req.Body may be nil (no body). An empty TunnelID or
// SessionID is given a fresh one; a nil Credential is Options.Credential.
func (s *Session) Tunnel(ctx context.Context, req *sdk.TunnelRequest, resp sdk.TunnelResponse) error {
	if req == nil || resp == nil {
		return errors.New("sdktest: a tunnel with a nil request or response")
	}
	p, err := s.running(ctx)
	if err != nil {
		return err
	}
	r := pluginhost.TunnelRequestToWire(req)
	r.TunnelId = s.orNewID(r.GetTunnelId(), "tunnel")
	r.SessionId = cmp.Or(r.GetSessionId(), sessionID)
	return p.Tunnel(ctx, r, s.credential(req.Credential), req.Body, func(f *wirepb.TunnelFrame) error {
		return pluginhost.WriteTunnelFrame(resp, f)
	})
}

// TunnelRoute asks the subject how the Node reaches its server itself for
// a raw tunnel (capability tunnel_route). The route is valid when it
// comes back without an error.
func (s *Session) TunnelRoute(ctx context.Context) (*sdk.TunnelRoute, error) {
	p, err := s.running(ctx)
	if err != nil {
		return nil, err
	}
	return p.TunnelRoute(ctx)
}

// credential is c, or Options.Credential when c is nil.
func (s *Session) credential(c *sdk.Credential) *sdk.Credential {
	if c == nil {
		return s.opts.Credential
	}
	return c
}

// orNewID is id, or a fresh id of kind when id is empty.
func (s *Session) orNewID(id, kind string) string {
	if id == "" {
		return s.newID(kind)
	}
	return id
}
