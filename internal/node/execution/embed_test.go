package execution

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/iop-dev/iop/internal/transport"
	"github.com/iop-dev/iop/quicwire/wirepb"
	"github.com/iop-dev/iop/sdk"
)

func embedReq(id string, inputs ...string) *wirepb.EmbedRequest {
	return &wirepb.EmbedRequest{EmbedId: id, Target: "m", Inputs: inputs}
}

// embedPlugin is a fake plugin with the embed capability whose Embed sends
// each input's vector (its length, twice) in frames of one vector.
func embedPlugin() *fakePlugin {
	pl := newFakePlugin(nil)
	pl.caps = []string{sdk.CapEmbed}
	pl.embed = func(ctx context.Context, req *wirepb.EmbedRequest, emit func(*wirepb.EmbedVectors) error) (*sdk.Usage, error) {
		for i, in := range req.GetInputs() {
			v := &wirepb.Vector{Values: []float32{float32(len(in)), float32(len(in))}}
			if err := emit(&wirepb.EmbedVectors{First: uint32(i), Vectors: []*wirepb.Vector{v}}); err != nil {
				return nil, err
			}
		}
		return &sdk.Usage{PromptTokens: int64(len(req.GetInputs()))}, nil
	}
	return pl
}

// serveEmbed runs one call the way the transport does, and returns its
// frames: the vectors, then the one terminal.
func serveEmbed(t *testing.T, h *Handler, sess *transport.Session, req *wirepb.EmbedRequest) ([]*wirepb.EmbedVectors, *wirepb.RunEvent) {
	t.Helper()
	st := newFakeStream()
	h.serveEmbed(t.Context(), sess, req, st)
	st.cancel()
	var vectors []*wirepb.EmbedVectors
	var term *wirepb.RunEvent
	for i, f := range st.embedFrames() {
		switch {
		case term != nil:
			t.Fatalf("frame %d after the terminal: %v", i, f)
		case f.GetTerminal() != nil:
			term = f.GetTerminal()
		default:
			vectors = append(vectors, f.GetVectors())
		}
	}
	if term == nil || !term.GetType().IsTerminal() {
		t.Fatalf("no terminal among %v", st.embedFrames())
	}
	return vectors, term
}

// P2, issue 12: an embedding call on the Node relays the plugin's frames of
// vectors in order, then exactly one terminal with the usage.
func TestEmbedRelaysVectorsThenOneTerminal(t *testing.T) {
	_, h := onlineSet(t, 1, embedPlugin())
	vectors, term := serveEmbed(t, h, nil, embedReq("e1", "a", "bcd"))
	if len(vectors) != 2 || vectors[1].GetFirst() != 1 || vectors[1].GetVectors()[0].GetValues()[0] != 3 {
		t.Errorf("vectors %v", vectors)
	}
	if term.GetType() != wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED || term.GetUsage().GetPromptTokens() != 2 {
		t.Errorf("terminal %v", term)
	}
}

// Requests the Node must not serve fail before any adapter call: outside
// the bounds (invalid_request, R4's stall timeout included), on a provider
// whose adapter cannot embed (unsupported), over capacity.
func TestEmbedRefusalsNeverReachTheAdapter(t *testing.T) {
	pl := embedPlugin()
	_, h := onlineSet(t, 1, pl)
	many := make([]string, wirepb.MaxEmbedInputs+1)
	for i := range many {
		many[i] = "x"
	}
	badStall := embedReq("s", "x")
	badStall.ResponseStallTimeoutMs = -1
	wide := embedReq("w", "x")
	wide.Dimensions = wirepb.MaxEmbedDimensions + 1
	for _, c := range []struct {
		req  *wirepb.EmbedRequest
		want wirepb.FailureKind
	}{
		{embedReq("none"), wirepb.FailureKind_FAILURE_KIND_INVALID_REQUEST},
		{embedReq("empty", "x", ""), wirepb.FailureKind_FAILURE_KIND_INVALID_REQUEST},
		{embedReq("many", many...), wirepb.FailureKind_FAILURE_KIND_INVALID_REQUEST},
		{wide, wirepb.FailureKind_FAILURE_KIND_INVALID_REQUEST},
		{badStall, wirepb.FailureKind_FAILURE_KIND_INVALID_REQUEST},
		{&wirepb.EmbedRequest{EmbedId: "u", Target: "nope", Inputs: []string{"x"}}, wirepb.FailureKind_FAILURE_KIND_MODEL_NOT_FOUND},
	} {
		if _, term := serveEmbed(t, h, nil, c.req); term.GetFailure().GetKind() != c.want {
			t.Errorf("%s: terminal %v, want %v", c.req.GetEmbedId(), term, c.want)
		}
	}
	chatOnly := newFakePlugin(nil)
	_, h2 := onlineSet(t, 1, chatOnly)
	if _, term := serveEmbed(t, h2, nil, embedReq("c", "x")); term.GetFailure().GetKind() != wirepb.FailureKind_FAILURE_KIND_UNSUPPORTED {
		t.Errorf("an adapter without embed: terminal %v, want unsupported", term)
	}
	if pl.calls.Load() != 0 || chatOnly.calls.Load() != 0 {
		t.Errorf("adapters called %d and %d times for refused calls", pl.calls.Load(), chatOnly.calls.Load())
	}
}

