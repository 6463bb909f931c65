package openaiapi

import (
	"encoding/base64"
	"net/http"
	"strings"
	"testing"

	ft "github.com/iop-dev/iop/internal/edge/frontend/frontendtest"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/iop-dev/iop/quicwire/wirepb"
)

// started runs body against a runner that completes at once and returns
// the run request the runner was given.
func started(t *testing.T, body string) *wirepb.RunRequest {
	t.Helper()
	e := newEnv(t, &ft.Dispatcher{Events: []ft.Step{ft.Completed("stop")}})
	w := e.do(chatReq(body))
	if w.Code != http.StatusOK {
		t.Fatalf("status %d: %s", w.Code, w.Body)
	}
	if len(e.runner.RunRequests()) != 1 {
		t.Fatalf("%d runs started", len(e.runner.RunRequests()))
	}
	return e.runner.RunRequests()[0]
}

func TestRequestBecomesRunRequest(t *testing.T) {
	png := []byte("\x89PNG fake")
	dataURL := "data:image/png;base64," + base64.StdEncoding.EncodeToString(png)
	f := func(v float64) *float64 { return &v }
	i := func(v int64) *int64 { return &v }
	b := func(v bool) *bool { return &v }
	tests := []struct {
		name string
		body string
		want *wirepb.RunRequest
	}{
		{"a conversation with tools, images and every option", `{
			"model": "m1",
			"messages": [
				{"role": "developer", "content": "be brief"},
				{"role": "user", "content": [
					{"type": "text", "text": "what is this?"},
					{"type": "image_url", "image_url": {"url": "` + dataURL + `", "detail": "low"}},
					{"type": "text", "text": "and the weather?"}]},
				{"role": "assistant", "content": null, "reasoning_content": "they want weather",
				 "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Seoul\"}"}}]},
				{"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "sunny"}
			],
			"tools": [{"type": "function", "function": {"name": "get_weather", "description": "weather now",
				"parameters": {"type":"object","properties":{"city":{"type":"string"}}}, "strict": true}}],
			"tool_choice": "auto", "parallel_tool_calls": false, "user": "u-1", "logit_bias": {"50256": -100},
			"temperature": 0.2, "top_p": 0.9, "max_tokens": 10, "max_completion_tokens": 20,
			"stop": ["END", "STOP"], "seed": 7, "reasoning_effort": "low",
			"response_format": {"type": "json_object"}
		}`, &wirepb.RunRequest{
			Messages: []*wirepb.ChatMessage{
				{Role: "system", Content: "be brief"},
				{Role: "user", Content: "what is this?\nand the weather?", Images: [][]byte{png}},
				{Role: "assistant", Reasoning: "they want weather", ToolCalls: []*wirepb.ToolCall{
					{Index: 0, Id: "call_1", Name: "get_weather", ArgumentsJson: []byte(`{"city":"Seoul"}`)}}},
				{Role: "tool", ToolCallId: "call_1", Name: "get_weather", Content: "sunny"},
			},
			Tools: []*wirepb.Tool{{Name: "get_weather", Description: "weather now",
				ParametersJson: []byte(`{"type":"object","properties":{"city":{"type":"string"}}}`)}},
			Options: &wirepb.RunOptions{Temperature: f(0.2), TopP: f(0.9), MaxTokens: i(20),
				Stop: []string{"END", "STOP"}, Seed: i(7), Format: []byte("json"), Think: b(true), ReasoningEffort: "low", ToolChoice: "auto",
				// P2: what the Edge does not interpret travels with the run.
				ExtraJson: []byte(`{"logit_bias":{"50256":-100},"parallel_tool_calls":false,"user":"u-1"}`)},
		}},
		{"a bare request", `{"model":"m1","messages":[{"role":"user","content":"hi"}]}`,
			&wirepb.RunRequest{Messages: []*wirepb.ChatMessage{{Role: "user", Content: "hi"}}, Options: &wirepb.RunOptions{}}},
		{"stop as a string, max_tokens alone, a json schema, no thinking", `{"model":"m1","messages":[{"role":"user","content":"hi"}],
			"stop":"END","max_tokens":5,"reasoning_effort":"none",
			"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"object"},"strict":true}}}`,
			&wirepb.RunRequest{Messages: []*wirepb.ChatMessage{{Role: "user", Content: "hi"}},
				Options: &wirepb.RunOptions{Stop: []string{"END"}, MaxTokens: i(5), Think: b(false), ReasoningEffort: "none",
					Format: []byte(`{"type":"object"}`), FormatName: "x", FormatStrict: true}}},
		{"text response format and nulls", `{"model":"m1","messages":[{"role":"user","content":"hi"}],
			"stop":null,"response_format":{"type":"text"},"temperature":null,"tools":[]}`,
			&wirepb.RunRequest{Messages: []*wirepb.ChatMessage{{Role: "user", Content: "hi"}}, Options: &wirepb.RunOptions{}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := started(t, tt.body)
			if !proto.Equal(got, tt.want) {
				t.Errorf("\n got %s\nwant %s", protojson.Format(got), protojson.Format(tt.want))
			}
		})
	}
}

