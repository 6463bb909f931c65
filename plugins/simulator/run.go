package simulator

import (
	"context"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"time"

	"github.com/iop-dev/iop/sdk"
)

// vocabulary is the fixed word list of the simulated text. Never reorder
// it: the text of a request would change.
var vocabulary = [...]string{
	"the", "model", "edge", "node", "stream", "token", "answer", "quietly",
	"runs", "over", "a", "fast", "link", "and", "every", "event",
	"arrives", "in", "order", "with", "one", "terminal", "outcome", "while",
	"the", "watchdog", "keeps", "time", "for", "each", "provider", "call",
	"simulated", "words", "flow", "like", "water", "through", "small", "pipes",
	"under", "bright", "lights", "of", "a", "busy", "city", "tonight",
	"nothing", "here", "is", "real", "but", "the", "timing", "is",
	"exact", "so", "tests", "can", "trust", "it", "again", "today",
}

// Execute streams the simulated answer of req. Timing, from the call:
// after prefill_delay the reasoning (if any) and the first token are sent
// at once, then one token per token_interval; the tool call, the usage and
// the return follow the last token without delay. A stall or a failure
// replaces the token that would come next.
//
// The tool call follows Options.ToolChoice (see toolCall), the reasoning
// the run's reasoning options (see reasoning). Options.Extra is ignored:
// the simulator has no sampling for it to tune. The usage's prompt tokens
// are the prompt's count by CountTokens.
func (a *Adapter) Execute(ctx context.Context, req *sdk.Request, out sdk.EventSink) (*sdk.Result, error) {
	m, ok := a.models.Load().byName[req.Target]
	if !ok {
		return nil, sdk.Errorf(sdk.KindModelNotFound, "simulator: no model %q", req.Target)
	}
	if err := req.Options.ToolChoice.Check(req.Tools); err != nil {
		return nil, err
	}
	return m.generate(ctx, req, out, seedOf(req), promptTokens(req), true)
}

// Complete streams the simulated continuation of a raw completion's
// prompt, as Execute streams an answer, its text seeded by the target, the
// prompt, the suffix and the seed; it makes no tool call. A model with
// no_suffix refuses a suffix (no fill-in-the-middle) with KindUnsupported.
func (a *Adapter) Complete(ctx context.Context, req *sdk.Request, out sdk.EventSink) (*sdk.Result, error) {
	m, ok := a.models.Load().byName[req.Target]
	if !ok {
		return nil, sdk.Errorf(sdk.KindModelNotFound, "simulator: no model %q", req.Target)
	}
	if req.Suffix != "" && m.noSuffix {
		return nil, sdk.Errorf(sdk.KindUnsupported, "simulator: model %q does not fill in the middle (no_suffix)", req.Target)
	}
	return m.generate(ctx, req, out, hashOf(req.Target, req.Prompt+"\x00"+req.Suffix, req.Options.Seed), promptTokens(req), false)
}

// CountTokens counts req's prompt as the simulator reads it (promptTokens):
// the same count as the prompt tokens of the usage that running req
// reports, so that a test can check a count end to end.
func (a *Adapter) CountTokens(_ context.Context, req *sdk.Request) (int64, error) {
	if _, ok := a.models.Load().byName[req.Target]; !ok {
		return 0, sdk.Errorf(sdk.KindModelNotFound, "simulator: no model %q", req.Target)
	}
	return promptTokens(req), nil
}

// generate streams m's answer for req, its words drawn from seed, prompt
// its prompt's token count; a chat run (not a raw completion) makes its
// tool call.
func (m *model) generate(ctx context.Context, req *sdk.Request, out sdk.EventSink, seed uint64, prompt int64, chat bool) (*sdk.Result, error) {
	n, reason := m.tokens, "stop"
	if mt := req.Options.MaxTokens; mt != nil {
		if *mt < 0 {
			return nil, sdk.Errorf(sdk.KindInvalidRequest, "simulator: max tokens must not be negative")
		}
		if *mt < int64(n) {
			n, reason = int(*mt), "length"
		}
	}
	words := newWords(seed)

	if err := wait(ctx, m.prefill); err != nil {
		return nil, err
	}
	if r := m.reasoningFor(req.Options); r != "" {
		if err := out.Send(ctx, sdk.Event{Kind: sdk.ReasoningDelta, Text: r}); err != nil {
			return nil, err
		}
	}
	failAt, stallAt := -1, -1
	if m.fail != nil {
		failAt = min(m.fail.after, n)
	}
	if m.stallAfter > 0 {
		stallAt = min(m.stallAfter, n)
	}
	for i := 0; ; i++ {
		if i == failAt {
			return nil, &sdk.Error{Kind: m.fail.kind, Message: "simulator: " + m.fail.message}
		}
		if i == stallAt {
			// Stalled: emit nothing more; only the host can end the run.
			<-ctx.Done()
			return nil, fmt.Errorf("simulator: stalled run ended: %w", ctx.Err())
		}
		if i == n {
			break
		}
		if i > 0 {
			if err := wait(ctx, m.interval); err != nil {
				return nil, err
			}
		}
		if err := out.Send(ctx, sdk.Event{Kind: sdk.TextDelta, Text: words.token(i)}); err != nil {
			return nil, err
		}
	}
	if name, args := toolCall(m, req); chat && name != "" && reason != "length" {
		reason = "tool_calls"
		call := &sdk.ToolCall{Index: 0, ID: callID(req), Name: name, Arguments: args}
		if err := out.Send(ctx, sdk.Event{Kind: sdk.ToolCallDelta, ToolCall: call}); err != nil {
			return nil, err
		}
	}
	usage := sdk.Usage{PromptTokens: prompt, CompletionTokens: int64(n)}
	if err := out.Send(ctx, sdk.Event{Kind: sdk.UsageReport, Usage: &usage}); err != nil {
		return nil, err
	}
	final := usage
	return &sdk.Result{DoneReason: reason, Usage: &final}, nil
}

