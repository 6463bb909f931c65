package pluginhost_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/iop-dev/iop/internal/pluginhost"
	"github.com/iop-dev/iop/internal/testadapter"
	"github.com/iop-dev/iop/quicwire/wirepb"
	"github.com/iop-dev/iop/sdk"
)

// embed runs one call on p and returns the frames it relayed and its
// outcome.
func embed(ctx context.Context, p *pluginhost.Plugin, target string, dims int, inputs ...string) ([]*wirepb.EmbedVectors, *sdk.Usage, error) {
	var frames []*wirepb.EmbedVectors
	term, err := p.Embed(ctx, &wirepb.EmbedRequest{EmbedId: "emb-1", Target: target, Inputs: inputs, Dimensions: uint32(dims)}, nil,
		func(f *wirepb.EmbedVectors) error {
			frames = append(frames, f)
			return nil
		})
	if err != nil {
		return frames, nil, err
	}
	res, err := pluginhost.ResultOf(term)
	if err != nil {
		return frames, nil, err
	}
	return frames, res.Usage, nil
}

// vectorsOf flattens frames into their vectors.
func vectorsOf(frames []*wirepb.EmbedVectors) [][]float32 {
	var out [][]float32
	for _, f := range frames {
		for _, v := range f.GetVectors() {
			out = append(out, v.GetValues())
		}
	}
	return out
}

// P2, issue 12: an embedding call crosses the plugin boundary as frames of
// vectors in input order, then its usage; dimensions reach the adapter.
func TestEmbedReturnsOneVectorPerInputInOrder(t *testing.T) {
	eachHost(t, func(t *testing.T, start startFunc) {
		p, _ := start(t, false)
		inputs := []string{"alpha", "bravo", "alpha"}
		for _, dims := range []int{0, 2} {
			frames, usage, err := embed(t.Context(), p, "embed", dims, inputs...)
			if err != nil {
				t.Fatalf("dims %d: %v", dims, err)
			}
			want := testadapter.DefaultDimensions
			if dims > 0 {
				want = dims
			}
			got := vectorsOf(frames)
			for i, in := range inputs {
				if i >= len(got) || !slices.Equal(got[i], testadapter.Vector(in, want)) {
					t.Fatalf("dims %d: vectors %v, want %d of %d values in input order", dims, got, len(inputs), want)
				}
			}
			if usage == nil || usage.PromptTokens != 3 {
				t.Errorf("usage %+v", usage)
			}
		}
	})
}

// A result larger than a frame is cut into frames, each within the wire's
// bound, numbered by the index of their first vector.
func TestEmbedCutsALargeResultIntoFrames(t *testing.T) {
	eachHost(t, func(t *testing.T, start startFunc) {
		p, _ := start(t, false)
		inputs := make([]string, 200)
		for i := range inputs {
			inputs[i] = fmt.Sprintf("input %d", i)
		}
		frames, _, err := embed(t.Context(), p, "wide:3000", 0, inputs...)
		if err != nil {
			t.Fatal(err)
		}
		next := 0
		for _, f := range frames {
			values := 0
			for _, v := range f.GetVectors() {
				values += len(v.GetValues())
			}
			if int(f.GetFirst()) != next || values > wirepb.MaxEmbedFrameValues {
				t.Fatalf("frame from %d with %d values after %d vectors", f.GetFirst(), values, next)
			}
			next += len(f.GetVectors())
		}
		if len(frames) < 2 || next != len(inputs) {
			t.Errorf("%d frames, %d vectors; want several frames and %d vectors", len(frames), next, len(inputs))
		}
	})
}

// What an adapter answers is checked before it leaves the plugin: a result
// it could not have meant fails as upstream, and a failure keeps its kind
// across the boundary.
func TestEmbedFailuresKeepTheirKind(t *testing.T) {
	cases := []struct {
		target string
		dims   int
		inputs []string
		want   error
		says   string
	}{
		{"fail:rate_limited", 0, []string{"x"}, sdk.ErrRateLimited, "scripted"},
		{"short", 0, []string{"x", "y"}, sdk.ErrUpstream, "1 vectors for 2 inputs"},
		{"wide:8", 4, []string{"x"}, sdk.ErrUpstream, "ignored dimensions"},
		{"embed", 0, []string{"x", ""}, sdk.ErrInvalidRequest, "input 1 is empty"},
		{"embed", 0, nil, sdk.ErrInvalidRequest, "no inputs"},
		{"panic", 0, []string{"x"}, sdk.ErrInternal, "panicked in Embed"},
		{"nope", 0, []string{"x"}, sdk.ErrModelNotFound, "no script"},
	}
	eachHost(t, func(t *testing.T, start startFunc) {
		p, _ := start(t, false)
		for _, c := range cases {
			frames, _, err := embed(t.Context(), p, c.target, c.dims, c.inputs...)
			if !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.says) || len(frames) != 0 {
				t.Errorf("%s: %d frames, %v; want %v saying %q", c.target, len(frames), err, c.want, c.says)
			}
		}
		// The process survived the panic.
		if _, _, err := embed(t.Context(), p, "embed", 0, "x"); err != nil {
			t.Errorf("after the panic: %v", err)
		}
	})
}

// R10: a cancelled call returns promptly with the context's error, and the
// adapter's call sees its context end.
func TestEmbedCancelReachesTheAdapter(t *testing.T) {
	eachHost(t, func(t *testing.T, start startFunc) {
		p, _ := start(t, false)
		ctx, cancel := context.WithCancel(t.Context())
		defer time.AfterFunc(200*time.Millisecond, cancel).Stop()
		began := time.Now()
		_, _, err := embed(ctx, p, "sleep", 0, "x")
		if !errors.Is(err, context.Canceled) || time.Since(began) > 2*time.Second {
			t.Fatalf("%v after %v", err, time.Since(began))
		}
		waitFor(t, "the adapter's call to end", 5*time.Second, func() bool {
			h, err := p.Probe(t.Context(), "stats")
			return err == nil && strings.Contains(h.Detail, "active=0") && strings.Contains(h.Detail, "cancelled=1")
		})
	})
}

// P2, issue 12: a raw completion reaches the adapter's Complete with its
// prompt and suffix, and streams like a run; a server without
// fill-in-the-middle refuses the suffix as unsupported.
func TestACompletionRunReachesComplete(t *testing.T) {
	eachHost(t, func(t *testing.T, start startFunc) {
		p, _ := start(t, false)
		req := run("text:2")
		req.Completion = &wirepb.CompletionInput{Prompt: "Hello world", Suffix: "END"}
		events, res, err := collect(t.Context(), p, req)
		if err != nil || res.DoneReason != "stop" || res.Usage.PromptTokens != 2 {
			t.Fatalf("%+v, %v", res, err)
		}
		var text strings.Builder
		for _, ev := range events {
			text.WriteString(ev.GetText())
		}
		if text.String() != "Hello0Hello1|END" {
			t.Errorf("text %q", text.String())
		}
		req = run("nofim")
		req.Completion = &wirepb.CompletionInput{Prompt: "x", Suffix: "y"}
		if _, _, err := collect(t.Context(), p, req); !errors.Is(err, sdk.ErrUnsupported) {
			t.Errorf("a suffix on a model without fill-in-the-middle: %v", err)
		}
	})
}
