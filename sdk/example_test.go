package sdk_test

import (
	"context"
	"fmt"
	"strings"

	"github.com/iop-dev/iop/sdk"
	"github.com/iop-dev/iop/sdk/sdktest"
)

// echo is a complete adapter: it answers with the last user message, one
// word per event. Its program's main is one line:
//
//	func main() { sdk.Serve(&echo{}) }
type echo struct {
	cfg struct {
		Prefix string `json:"prefix"`
	}
}

func (e *echo) Info() sdk.Info {
	return sdk.Info{
		Name:         "echo",
		Version:      "1.0.0",
		Description:  "answers with what it was told",
		ConfigFields: map[string]string{"prefix": "text put before the answer"},
	}
}

// Configure rejects unknown keys: a typo in the Node's config fails here.
func (e *echo) Configure(_ context.Context, cfg sdk.Config) error {
	return sdk.DecodeConfig(cfg, &e.cfg)
}

// Execute sends the run's progress to out and returns its one outcome.
func (e *echo) Execute(ctx context.Context, req *sdk.Request, out sdk.EventSink) (*sdk.Result, error) {
	if len(req.Messages) == 0 {
		return nil, sdk.Errorf(sdk.KindInvalidRequest, "no messages")
	}
	// A tool choice the adapter cannot honour fails the run; it is never
	// ignored.
	if err := req.Options.ToolChoice.Check(req.Tools); err != nil {
		return nil, err
	}
	words := strings.Fields(e.cfg.Prefix + req.Messages[len(req.Messages)-1].Content)
	for _, w := range words {
		// Send fails with sdk.ErrHostGone once the run is cancelled:
		// return, and the Node ends the run.
		if err := out.Send(ctx, sdk.Event{Kind: sdk.TextDelta, Text: w + " "}); err != nil {
			return nil, err
		}
	}
	usage := &sdk.Usage{PromptTokens: int64(len(words)), CompletionTokens: int64(len(words))}
	return &sdk.Result{DoneReason: "stop", Usage: usage}, nil
}

// An adapter, checked as its own tests would check it: the conformance kit
// runs it over the same gRPC path the Node uses for a plugin process and
// reports each check (the skipped ones say what they need: a slow target
// to cancel, a target the server lacks, a built binary). In a test,
// sdktest.Run does the same with a subtest per check; a built adapter
// program is checked with `noded adapter verify ./echo`.
func Example_echoAdapter() {
	subject := sdktest.Subject{Adapter: func() sdk.Adapter { return &echo{} }}
	opts := sdktest.Options{Config: sdk.Config(`{"prefix": "> "}`), Target: "any"}
	for _, r := range sdktest.Verify(context.Background(), subject, opts) {
		fmt.Println(r.Status, r.Name)
	}
	// Output:
	// PASS describe
	// PASS strict_config
	// PASS honest_capabilities
	// PASS ordering
	// SKIP cancel
	// SKIP error_mapping
	// PASS tool_choice
	// PASS complete
	// PASS embed
	// PASS concurrency
	// PASS restart
	// SKIP no_stdout
}