// toolCall returns the name and arguments of the call that m makes for
// req, or "" for none, by req's tool choice (SPEC P2):
//   - "" and auto: the model's configured call, if it has one;
//   - none: no call;
//   - required: the configured call, or else a call of the run's first
//     tool with {} as arguments;
//   - a named function: a call of it, with the configured arguments if the
//     configured call is of the same name, else {}.
//
// The choice has passed Check, so the named tool, or a first one, exists.
func toolCall(m *model, req *sdk.Request) (name, args string) {
	c := req.Options.ToolChoice
	if forced, ok := c.Function(); ok {
		if forced == m.toolName {
			return forced, m.toolArgs
		}
		return forced, "{}"
	}
	switch {
	case c == sdk.ToolChoiceNone:
		return "", ""
	case c == sdk.ToolChoiceRequired && m.toolName == "":
		return req.Tools[0].Name, "{}"
	}
	return m.toolName, m.toolArgs
}

// reasoningFor is the reasoning m sends for a run with options o: none
// when o asks the model not to think (Think false, or ReasoningEffort
// none); the configured reasoning after "[effort LEVEL] " when o names a
// level, so that a test sees which level reached the adapter; else the
// configured reasoning as it is.
func (m *model) reasoningFor(o sdk.Options) string {
	switch {
	case m.reasoning == "", o.ReasoningEffort == sdk.EffortNone, o.Think != nil && !*o.Think:
		return ""
	case o.ReasoningEffort != "":
		return "[effort " + o.ReasoningEffort + "] " + m.reasoning
	}
	return m.reasoning
}

// wait waits d, or returns the context's error when it ends first.
func wait(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("simulator: %w", err)
		}
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("simulator: %w", ctx.Err())
	}
}

// seedOf hashes what makes a request's text: target, last user message,
// and seed (0 when none).
func seedOf(req *sdk.Request) uint64 {
	var last string
	for i := len(req.Messages) - 1; i >= 0; i-- {
		if req.Messages[i].Role == "user" {
			last = req.Messages[i].Content
			break
		}
	}
	return hashOf(req.Target, last, req.Options.Seed)
}

// hashOf hashes target, text and seed (0 when none).
func hashOf(target, text string, seed *int64) uint64 {
	var s int64
	if seed != nil {
		s = *seed
	}
	h := fnv.New64a()
	h.Write([]byte(target))
	h.Write([]byte{0})
	h.Write([]byte(text))
	h.Write([]byte{0})
	h.Write([]byte(strconv.FormatInt(s, 10)))
	return h.Sum64()
}

func callID(req *sdk.Request) string {
	return fmt.Sprintf("call_%016x", seedOf(req))
}

// words draws vocabulary words with splitmix64, a generator written out
// here so that the text never changes with the Go version.
type words struct{ state uint64 }

func newWords(seed uint64) *words { return &words{state: seed} }

func (w *words) next() uint64 {
	w.state += 0x9e3779b97f4a7c15
	z := w.state
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// token returns the i-th token: the next word, with a leading space after
// the first. Tokens are drawn in order, one call per i.
func (w *words) token(i int) string {
	word := vocabulary[w.next()%uint64(len(vocabulary))]
	if i == 0 {
		return strings.ToUpper(word[:1]) + word[1:]
	}
	return " " + word
}

// promptTokens is the simulator's tokenization of req's prompt: one token
// a word (a run of non-space characters) of its text, which is every
// message's content and reasoning, each tool call's name and arguments,
// each tool's name, description and parameters (as their JSON text), and
// a raw completion's prompt and suffix. Images and the roles count
// nothing.
func promptTokens(req *sdk.Request) int64 {
	var n int
	words := func(s string) { n += len(strings.Fields(s)) }
	for _, m := range req.Messages {
		words(m.Content)
		words(m.Reasoning)
		for _, tc := range m.ToolCalls {
			words(tc.Name)
			words(tc.Arguments)
		}
	}
	for _, t := range req.Tools {
		words(t.Name)
		words(t.Description)
		words(string(t.Parameters))
	}
	words(req.Prompt)
	words(req.Suffix)
	return int64(n)
}
