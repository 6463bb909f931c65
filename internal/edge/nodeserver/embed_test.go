package nodeserver_test

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/iop-dev/iop/internal/transport"
	"github.com/iop-dev/iop/quicwire"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

func vectorsFrame(first uint32, values ...[]float32) *wirepb.EmbedFrame {
	v := &wirepb.EmbedVectors{First: first}
	for _, vals := range values {
		v.Vectors = append(v.Vectors, &wirepb.Vector{Values: vals})
	}
	return &wirepb.EmbedFrame{Frame: &wirepb.EmbedFrame_Vectors{Vectors: v}}
}

func embedTerminal(t wirepb.RunEventType) *wirepb.EmbedFrame {
	return &wirepb.EmbedFrame{Frame: &wirepb.EmbedFrame_Terminal{Terminal: &wirepb.RunEvent{Type: t, Usage: &wirepb.Usage{PromptTokens: 2}}}}
}

// embedNode starts Node n1 whose handler answers every embed stream with
// frames, after checking it got an embed header.
func embedNode(t *testing.T, h *harness, frames ...*wirepb.EmbedFrame) {
	t.Helper()
	h.startNode("n1", withHandler(handlerFunc(func(ctx context.Context, _ *transport.Session, hdr *wirepb.StreamHeader, st *transport.Stream) {
		if hdr.GetEmbed() == nil || st.Kind() != "embed" {
			t.Errorf("header %v on a %q stream, want an embed", hdr, st.Kind())
			return
		}
		for _, f := range frames {
			if st.Send(f) != nil {
				return
			}
		}
	})))
	h.waitReady("n1")
}

// P2, issue 12: an embedding call on its own stream: the vectors come in
// order, each frame is progress, and the call ends with the Node's
// terminal.
func TestEmbedGathersTheVectorsAndTheTerminal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newSimHarness(t)
		e := h.startEdge(0)
		embedNode(t, h, vectorsFrame(0, []float32{1, 2}), vectorsFrame(1, []float32{3, 4}),
			embedTerminal(wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED))
		es, err := e.srv.Embed(t.Context(), "n1", &wirepb.EmbedRequest{EmbedId: "e1", Inputs: []string{"a", "b"}})
		if err != nil {
			t.Fatal(err)
		}
		progress := 0
		vectors, term := es.Wait(func() { progress++ })
		if term.GetType() != wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED || term.GetUsage().GetPromptTokens() != 2 ||
			len(vectors) != 2 || vectors[1].GetValues()[1] != 4 || progress != 2 {
			t.Errorf("vectors %v, terminal %v, progress %d", vectors, term, progress)
		}
	})
}

// What the Edge cannot have meant from a Node ends the call with a
// protocol failure, never a wrong answer: frames out of order, vectors of
// two lengths, too few vectors for a completed call, no terminal.
func TestEmbedStreamsThatBreakTheProtocolFail(t *testing.T) {
	completed := embedTerminal(wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED)
	for _, c := range []struct {
		name   string
		frames []*wirepb.EmbedFrame
		says   string
	}{
		{"out of order", []*wirepb.EmbedFrame{vectorsFrame(1, []float32{1}), completed}, "from index 1, after 0"},
		{"two lengths", []*wirepb.EmbedFrame{vectorsFrame(0, []float32{1}, []float32{1, 2}), completed}, "vector 1 has 2 values"},
		{"too many", []*wirepb.EmbedFrame{vectorsFrame(0, []float32{1}, []float32{2}, []float32{3})}, "3 vector(s) from index 0"},
		{"too few", []*wirepb.EmbedFrame{vectorsFrame(0, []float32{1}), completed}, "completed with 1 vector(s) for 2"},
		{"no terminal", []*wirepb.EmbedFrame{vectorsFrame(0, []float32{1})}, "without a terminal"},
		{"not a number", []*wirepb.EmbedFrame{vectorsFrame(0, []float32{float32(math.NaN())}), completed}, "not a finite number"},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := newSimHarness(t)
				e := h.startEdge(0)
				embedNode(t, h, c.frames...)
				es, err := e.srv.Embed(t.Context(), "n1", &wirepb.EmbedRequest{EmbedId: "e", Inputs: []string{"a", "b"}})
				if err != nil {
					t.Fatal(err)
				}
				vectors, term := es.Wait(nil)
				if vectors != nil || term.GetFailure().GetKind() != wirepb.FailureKind_FAILURE_KIND_PROTOCOL || !strings.Contains(term.GetFailure().GetMessage(), c.says) {
					t.Errorf("vectors %v, terminal %v; want a protocol failure saying %q", vectors, term, c.says)
				}
			})
		})
	}
}

// R10: cancelling the call's context cancels it on the Node and yields one
// CANCELLED terminal; abandoning it (its Node turned suspect, P4) yields a
// retryable DISCONNECTED one that says why.
func TestEmbedCancelAndAbandon(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newSimHarness(t)
		e := h.startEdge(0)
		sawCancel := make(chan error, 2)
		h.startNode("n1", withHandler(handlerFunc(func(ctx context.Context, _ *transport.Session, _ *wirepb.StreamHeader, st *transport.Stream) {
			sawCancel <- st.Recv(new(wirepb.RunEvent))
		})))
		h.waitReady("n1")
		ctx, cancel := context.WithCancel(t.Context())
		es, err := e.srv.Embed(ctx, "n1", &wirepb.EmbedRequest{EmbedId: "e1", Inputs: []string{"a"}})
		if err != nil {
			t.Fatal(err)
		}
		time.AfterFunc(time.Minute, cancel)
		if _, term := es.Wait(nil); term.GetType() != wirepb.RunEventType_RUN_EVENT_TYPE_CANCELLED {
			t.Errorf("cancelled call: %v", term)
		}
		var sc *quicwire.StreamCancelledError
		if err := <-sawCancel; !errors.As(err, &sc) {
			t.Errorf("node saw %v, want the stream cancelled", err)
		}

		es, err = e.srv.Embed(t.Context(), "n1", &wirepb.EmbedRequest{EmbedId: "e2", Inputs: []string{"a"}})
		if err != nil {
			t.Fatal(err)
		}
		time.AfterFunc(time.Second, func() { es.Abandon(errors.New("node n1 turned suspect")) })
		_, term := es.Wait(nil)
		if term.GetType() != wirepb.RunEventType_RUN_EVENT_TYPE_DISCONNECTED || !term.GetFailure().GetRetryable() ||
			!strings.Contains(term.GetFailure().GetMessage(), "suspect") || !es.Abandoned() {
			t.Errorf("abandoned call: %v", term)
		}
		if es.Abandon(errors.New("again")) {
			t.Error("a call that ended was abandoned again")
		}
	})
}
