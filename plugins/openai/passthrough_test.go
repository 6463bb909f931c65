package openai_test

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/iop-dev/iop/internal/fakes/fakeopenai"
	"github.com/iop-dev/iop/sdk"
)

// recordedBody runs req against a fake server and returns the body the
// server received, decoded.
func recordedBody(t *testing.T, req *sdk.Request) map[string]json.RawMessage {
	t.Helper()
	s := startFake(t, fakeopenai.Config{Models: []fakeopenai.Model{{Name: "m"}}})
	if _, err := configured(t, s.BaseURL()).Execute(t.Context(), req, &sink{}); err != nil {
		t.Fatal(err)
	}
	var body map[string]json.RawMessage
	if err := json.Unmarshal(s.Requests()[0].Body, &body); err != nil {
		t.Fatal(err)
	}
	return body
}

// P2: the fields the Edge does not interpret reach the model server as
// the client sent them; a normalized option wins over the same name.
func TestExtraFieldsReachTheServer(t *testing.T) {
	req := userRun("m", "hi")
	req.Options.Temperature = ptr(0.5)
	req.Options.Extra = json.RawMessage(`{"top_k":20,"min_p":0.05,"temperature":1.9,` +
		`"chat_template_kwargs":{"enable_thinking":false},"x_vendor":{"a":[1,"b"]}}`)
	body := recordedBody(t, req)
	want := map[string]string{
		"top_k": `20`, "min_p": `0.05`, "temperature": `0.5`,
		"chat_template_kwargs": `{"enable_thinking":false}`, "x_vendor": `{"a":[1,"b"]}`,
	}
	for k, v := range want {
		if got := string(body[k]); got != v {
			t.Errorf("%s = %s, want %s", k, got, v)
		}
	}
}

// P2: tool_choice reaches the server in OpenAI's form, and only with tools.
func TestToolChoiceReachesTheServerInOpenAIsForm(t *testing.T) {
	tools := []sdk.Tool{{Name: "get_weather", Parameters: json.RawMessage(`{"type":"object"}`)}}
	tests := []struct {
		name   string
		choice sdk.ToolChoice
		tools  []sdk.Tool
		want   string // "" for no tool_choice in the body
	}{
		{"unset", "", tools, ""},
		{"auto", sdk.ToolChoiceAuto, tools, `"auto"`},
		{"none", sdk.ToolChoiceNone, tools, `"none"`},
		{"required", sdk.ToolChoiceRequired, tools, `"required"`},
		{"a named function", sdk.ToolChoiceFunction("get_weather"), tools, `{"function":{"name":"get_weather"},"type":"function"}`},
		{"none without tools is not sent: OpenAI refuses tool_choice without tools", sdk.ToolChoiceNone, nil, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := userRun("m", "hi")
			req.Tools, req.Options.ToolChoice = tt.tools, tt.choice
			if got := string(recordedBody(t, req)["tool_choice"]); got != tt.want {
				t.Errorf("tool_choice %s, want %s", got, tt.want)
			}
		})
	}
}

// P2: a tool choice that cannot be honoured is refused before the call.
func TestImpossibleToolChoiceIsRefusedBeforeTheCall(t *testing.T) {
	s := startFake(t, fakeopenai.Config{Models: []fakeopenai.Model{{Name: "m"}}})
	a := configured(t, s.BaseURL())
	tools := []sdk.Tool{{Name: "get_weather"}}
	for _, tt := range []struct {
		choice sdk.ToolChoice
		tools  []sdk.Tool
	}{
		{sdk.ToolChoiceRequired, nil},
		{sdk.ToolChoiceFunction("get_weather"), nil},
		{sdk.ToolChoiceFunction("send_mail"), tools},
		{"any", tools},
	} {
		req := userRun("m", "hi")
		req.Tools, req.Options.ToolChoice = tt.tools, tt.choice
		if _, err := a.Execute(t.Context(), req, &sink{}); !errors.Is(err, sdk.ErrInvalidRequest) {
			t.Errorf("%q with %d tools: err = %v, want invalid_request", tt.choice, len(tt.tools), err)
		}
	}
	if n := len(s.Requests()); n != 0 {
		t.Errorf("the server received %d requests", n)
	}
}

// P2, issue 21: the run's reasoning effort reaches the server as
// reasoning_effort, each level under its own name but max, sent as xhigh
// (the top level OpenAI, vLLM and Ollama share); Think alone sends nothing;
// the normalized effort wins over Extra's; an unknown level is refused
// before the call.
func TestReasoningEffortReachesTheServer(t *testing.T) {
	tests := []struct {
		effort string
		extra  string
		want   string // reasoning_effort sent, "" for none
	}{
		{"", "", ""},
		{sdk.EffortNone, "", `"none"`},
		{sdk.EffortMinimal, "", `"minimal"`},
		{sdk.EffortLow, "", `"low"`},
		{sdk.EffortMedium, "", `"medium"`},
		{sdk.EffortHigh, "", `"high"`},
		{sdk.EffortMax, "", `"xhigh"`},
		{sdk.EffortLow, `{"reasoning_effort":"high"}`, `"low"`},
		{"", `{"reasoning_effort":"high"}`, `"high"`},
	}
	for _, tt := range tests {
		req := userRun("m", "hi")
		req.Options.ReasoningEffort, req.Options.Think, req.Options.Extra = tt.effort, ptr(tt.effort != sdk.EffortNone), json.RawMessage(tt.extra)
		if got := string(recordedBody(t, req)["reasoning_effort"]); got != tt.want {
			t.Errorf("effort %q, extra %s: reasoning_effort %s, want %s", tt.effort, tt.extra, got, tt.want)
		}
	}

	s := startFake(t, fakeopenai.Config{Models: []fakeopenai.Model{{Name: "m"}}})
	req := userRun("m", "hi")
	req.Options.ReasoningEffort = "extreme"
	if _, err := configured(t, s.BaseURL()).Execute(t.Context(), req, &sink{}); !errors.Is(err, sdk.ErrInvalidRequest) {
		t.Errorf("an unknown effort: %v", err)
	}
	if n := len(s.Requests()); n != 0 {
		t.Errorf("the server received %d requests", n)
	}
}
