package simulator_test

import (
	"encoding/json"
	"errors"
	"slices"
	"testing"

	"github.com/iop-dev/iop/plugins/simulator"
	"github.com/iop-dev/iop/sdk"
)

// Issue 21: the simulator counts a prompt one token a word of its text
// (contents, reasoning, tool calls, tools; a raw completion's prompt and
// suffix), and its runs report the same count as their prompt tokens, so
// a count is exact end to end.
func TestCountTokensIsTheRunsPromptCount(t *testing.T) {
	a := adapter(t, `{"models":[{"name":"m","tokens":2,"token_interval":"0s"}]}`)
	chat := &sdk.Request{Target: "m",
		Messages: []sdk.Message{
			{Role: "system", Content: "be kind"},                                   // 2
			{Role: "user", Content: "  what is\nthis? ", Images: [][]byte{{1, 2}}}, // 3
			{Role: "assistant", Reasoning: "look at it", ToolCalls: []sdk.ToolCall{ // 3
				{ID: "c1", Name: "look", Arguments: `{"x": 1}`}}}, // 1 + 2
			{Role: "tool", ToolCallID: "c1", Content: "a cat"}, // 2
		},
		Tools: []sdk.Tool{{Name: "look", Description: "looks at a thing", // 1 + 4
			Parameters: json.RawMessage(`{"type": "object"}`)}}, // 2
	}
	raw := &sdk.Request{Target: "m", Prompt: "def add(a, b):", Suffix: "print(add(1, 2))"} // 3 + 2
	for _, tt := range []struct {
		name string
		req  *sdk.Request
		run  func(*sdk.Request, sdk.EventSink) (*sdk.Result, error)
		want int64
	}{
		{"chat", chat, func(r *sdk.Request, s sdk.EventSink) (*sdk.Result, error) { return a.Execute(t.Context(), r, s) }, 20},
		{"raw completion", raw, func(r *sdk.Request, s sdk.EventSink) (*sdk.Result, error) { return a.Complete(t.Context(), r, s) }, 5},
	} {
		n, err := a.CountTokens(t.Context(), tt.req)
		if err != nil || n != tt.want {
			t.Errorf("%s: count %d, %v; want %d", tt.name, n, err, tt.want)
		}
		res, err := tt.run(tt.req, newSink())
		if err != nil || res.Usage.PromptTokens != n {
			t.Errorf("%s: the run's prompt tokens %+v, %v; want the count %d", tt.name, res.Usage, err, n)
		}
	}
	if _, err := a.CountTokens(t.Context(), &sdk.Request{Target: "nope"}); !errors.Is(err, sdk.ErrModelNotFound) {
		t.Errorf("an unknown model: %v", err)
	}
	if caps := sdk.Capabilities(simulator.New()); !slices.Contains(caps, sdk.CapCountTokens) {
		t.Errorf("capabilities %v", caps)
	}
}

// Issue 21: the run's reasoning options shape the simulated reasoning: a
// level marks it, so that a test sees which level reached the adapter; no
// thinking (effort none, or Think false) leaves it out.
func TestReasoningFollowsTheRunsEffort(t *testing.T) {
	a := adapter(t, `{"models":[{"name":"thinker","tokens":1,"reasoning":"hmm"},{"name":"plain","tokens":1}]}`)
	on, off := true, false
	for _, tt := range []struct {
		model  string
		effort string
		think  *bool
		want   string
	}{
		{"thinker", "", nil, "hmm"},
		{"thinker", "", &on, "hmm"},
		{"thinker", "", &off, ""},
		{"thinker", sdk.EffortNone, &off, ""},
		{"thinker", sdk.EffortLow, &on, "[effort low] hmm"},
		{"thinker", sdk.EffortMax, nil, "[effort max] hmm"},
		{"plain", sdk.EffortHigh, &on, ""},
	} {
		req := run(tt.model, "hi")
		req.Options.ReasoningEffort, req.Options.Think = tt.effort, tt.think
		s := newSink()
		if _, err := a.Execute(t.Context(), req, s); err != nil {
			t.Fatal(err)
		}
		got := ""
		evs, _ := s.snapshot()
		for _, ev := range evs {
			if ev.Kind == sdk.ReasoningDelta {
				got += ev.Text
			}
		}
		if got != tt.want {
			t.Errorf("%s, effort %q: reasoning %q, want %q", tt.model, tt.effort, got, tt.want)
		}
	}
}
