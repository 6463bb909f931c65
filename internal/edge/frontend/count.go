package frontend

import (
	"context"
	"errors"
	"unicode/utf8"

	"github.com/iop-dev/iop/internal/edge/dispatch"
	"github.com/iop-dev/iop/internal/edge/inflight"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// TokenCountHeader says how a token count was made: "exact" (the model
// server's own tokenizer, through an adapter with the count_tokens
// capability) or "estimate" (the Edge's, when no candidate can tokenize).
const TokenCountHeader = "X-IOP-Token-Count"

// CountJob counts the tokens of a request's prompt (Anthropic's
// /v1/messages/count_tokens): exactly, on a candidate whose adapter
// tokenizes; else estimated by the Edge, and said so in TokenCountHeader.
// Out writes the answer whole.
type CountJob struct {
	Run *wirepb.RunRequest
	Out func(resp *Response, tokens int64) bool
}

func (*CountJob) kind() inflight.Kind      { return inflight.Run }
func (*CountJob) fail(*Response, *Failure) {} // the count is sent whole
func (*CountJob) writer() any              { return nil }

// count runs j: a run that counts, read to its terminal.
func (l *life) count(ctx context.Context, plan *dispatch.Plan, j *CountJob, watch dispatch.Watch) *Failure {
	x := l.x
	j.Run.CountTokens = true // the job's own request
	exact := "exact"
	var tokens int64
	run, err := l.f.d.StartRun(ctx, plan, j.Run, watch)
	switch {
	case errors.Is(err, dispatch.ErrUnsupported):
		// No candidate tokenizes: the Edge estimates.
		tokens, exact = EstimateTokens(j.Run), "estimate"
	case err != nil:
		return StartFailure(err, context.Cause(ctx), plan.Model)
	default:
		defer run.Close()
		x.Attach(run)
		l.id, l.node, l.choice = run.ID(), run.Node().NodeID, string(run.Node().Choice)
		for {
			ev, err := run.Next()
			if err != nil {
				return TunnelFailure(err, x.Why()) // a run that ended without a terminal: protocol
			}
			if u := ev.GetUsage(); u != nil {
				tokens = u.GetPromptTokens()
			}
			t := ev.GetType()
			if t == wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED {
				break
			}
			if t.IsTerminal() {
				if ev.GetFailure().GetKind() == wirepb.FailureKind_FAILURE_KIND_UNSUPPORTED {
					// The adapter tokenizes through its server, and this
					// one cannot: the Edge estimates.
					tokens, exact = EstimateTokens(j.Run), "estimate"
					break
				}
				return RunFailure(ev, x.Why())
			}
		}
	}
	x.w.Header().Set(TokenCountHeader, exact)
	if !j.Out(l.resp, tokens) {
		return FailClientGone
	}
	return nil
}

// EstimateTokens is the Edge's estimate of how many tokens a model reads
// for req, when no provider can tokenize it: about four characters of
// text a token (the rule of thumb of BPE tokenizers on English and code;
// JSON counts by the byte), plus a few for each message's framing and a
// flat cost per image. It is a guide for a client managing its context,
// not a bill.
func EstimateTokens(req *wirepb.RunRequest) int64 {
	const (
		charsPerToken = 4
		perMessage    = 4
		perImage      = 765 // what one tile of a typical vision model costs
	)
	var text, extra int64
	add := func(s string) { text += int64(utf8.RuneCountInString(s)) }
	addBytes := func(b []byte) { text += int64(len(b)) }
	for _, m := range req.GetMessages() {
		extra += perMessage
		add(m.GetContent())
		add(m.GetReasoning())
		for _, tc := range m.GetToolCalls() {
			add(tc.GetName())
			addBytes(tc.GetArgumentsJson())
		}
		extra += int64(len(m.GetImages())) * perImage
	}
	for _, t := range req.GetTools() {
		add(t.GetName())
		add(t.GetDescription())
		addBytes(t.GetParametersJson())
	}
	if c := req.GetCompletion(); c != nil {
		add(c.GetPrompt())
		add(c.GetSuffix())
	}
	return (text+charsPerToken-1)/charsPerToken + extra
}
