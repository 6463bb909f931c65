package simulator_test

import (
	"errors"
	"math"
	"slices"
	"testing"

	"github.com/iop-dev/iop/plugins/simulator"
	"github.com/iop-dev/iop/sdk"
)

// length is the Euclidean length of v.
func length(v []float32) float64 {
	var s float64
	for _, x := range v {
		s += float64(x) * float64(x)
	}
	return math.Sqrt(s)
}

// P2, issue 12: the simulator embeds deterministically: the same input
// gets the same unit vector, another input another; dimensions shortens
// them (normalized again), up to the model's own length.
func TestEmbedGivesDeterministicUnitVectors(t *testing.T) {
	a := adapter(t, `{"models":[{"name":"emb","embedding_dims":8},{"name":"down","fail":{"kind":"unavailable"}}]}`)
	res, err := a.Embed(t.Context(), &sdk.EmbedRequest{Target: "emb", Inputs: []string{"alpha beta", "gamma", "alpha beta"}})
	if err != nil {
		t.Fatal(err)
	}
	v := res.Vectors
	if len(v) != 3 || len(v[0]) != 8 || !slices.Equal(v[0], v[2]) || slices.Equal(v[0], v[1]) ||
		!slices.Equal(v[0], simulator.Vector("emb", "alpha beta", 8)) || math.Abs(length(v[1])-1) > 1e-6 {
		t.Fatalf("vectors %v", v)
	}
	if res.Usage.PromptTokens != 5 {
		t.Errorf("usage %+v", res.Usage)
	}
	short, err := a.Embed(t.Context(), &sdk.EmbedRequest{Target: "emb", Inputs: []string{"gamma"}, Dimensions: 3})
	if err != nil || len(short.Vectors[0]) != 3 || math.Abs(length(short.Vectors[0])-1) > 1e-6 {
		t.Fatalf("dimensions 3: %v, %v", short, err)
	}
	for _, c := range []struct {
		req  *sdk.EmbedRequest
		want error
	}{
		{&sdk.EmbedRequest{Target: "emb", Inputs: []string{"x"}, Dimensions: 9}, sdk.ErrInvalidRequest},
		{&sdk.EmbedRequest{Target: "down", Inputs: []string{"x"}}, sdk.ErrUnavailable},
		{&sdk.EmbedRequest{Target: "nope", Inputs: []string{"x"}}, sdk.ErrModelNotFound},
	} {
		if _, err := a.Embed(t.Context(), c.req); !errors.Is(err, c.want) {
			t.Errorf("%+v: %v, want %v", c.req, err, c.want)
		}
	}
}

// P2, issue 12: a raw completion streams text seeded by its prompt and
// suffix, without the model's tool call; a model without fill-in-the-
// middle refuses a suffix as unsupported.
func TestCompleteContinuesThePrompt(t *testing.T) {
	a := adapter(t, `{"models":[{"name":"sim","tokens":6,"token_interval":"0s","tool_call":{"name":"f"}},{"name":"plain","no_suffix":true}]}`)
	complete := func(prompt, suffix string) (string, *sdk.Result) {
		t.Helper()
		s := newSink()
		res, err := a.Complete(t.Context(), &sdk.Request{Target: "sim", Prompt: prompt, Suffix: suffix}, s)
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range s.events {
			if ev.Kind == sdk.ToolCallDelta {
				t.Errorf("a tool call in a raw completion: %+v", ev)
			}
		}
		return s.text(), res
	}
	one, res := complete("def add(a, b):", "")
	again, _ := complete("def add(a, b):", "")
	fim, _ := complete("def add(a, b):", "return c")
	if one == "" || one != again || one == fim || res.DoneReason != "stop" || res.Usage.PromptTokens != 3 || res.Usage.CompletionTokens != 6 {
		t.Errorf("%q, %q, %q, %+v", one, again, fim, res)
	}
	_, err := a.Complete(t.Context(), &sdk.Request{Target: "plain", Prompt: "x", Suffix: "y"}, newSink())
	if !errors.Is(err, sdk.ErrUnsupported) {
		t.Errorf("a suffix on a model without fill-in-the-middle: %v", err)
	}
}
