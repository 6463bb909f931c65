package simulator_test

import (
	"errors"
	"testing"

	"github.com/iop-dev/iop/sdk"
)

// P2: the simulator honours tool_choice: none makes no call, auto makes
// the model's configured one, required and a named function force one.
func TestToolChoiceShapesTheCall(t *testing.T) {
	const cfg = `{"models":[{"name":"caller","tokens":1,"tool_call":{"name":"get_weather","arguments":{"city":"Seoul"}}},` +
		`{"name":"quiet","tokens":1}]}`
	a := adapter(t, cfg)
	tools := []sdk.Tool{{Name: "get_weather"}, {Name: "send_mail"}}
	tests := []struct {
		model  string
		choice sdk.ToolChoice
		want   string // name(arguments) of the call, "" for none
	}{
		{"caller", "", `get_weather({"city":"Seoul"})`},
		{"caller", sdk.ToolChoiceAuto, `get_weather({"city":"Seoul"})`},
		{"caller", sdk.ToolChoiceNone, ""},
		{"caller", sdk.ToolChoiceRequired, `get_weather({"city":"Seoul"})`},
		{"caller", sdk.ToolChoiceFunction("get_weather"), `get_weather({"city":"Seoul"})`},
		{"caller", sdk.ToolChoiceFunction("send_mail"), `send_mail({})`},
		{"quiet", "", ""},
		{"quiet", sdk.ToolChoiceRequired, `get_weather({})`},
		{"quiet", sdk.ToolChoiceFunction("send_mail"), `send_mail({})`},
	}
	for _, tt := range tests {
		req := run(tt.model, "hi")
		req.Tools, req.Options.ToolChoice = tools, tt.choice
		s := newSink()
		res, err := a.Execute(t.Context(), req, s)
		if err != nil {
			t.Fatalf("%s %q: %v", tt.model, tt.choice, err)
		}
		got, reason := "", "stop"
		evs, _ := s.snapshot()
		for _, ev := range evs {
			if ev.Kind == sdk.ToolCallDelta {
				got, reason = ev.ToolCall.Name+"("+ev.ToolCall.Arguments+")", "tool_calls"
			}
		}
		if got != tt.want || res.DoneReason != reason {
			t.Errorf("%s %q: call %q (%s), want %q", tt.model, tt.choice, got, res.DoneReason, tt.want)
		}
	}
	req := run("caller", "hi")
	req.Options.ToolChoice = sdk.ToolChoiceRequired // and no tools
	if _, err := a.Execute(t.Context(), req, newSink()); !errors.Is(err, sdk.ErrInvalidRequest) {
		t.Errorf("required without tools: %v", err)
	}
}