func TestInvalidRequestsName400Param(t *testing.T) {
	msgs := `"messages":[{"role":"user","content":"hi"}]`
	tests := []struct {
		name  string
		body  string
		param string
	}{
		{"not JSON", `{"model":`, ""},
		{"wrong type", `{"model":1,` + msgs + `}`, "model"},
		{"no model", `{` + msgs + `}`, "model"},
		{"no messages", `{"model":"m1","messages":[]}`, "messages"},
		{"unknown role", `{"model":"m1","messages":[{"role":"robot","content":"hi"}]}`, "messages[0].role"},
		{"role of the wrong type", `{"model":"m1","messages":[{"role":"user","content":"hi"},{"role":5}]}`, "messages[1].role"},
		{"user without content", `{"model":"m1","messages":[{"role":"user"}]}`, "messages[0].content"},
		{"content neither string nor parts", `{"model":"m1","messages":[{"role":"user","content":7}]}`, "messages[0].content"},
		{"unknown part", `{"model":"m1","messages":[{"role":"user","content":[{"type":"input_audio"}]}]}`, "messages[0].content[0].type"},
		{"image by http URL", `{"model":"m1","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"http://x/y.png"}}]}]}`,
			"messages[0].content[0].image_url.url"},
		{"image not base64", `{"model":"m1","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,@@"}}]}]}`,
			"messages[0].content[0].image_url.url"},
		{"tool message without id", `{"model":"m1","messages":[{"role":"tool","content":"x"}]}`, "messages[0].tool_call_id"},
		{"tool call without name", `{"model":"m1","messages":[{"role":"assistant","tool_calls":[{"id":"c","type":"function","function":{"arguments":"{}"}}]}]}`,
			"messages[0].tool_calls[0].function.name"},
		{"tool calls on a user message", `{"model":"m1","messages":[{"role":"user","content":"x","tool_calls":[{"function":{"name":"f"}}]}]}`,
			"messages[0].tool_calls"},
		{"non-function tool", `{"model":"m1",` + msgs + `,"tools":[{"type":"web_search"}]}`, "tools[0].type"},
		{"tool without name", `{"model":"m1",` + msgs + `,"tools":[{"type":"function","function":{}}]}`, "tools[0].function.name"},
		{"temperature too high", `{"model":"m1",` + msgs + `,"temperature":3}`, "temperature"},
		{"top_p negative", `{"model":"m1",` + msgs + `,"top_p":-1}`, "top_p"},
		{"max_tokens zero", `{"model":"m1",` + msgs + `,"max_tokens":0}`, "max_tokens"},
		{"max_completion_tokens negative", `{"model":"m1",` + msgs + `,"max_completion_tokens":-5}`, "max_completion_tokens"},
		{"stop of numbers", `{"model":"m1",` + msgs + `,"stop":[1,2]}`, "stop"},
		{"n above 1", `{"model":"m1",` + msgs + `,"n":2}`, "n"},
		{"unknown response format", `{"model":"m1",` + msgs + `,"response_format":{"type":"yaml"}}`, "response_format.type"},
		{"json schema without schema", `{"model":"m1",` + msgs + `,"response_format":{"type":"json_schema","json_schema":{"name":"x"}}}`,
			"response_format.json_schema.schema"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, &ft.Dispatcher{})
			w := e.do(chatReq(tt.body))
			b := apiErrorOf(t, w.Body.String())
			if w.Code != http.StatusBadRequest || b.Error.Type != typeInvalidRequest {
				t.Fatalf("status %d: %s", w.Code, w.Body)
			}
			if got := paramOf(b); got != tt.param {
				t.Errorf("param = %q, want %q (%s)", got, tt.param, b.Error.Message)
			}
			if len(e.runner.RunRequests()) != 0 {
				t.Error("an invalid request was started")
			}
			if strings.Contains(b.Error.Message, "hi\"") {
				t.Error("the error echoes message content")
			}
			if e.requests(t, "invalid_request") != 1 {
				t.Errorf("requests{invalid_request} = %v", e.requests(t, "invalid_request"))
			}
		})
	}
}