// A result past wirepb.MaxEmbedValues fails as upstream; what was relayed
// before it stays, and the one terminal says why.
func TestEmbedResultsAreBounded(t *testing.T) {
	pl := newFakePlugin(nil)
	pl.caps = []string{sdk.CapEmbed}
	pl.embed = func(ctx context.Context, req *wirepb.EmbedRequest, emit func(*wirepb.EmbedVectors) error) (*sdk.Usage, error) {
		big := &wirepb.Vector{Values: make([]float32, wirepb.MaxEmbedDimensions)}
		for i := range wirepb.MaxEmbedValues/wirepb.MaxEmbedDimensions + 1 {
			if err := emit(&wirepb.EmbedVectors{First: uint32(i), Vectors: []*wirepb.Vector{big}}); err != nil {
				return nil, err
			}
		}
		return nil, nil
	}
	_, h := onlineSet(t, 1, pl)
	vectors, term := serveEmbed(t, h, nil, embedReq("big", "x"))
	if len(vectors) != wirepb.MaxEmbedValues/wirepb.MaxEmbedDimensions || term.GetFailure().GetKind() != wirepb.FailureKind_FAILURE_KIND_UPSTREAM {
		t.Errorf("%d frames, terminal %v", len(vectors), term)
	}
}

// R5: an embedding call is guarded by the same watchdog as a run: a
// provider silent for the stall timeout ends it with one response_stalled
// terminal carrying the Node's observation.
func TestEmbedStallEndsWithResponseStalled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		pl := newFakePlugin(nil)
		pl.caps = []string{sdk.CapEmbed}
		pl.probe = health(sdk.HealthAvailable)
		pl.embed = func(ctx context.Context, _ *wirepb.EmbedRequest, _ func(*wirepb.EmbedVectors) error) (*sdk.Usage, error) {
			<-ctx.Done()
			return nil, context.Cause(ctx)
		}
		_, h := onlineSet(t, 1, pl)
		req := embedReq("stall", "x")
		req.ResponseStallTimeoutMs = stallMs
		start := time.Now()
		_, term := serveEmbed(t, h, transport.NewSession("node-a", 7, time.Now()), req)
		if term.GetType() != wirepb.RunEventType_RUN_EVENT_TYPE_RESPONSE_STALLED || time.Since(start) != stallMs*time.Millisecond {
			t.Fatalf("terminal %v after %v", term, time.Since(start))
		}
		if o := term.GetStall(); o.GetHealthObservationSeq() != 1 || o.GetNodeId() != "node-a" || !o.GetCloseConfirmed() || o.GetTarget() != "m" {
			t.Errorf("observation %v", o)
		}
	})
}

// P2, issue 12: a raw completion runs only on a plugin with the complete
// capability; on another it fails as unsupported, never reaching the
// adapter as a chat without messages.
func TestACompletionRunNeedsTheCompleteCapability(t *testing.T) {
	pl := newFakePlugin(func(ctx context.Context, req *wirepb.RunRequest, emit func(*wirepb.RunEvent) error) (*sdk.Result, error) {
		if err := emit(text(req.GetCompletion().GetPrompt() + "!")); err != nil {
			return nil, err
		}
		return &sdk.Result{DoneReason: "stop"}, nil
	})
	_, h := onlineSet(t, 1, pl)
	req := run("c1")
	req.Completion = &wirepb.CompletionInput{Prompt: "once"}
	st := newFakeStream()
	serve(h, t.Context(), req, st)
	if term := requireOneTerminal(t, st.events()); term.GetFailure().GetKind() != wirepb.FailureKind_FAILURE_KIND_UNSUPPORTED || pl.calls.Load() != 0 {
		t.Fatalf("without the capability: terminal %v, %d calls", term, pl.calls.Load())
	}
	pl.caps = []string{sdk.CapComplete}
	st = newFakeStream()
	serve(h, t.Context(), req, st)
	evs := st.events()
	if term := requireOneTerminal(t, evs); term.GetType() != wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED || evs[0].GetText() != "once!" {
		t.Errorf("with the capability: %v", evs)
	}
}
