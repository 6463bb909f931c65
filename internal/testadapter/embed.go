package testadapter

import (
	"context"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"

	"github.com/iop-dev/iop/sdk"
)

var (
	_ sdk.Completer = (*Adapter)(nil)
	_ sdk.Embedder  = (*Adapter)(nil)
)

// Complete runs a raw completion. Its Target is a script, as for Execute:
//
//	text:N     N text deltas "<prompt>0".."<prompt>N-1" (the prompt's first
//	           word), then "|<suffix>" when there is a suffix; usage; done "stop"
//	nofim      as text:2, but a suffix fails it with KindUnsupported
//	fail:KIND, panic, sleep  as for Execute
func (a *Adapter) Complete(ctx context.Context, req *sdk.Request, out sdk.EventSink) (*sdk.Result, error) {
	if len(req.Messages) > 0 || len(req.Tools) > 0 {
		return nil, sdk.Errorf(sdk.KindInternal, "a raw completion came with messages or tools")
	}
	script, arg, _ := strings.Cut(req.Target, ":")
	switch script {
	case "nofim":
		if req.Suffix != "" {
			return nil, sdk.Errorf(sdk.KindUnsupported, "scripted: no fill-in-the-middle")
		}
		script, arg = "text", "2"
	case "text":
	default:
		return a.Execute(ctx, req, out)
	}
	n, _ := strconv.Atoi(arg)
	word, _, _ := strings.Cut(strings.TrimSpace(req.Prompt), " ")
	for i := range n {
		if err := out.Send(ctx, sdk.Event{Kind: sdk.TextDelta, Text: fmt.Sprintf("%s%d", word, i)}); err != nil {
			return nil, err
		}
	}
	if req.Suffix != "" {
		if err := out.Send(ctx, sdk.Event{Kind: sdk.TextDelta, Text: "|" + req.Suffix}); err != nil {
			return nil, err
		}
	}
	usage := &sdk.Usage{PromptTokens: int64(len(strings.Fields(req.Prompt))), CompletionTokens: int64(n)}
	return &sdk.Result{DoneReason: "stop", Usage: usage}, nil
}

// DefaultDimensions is the length of the test adapter's vectors when a
// call asks for none.
const DefaultDimensions = 4

// Embed answers a call by its Target's script:
//
//	text:N (any target of Execute's text script), embed  one vector per
//	           input, of Dimensions (default DefaultDimensions) values
//	           derived from the input's text (Vector)
//	wide:D     vectors of D values, whatever Dimensions says
//	short      one vector fewer than the inputs
//	fail:KIND, panic, sleep  as for Execute
func (a *Adapter) Embed(ctx context.Context, req *sdk.EmbedRequest) (*sdk.EmbedResult, error) {
	a.active.Add(1)
	defer a.active.Add(-1)
	dims := req.Dimensions
	if dims == 0 {
		dims = DefaultDimensions
	}
	script, arg, _ := strings.Cut(req.Target, ":")
	switch script {
	case "text", "embed":
	case "wide":
		dims, _ = strconv.Atoi(arg)
	case "short":
		return &sdk.EmbedResult{Vectors: make([][]float32, len(req.Inputs)-1)}, nil
	case "fail":
		return nil, ScriptedError(arg)
	case "panic":
		panic("scripted embed panic")
	case "sleep":
		<-ctx.Done()
		a.cancelled.Add(1)
		return nil, ctx.Err()
	default:
		return nil, sdk.Errorf(sdk.KindModelNotFound, "no script %q", req.Target)
	}
	res := &sdk.EmbedResult{Usage: &sdk.Usage{PromptTokens: int64(len(req.Inputs))}}
	for _, in := range req.Inputs {
		res.Vectors = append(res.Vectors, Vector(in, dims))
	}
	return res, nil
}

// Vector is the test adapter's embedding of text: dims values in (0, 1],
// from a hash of the text and the value's index.
func Vector(text string, dims int) []float32 {
	v := make([]float32, dims)
	for i := range v {
		h := fnv.New32a()
		fmt.Fprintf(h, "%d:%s", i, text)
		v[i] = float32(h.Sum32()%1000+1) / 1000
	}
	return v
}
