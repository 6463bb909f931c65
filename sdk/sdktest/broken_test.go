package sdktest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/iop-dev/iop/internal/testadapter"
	"github.com/iop-dev/iop/sdk"
)

// Deliberately broken adapters: each is the test adapter with one thing
// wrong, which one check must catch.

// liar reports the probe capability (it implements Prober) but does not
// really probe.
type liar struct{ *testadapter.Adapter }

func (liar) Probe(context.Context, string) (sdk.Health, error) {
	return sdk.Health{}, &sdk.Error{Kind: sdk.KindUnsupported, Message: "probing is not implemented yet"}
}

// ignoresCancel keeps running a "slow" run after its ctx is done, until
// released (or 10 s have passed).
type ignoresCancel struct {
	*testadapter.Adapter
	release <-chan struct{}
}

func (a ignoresCancel) Execute(ctx context.Context, req *sdk.Request, out sdk.EventSink) (*sdk.Result, error) {
	if req.Target != "slow" {
		return a.Adapter.Execute(ctx, req, out)
	}
	_ = out.Send(ctx, sdk.Event{Kind: sdk.TextDelta, Text: "zzz"})
	select { // not ctx.Done(): the bug under test
	case <-a.release:
	case <-time.After(10 * time.Second):
	}
	return &sdk.Result{DoneReason: "stop"}, nil
}

// looseConfig decodes its configuration without rejecting unknown keys.
type looseConfig struct{ *testadapter.Adapter }

func (a looseConfig) Configure(ctx context.Context, raw sdk.Config) error {
	var cfg testadapter.Config
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &cfg); err != nil {
			return sdk.Errorf(sdk.KindInvalidRequest, "config: %v", err)
		}
	}
	return a.Adapter.Configure(ctx, sdk.MustConfig(cfg))
}

// printsToStdout prints a debug line to stdout on every run.
type printsToStdout struct{ *testadapter.Adapter }

func (a printsToStdout) Execute(ctx context.Context, req *sdk.Request, out sdk.EventSink) (*sdk.Result, error) {
	fmt.Println("debug: starting run", req.RunID)
	return a.Adapter.Execute(ctx, req, out)
}

// wrong404 maps the server's 404 for a missing model to upstream, not to
// model_not_found.
type wrong404 struct{ *testadapter.Adapter }

func (a wrong404) Execute(ctx context.Context, req *sdk.Request, out sdk.EventSink) (*sdk.Result, error) {
	if req.Target == "missing" {
		return nil, &sdk.Error{Kind: sdk.KindUpstream, UpstreamStatus: 404, Message: `upstream 404: model "missing" not found`}
	}
	return a.Adapter.Execute(ctx, req, out)
}

// ignoresToolChoice runs every request as if it had no tool choice.
type ignoresToolChoice struct{ *testadapter.Adapter }

func (a ignoresToolChoice) Execute(ctx context.Context, req *sdk.Request, out sdk.EventSink) (*sdk.Result, error) {
	req.Options.ToolChoice = ""
	return a.Adapter.Execute(ctx, req, out)
}

// ignoresDimensions embeds every call at the model's own length, whatever
// its dimensions ask.
type ignoresDimensions struct{ *testadapter.Adapter }

func (a ignoresDimensions) Embed(ctx context.Context, req *sdk.EmbedRequest) (*sdk.EmbedResult, error) {
	req.Dimensions = 0
	return a.Adapter.Embed(ctx, req)
}

// brokenBinaries are the broken adapters the test binary serves as plugin
// processes, by the name in brokenEnv.
var brokenBinaries = map[string]func() sdk.Adapter{
	"stdout": func() sdk.Adapter { return printsToStdout{testadapter.New()} },
}
