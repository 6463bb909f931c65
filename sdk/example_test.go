package sdk_test

import (
	"context"
	"fmt"
	"strings"

	"github.com/iop-dev/iop/internal/pluginhost"
	"github.com/iop-dev/iop/quicwire/wirepb"
	"github.com/iop-dev/iop/sdk"
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

// An adapter, and the Node's view of it: the host runs it (here in
// process, over the same gRPC path as a plugin process), configures it and
// relays its events.
func Example_echoAdapter() {
	ctx := context.Background()
	p, err := pluginhost.StartInProcess(ctx, &echo{})
	if err != nil {
		panic(err)
	}
	defer p.Close(ctx)
	fmt.Println(p.Info().Name, p.Capabilities())

	if err := p.Configure(ctx, sdk.Config(`{"prefx": "> "}`)); err != nil {
		fmt.Println("configure:", err)
	}
	if err := p.Configure(ctx, sdk.Config(`{"prefix": "> "}`)); err != nil {
		panic(err)
	}

	req := &wirepb.RunRequest{RunId: "run-1", Target: "any", Messages: []*wirepb.ChatMessage{{Role: "user", Content: "hello there"}}}
	term, err := p.Execute(ctx, req, nil, func(ev *wirepb.RunEvent) error {
		fmt.Printf("event %d %v %q\n", ev.GetSeq(), ev.GetType(), ev.GetText())
		return nil
	})
	if err != nil {
		panic(err)
	}
	res, err := pluginhost.ResultOf(term)
	if err != nil {
		panic(err)
	}
	fmt.Println("done:", res.DoneReason, res.Usage.CompletionTokens, "tokens")

	term, err = p.Execute(ctx, &wirepb.RunRequest{RunId: "run-2"}, nil, func(*wirepb.RunEvent) error { return nil })
	if err == nil {
		_, err = pluginhost.ResultOf(term)
	}
	fmt.Println("invalid request:", err)
	// Output:
	// echo []
	// configure: invalid_request: config: json: unknown field "prefx"
	// event 1 RUN_EVENT_TYPE_TEXT_DELTA "> "
	// event 2 RUN_EVENT_TYPE_TEXT_DELTA "hello "
	// event 3 RUN_EVENT_TYPE_TEXT_DELTA "there "
	// done: stop 3 tokens
	// invalid request: invalid_request: no messages
}
