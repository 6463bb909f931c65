package simulator

import (
	"context"
	"fmt"
	"math"
	"strings"

	"github.com/iop-dev/iop/sdk"
)

// Embed answers each input with a deterministic unit vector of the model's
// embedding_dims, from a hash of the target and the input: the same input
// always gets the same vector. dimensions shortens the vectors as models
// trained for it do: their first values, normalized again (more than the
// model has is refused). The model's prefill_delay passes first; its fail
// knob fails the call, and stall_after makes it wait for its cancel.
func (a *Adapter) Embed(ctx context.Context, req *sdk.EmbedRequest) (*sdk.EmbedResult, error) {
	m, ok := a.models.Load().byName[req.Target]
	if !ok {
		return nil, sdk.Errorf(sdk.KindModelNotFound, "simulator: no model %q", req.Target)
	}
	dims := m.dims
	if d := req.Dimensions; d > 0 {
		if d > m.dims {
			return nil, sdk.Errorf(sdk.KindInvalidRequest, "simulator: model %q has %d dimensions; %d asked for", req.Target, m.dims, d)
		}
		dims = d
	}
	if err := wait(ctx, m.prefill); err != nil {
		return nil, err
	}
	switch {
	case m.fail != nil:
		return nil, &sdk.Error{Kind: m.fail.kind, Message: "simulator: " + m.fail.message}
	case m.stallAfter > 0:
		<-ctx.Done()
		return nil, fmt.Errorf("simulator: stalled embedding call ended: %w", ctx.Err())
	}
	res := &sdk.EmbedResult{Usage: &sdk.Usage{}}
	for _, in := range req.Inputs {
		v := Vector(req.Target, in, m.dims)
		if dims < m.dims {
			v = v[:dims]
			normalize(v)
		}
		res.Vectors = append(res.Vectors, v)
		res.Usage.PromptTokens += int64(max(len(strings.Fields(in)), 1))
	}
	return res, nil
}

// Vector is the simulator's embedding of text by target, of dims values,
// a unit vector: what Embed answers when no dimensions are asked for.
func Vector(target, text string, dims int) []float32 {
	w := newWords(hashOf(target, text, nil))
	v := make([]float32, dims)
	for i := range v {
		v[i] = float32(int64(w.next()>>11)%2001-1000) / 1000
	}
	normalize(v)
	return v
}

// normalize scales v to length 1 (a zero vector stays zero).
func normalize(v []float32) {
	var sum float64
	for _, x := range v {
		sum += float64(x) * float64(x)
	}
	if sum == 0 {
		return
	}
	n := math.Sqrt(sum)
	for i := range v {
		v[i] = float32(float64(v[i]) / n)
	}
}
