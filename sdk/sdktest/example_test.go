package sdktest_test

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/iop-dev/iop/sdk"
	"github.com/iop-dev/iop/sdk/sdktest"
)

// shout is the adapter under check: it answers with the user's last
// message in capitals, one word per event.
type shout struct{}

func (shout) Info() sdk.Info { return sdk.Info{Name: "shout", Version: "1.0.0"} }

func (shout) Configure(_ context.Context, cfg sdk.Config) error {
	return sdk.DecodeConfig(cfg, &struct{}{})
}

func (shout) Execute(ctx context.Context, req *sdk.Request, out sdk.EventSink) (*sdk.Result, error) {
	if len(req.Messages) == 0 {
		return nil, sdk.Errorf(sdk.KindInvalidRequest, "no messages")
	}
	words := strings.Fields(strings.ToUpper(req.Messages[len(req.Messages)-1].Content))
	for _, w := range words {
		if err := out.Send(ctx, sdk.Event{Kind: sdk.TextDelta, Text: w + " "}); err != nil {
			return nil, err
		}
	}
	return &sdk.Result{DoneReason: "stop", Usage: &sdk.Usage{CompletionTokens: int64(len(words))}}, nil
}

// An adapter's own check, written with the sdk's types only: the Session
// runs each request through the real plugin path, as the Node would, and
// hands back the events, the result and the adapter's errors (which keep
// their kind, so errors.Is works). VerifyChecks runs it and reports; in a
// test, RunChecks runs it as a subtest, beside the kit's checks or alone.
func ExampleCheck() {
	shouts := sdktest.Check{
		Name: "shouts",
		Doc:  "the answer is the user's message in capitals; a run without messages is an invalid request",
		Run: func(ctx context.Context, s *sdktest.Session) error {
			events, res, err := s.Execute(ctx, &sdk.Request{
				Target:   "any",
				Messages: []sdk.Message{{Role: "user", Content: "hello there"}},
			})
			if err != nil {
				return fmt.Errorf("the run failed: %w", err)
			}
			var answer strings.Builder
			for _, ev := range events {
				if ev.Kind == sdk.TextDelta {
					answer.WriteString(ev.Text)
				}
			}
			if got, want := answer.String(), "HELLO THERE "; got != want {
				return fmt.Errorf("the answer was %q; want %q", got, want)
			}
			s.Logf("%d text deltas, done reason %q, %d completion tokens", len(events), res.DoneReason, res.Usage.CompletionTokens)

			_, _, err = s.Execute(ctx, &sdk.Request{Target: "any"})
			if !errors.Is(err, sdk.ErrInvalidRequest) {
				return fmt.Errorf("a run without messages ended with %v; want kind invalid_request", err)
			}
			s.Logf("without messages: %v", err)
			return nil
		},
	}
	subject := sdktest.Subject{Adapter: func() sdk.Adapter { return shout{} }}
	for _, r := range sdktest.VerifyChecks(context.Background(), subject, sdktest.Options{}, shouts) {
		fmt.Printf("%s %s: %s\n", r.Status, r.Name, r.Message)
	}
	// Output:
	// PASS shouts: 2 text deltas, done reason "stop", 2 completion tokens; without messages: invalid_request: no messages
}
