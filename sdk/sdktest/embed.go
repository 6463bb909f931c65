package sdktest

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/iop-dev/iop/sdk"
)

// checkComplete runs a raw completion of the target: an adapter that
// reports complete must stream it as a run (text, one outcome, a done
// reason); one that does not is refused by the host as unsupported, and
// never runs it as a chat without messages.
func checkComplete(ctx context.Context, s *Session) error {
	caps, err := s.Capabilities(ctx)
	if err != nil {
		return err
	}
	target, err := s.Target(ctx)
	if err != nil {
		return err
	}
	req := s.newRun(target)
	req.Messages = nil
	req.Prompt = "Once upon a time"
	events, res, err := s.Execute(ctx, req)
	if !slices.Contains(caps, sdk.CapComplete) {
		if !errors.Is(err, sdk.ErrUnsupported) {
			return fmt.Errorf("does not report %s, but a raw completion %s; want kind %s", sdk.CapComplete, outcomeText(err), sdk.KindUnsupported)
		}
		s.Logf("not reported: a raw completion is refused (%v)", err)
		return nil
	}
	if err := validateRun(req, events, res, err); err != nil {
		return fmt.Errorf("reports %s, but a raw completion: %w", sdk.CapComplete, err)
	}
	s.Logf("%q: a raw completion of %d event(s), done reason %q", target, len(events), res.DoneReason)
	return nil
}

// checkEmbed asks Options.EmbedTarget (or Target) for the embeddings of
// three inputs, then for half as many dimensions: one vector per input, in
// order, all of one length, and shortened vectors or a clear refusal
// (unsupported, invalid_request) for a model that cannot shorten them. An
// adapter that does not report embed is refused by the host as
// unsupported.
func checkEmbed(ctx context.Context, s *Session) error {
	caps, err := s.Capabilities(ctx)
	if err != nil {
		return err
	}
	target := s.opts.EmbedTarget
	if target == "" {
		if target, err = s.Target(ctx); err != nil {
			return err
		}
	}
	inputs := []string{"The quick brown fox.", "An Edge and its Nodes.", "A third input, a little longer than the others."}
	vectors, err := s.embed(ctx, target, inputs, 0)
	if !slices.Contains(caps, sdk.CapEmbed) {
		if !errors.Is(err, sdk.ErrUnsupported) {
			return fmt.Errorf("does not report %s, but Embed %s; want kind %s", sdk.CapEmbed, outcomeText(err), sdk.KindUnsupported)
		}
		s.Logf("not reported: Embed is refused (%v)", err)
		return nil
	}
	what := fmt.Sprintf("Embed of %d inputs on %q", len(inputs), target)
	if err != nil {
		return fmt.Errorf("reports %s, but %s %s (is Options.EmbedTarget, --embed-target, an embedding model?)", sdk.CapEmbed, what, outcomeText(err))
	}
	dims, err := sameLength(vectors, len(inputs))
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if dims < 2 {
		s.Logf("%q: %d vectors of %d dimension(s)", target, len(vectors), dims)
		return nil
	}
	half := dims / 2
	short, err := s.embed(ctx, target, inputs[:1], half)
	switch {
	case errors.Is(err, sdk.ErrUnsupported) || errors.Is(err, sdk.ErrInvalidRequest):
		s.Logf("%q: %d vectors of %d dimensions; %d dimensions refused (%v)", target, len(vectors), dims, half, err)
		return nil
	case err != nil:
		return fmt.Errorf("an Embed call with dimensions %d on %q %s; want vectors of %d values, or kind unsupported or invalid_request for a model that cannot shorten them",
			half, target, outcomeText(err), half)
	}
	if n, err := sameLength(short, 1); err != nil || n != half {
		return fmt.Errorf("an Embed call with dimensions %d on %q answered vectors of %d values (%v); want %d", half, target, n, err, half)
	}
	s.Logf("%q: %d vectors of %d dimensions, and of %d on request", target, len(vectors), dims, half)
	return nil
}

// embed asks target for the embeddings of inputs and returns the vectors.
func (s *Session) embed(ctx context.Context, target string, inputs []string, dims int) ([][]float32, error) {
	res, err := s.Embed(ctx, &sdk.EmbedRequest{
		EmbedID:    s.newID("embed"),
		SessionID:  sessionID,
		Target:     target,
		Inputs:     inputs,
		Dimensions: dims,
	})
	if err != nil {
		return nil, err
	}
	return res.Vectors, nil
}

// sameLength checks that there are n vectors, all of one length above 0,
// and returns it.
func sameLength(vectors [][]float32, n int) (int, error) {
	if len(vectors) != n {
		return 0, fmt.Errorf("%d vectors for %d inputs; want one per input", len(vectors), n)
	}
	dims := len(vectors[0])
	for i, v := range vectors {
		if len(v) != dims || dims == 0 {
			return 0, fmt.Errorf("vector %d has %d values, vector 0 has %d; want one length above 0", i, len(v), dims)
		}
	}
	return dims, nil
}
