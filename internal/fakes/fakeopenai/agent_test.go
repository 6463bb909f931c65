package fakeopenai_test

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/shared"

	"github.com/iop-dev/iop/internal/fakes/fakeopenai"
)

func functionTool(name, params string) openai.ChatCompletionToolUnionParam {
	var p shared.FunctionParameters
	if err := json.Unmarshal([]byte(params), &p); err != nil {
		panic(err)
	}
	return openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{Name: name, Parameters: p})
}

var (
	bashTool  = functionTool("Bash", `{"type":"object","properties":{"command":{"type":"string"},"timeout":{"type":"number"}},"required":["command"]}`)
	shellTool = functionTool("shell", `{"type":"object","properties":{"command":{"type":"array","items":{"type":"string"}},"workdir":{"type":"string"}},"required":["command"]}`)
	readTool  = functionTool("Read", `{"type":"object","properties":{"file_path":{"type":"string"}},"required":["file_path"]}`)
)

// chat runs one chat completion with the official client, streamed (and
// accumulated) or not, and returns the message, finish reason and usage.
func chat(t *testing.T, c openai.Client, stream bool, params openai.ChatCompletionNewParams) (openai.ChatCompletionMessage, string, openai.CompletionUsage) {
	t.Helper()
	if !stream {
		res, err := c.Chat.Completions.New(t.Context(), params)
		if err != nil {
			t.Fatal(err)
		}
		return res.Choices[0].Message, res.Choices[0].FinishReason, res.Usage
	}
	params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	s := c.Chat.Completions.NewStreaming(t.Context(), params)
	acc := openai.ChatCompletionAccumulator{}
	for s.Next() {
		if !acc.AddChunk(s.Current()) {
			t.Fatalf("accumulator rejected %s", s.Current().RawJSON())
		}
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	return acc.Choices[0].Message, acc.Choices[0].FinishReason, acc.Usage
}

// Issue 21, P7: an agent model answers a coding agent's session over chat
// completions, streamed and not: a user turn offering tools gets one call
// to the shell tool with arguments that fit its schema (an argv for
// Codex's shell), finish_reason tool_calls and no content; the turn with
// the tool's result (string content or parts) gets text quoting it; the
// next user turn a call with a new id; no tools the model's own answer.
func TestAgentModelAnswersASessionOverChatCompletions(t *testing.T) {
	s := fakeopenai.Start(fakeopenai.Config{Models: []fakeopenai.Model{{Name: "coder", Tokens: []string{"plain"}, Agent: &fakeopenai.Agent{}}}})
	defer s.Close()
	c := client(s, "")
	for _, stream := range []bool{true, false} {
		for _, tc := range []struct {
			tool openai.ChatCompletionToolUnionParam
			name string
			args string
		}{
			{bashTool, "Bash", `{"command":"echo iop-agent-ok"}`},
			{shellTool, "shell", `{"command":["bash","-lc","echo iop-agent-ok"]}`},
		} {
			msgs := []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("You are a coding agent."), openai.UserMessage("run it")}
			params := openai.ChatCompletionNewParams{Model: "coder", Messages: msgs, Tools: []openai.ChatCompletionToolUnionParam{readTool, tc.tool}}
			msg, finish, _ := chat(t, c, stream, params)
			if finish != "tool_calls" || msg.Content != "" || len(msg.ToolCalls) != 1 {
				t.Fatalf("stream=%v %s: first turn %q %q %+v", stream, tc.name, finish, msg.Content, msg.ToolCalls)
			}
			call := msg.ToolCalls[0]
			if call.Function.Name != tc.name || call.Function.Arguments != tc.args || !strings.HasPrefix(call.ID, "call_") {
				t.Fatalf("stream=%v: call %+v", stream, call)
			}

			params.Messages = append(params.Messages, msg.ToParam(), openai.ToolMessage("iop-agent-ok\n", call.ID))
			msg, finish, _ = chat(t, c, stream, params)
			if finish != "stop" || msg.Content != "The command printed: iop-agent-ok" || len(msg.ToolCalls) != 0 {
				t.Fatalf("stream=%v %s: result turn %q %q %+v", stream, tc.name, finish, msg.Content, msg.ToolCalls)
			}

			params.Messages = append(params.Messages, msg.ToParam(), openai.UserMessage("again"))
			again, _, _ := chat(t, c, stream, params)
			if len(again.ToolCalls) != 1 || again.ToolCalls[0].ID == call.ID {
				t.Fatalf("stream=%v: next turn %+v (first %s)", stream, again.ToolCalls, call.ID)
			}
		}
		msg, finish, _ := chat(t, c, stream, openai.ChatCompletionNewParams{Model: "coder",
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}})
		if msg.Content != "plain" || finish != "stop" {
			t.Fatalf("stream=%v: no tools: %q %q", stream, msg.Content, finish)
		}
	}

	// A tool result in content parts, followed by a reminder.
	parts := []openai.ChatCompletionContentPartTextParam{{Text: "iop-agent-ok"}, {Text: "exit 0"}}
	msg, _, _ := chat(t, c, false, openai.ChatCompletionNewParams{Model: "coder", Tools: []openai.ChatCompletionToolUnionParam{bashTool},
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("run it"),
			openai.AssistantMessage(""), openai.ToolMessage(parts, "call_1"), openai.UserMessage("<system-reminder/>")}})
	if msg.Content != "The command printed: iop-agent-ok exit 0" {
		t.Fatalf("parts: %q", msg.Content)
	}
}

// The streamed call has the real chunk shape: a first tool-call delta with
// index, id, type, name and empty arguments, then the arguments in pieces
// with the index only.
func TestAgentCallStreamsInOpenAIsChunkShape(t *testing.T) {
	s := fakeopenai.Start(fakeopenai.Config{Models: []fakeopenai.Model{{Name: "coder", Agent: &fakeopenai.Agent{}}}})
	defer s.Close()
	body := `{"model":"coder","stream":true,"messages":[{"role":"user","content":"go"}],
		"tools":[{"type":"function","function":{"name":"Bash","parameters":{"type":"object","properties":{"command":{"type":"string"}}}}}]}`
	resp, err := http.Post(s.BaseURL()+"/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data := sseData(t, resp)
	if len(data) < 4 || data[len(data)-1] != "[DONE]" {
		t.Fatalf("data %q", data)
	}
	type delta struct {
		Choices []struct {
			Delta struct {
				Role      string           `json:"role"`
				ToolCalls []map[string]any `json:"tool_calls"`
			} `json:"delta"`
			FinishReason *string `json:"finish_reason"`
		} `json:"choices"`
	}
	var first, second, last delta
	_ = json.Unmarshal([]byte(data[0]), &first)
	_ = json.Unmarshal([]byte(data[1]), &second)
	_ = json.Unmarshal([]byte(data[len(data)-2]), &last)
	head := first.Choices[0].Delta
	fn, _ := head.ToolCalls[0]["function"].(map[string]any)
	if head.Role != "assistant" || head.ToolCalls[0]["index"] != 0.0 || head.ToolCalls[0]["type"] != "function" ||
		fn["name"] != "Bash" || fn["arguments"] != "" || !strings.HasPrefix(head.ToolCalls[0]["id"].(string), "call_") {
		t.Fatalf("first chunk %s", data[0])
	}
	if tc := second.Choices[0].Delta.ToolCalls[0]; tc["id"] != nil || tc["index"] != 0.0 {
		t.Fatalf("second chunk %s", data[1])
	}
	if f := last.Choices[0].FinishReason; f == nil || *f != "tool_calls" {
		t.Fatalf("last chunk %s", data[len(data)-2])
	}
}

// Issue 21, P7: tool_choice as vLLM honours it: none answers text, a named
// function is called (even after a tool result), required calls after a
// result too, and naming a tool not offered is a 400 with vLLM's message.
func TestAgentHonoursToolChoice(t *testing.T) {
	s := fakeopenai.Start(fakeopenai.Config{Models: []fakeopenai.Model{{Name: "coder", Tokens: []string{"no", " tools"}, Agent: &fakeopenai.Agent{}}}})
	defer s.Close()
	c := client(s, "")
	tools := []openai.ChatCompletionToolUnionParam{bashTool, readTool}
	afterResult := []openai.ChatCompletionMessageParamUnion{openai.UserMessage("go"), openai.AssistantMessage(""), openai.ToolMessage("ok", "call_1")}
	cases := []struct {
		name   string
		choice openai.ChatCompletionToolChoiceOptionUnionParam
		msgs   []openai.ChatCompletionMessageParamUnion
		call   string
		text   string
	}{
		{"none", openai.ChatCompletionToolChoiceOptionUnionParam{OfAuto: openai.String("none")},
			[]openai.ChatCompletionMessageParamUnion{openai.UserMessage("go")}, "", "no tools"},
		{"named", openai.ToolChoiceOptionFunctionToolChoice(openai.ChatCompletionNamedToolChoiceFunctionParam{Name: "Read"}),
			afterResult, "Read", ""},
		{"required", openai.ChatCompletionToolChoiceOptionUnionParam{OfAuto: openai.String("required")}, afterResult, "Bash", ""},
		{"auto", openai.ChatCompletionToolChoiceOptionUnionParam{OfAuto: openai.String("auto")}, afterResult, "", "The command printed: ok"},
	}
	for _, tc := range cases {
		msg, _, _ := chat(t, c, false, openai.ChatCompletionNewParams{Model: "coder", Tools: tools, Messages: tc.msgs, ToolChoice: tc.choice})
		call := ""
		if len(msg.ToolCalls) == 1 {
			call = msg.ToolCalls[0].Function.Name
		}
		if call != tc.call || msg.Content != tc.text {
			t.Errorf("%s: call %q text %q", tc.name, call, msg.Content)
		}
	}
	_, err := c.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{Model: "coder", Tools: tools,
		Messages:   []openai.ChatCompletionMessageParamUnion{openai.UserMessage("go")},
		ToolChoice: openai.ToolChoiceOptionFunctionToolChoice(openai.ChatCompletionNamedToolChoiceFunctionParam{Name: "Write"})})
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || apiErr.Message != "Tool 'Write' has not been passed in `tools`." {
		t.Fatalf("forced tool not offered: %v", err)
	}
}

// Issue 21, P2: reasoning_effort and response_format are recorded; a
// json_schema format gets JSON that fits the schema, json_object a JSON
// object; a schema the fake cannot follow is a 400.
func TestResponseFormatAndReasoningEffort(t *testing.T) {
	s := fakeopenai.Start(fakeopenai.Config{Models: []fakeopenai.Model{{Name: "m", Tokens: []string{"Seoul", " Korea"}}}})
	defer s.Close()
	c := client(s, "")
	schema := map[string]any{"type": "object", "properties": map[string]any{
		"city": map[string]any{"type": "string"}, "days": map[string]any{"type": "integer", "minimum": 3},
	}, "required": []string{"city", "days"}, "additionalProperties": false}
	msg, _, _ := chat(t, c, true, openai.ChatCompletionNewParams{Model: "m", ReasoningEffort: shared.ReasoningEffortHigh,
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("weather")},
		ResponseFormat: openai.ChatCompletionNewParamsResponseFormatUnion{OfJSONSchema: &shared.ResponseFormatJSONSchemaParam{
			JSONSchema: shared.ResponseFormatJSONSchemaJSONSchemaParam{Name: "weather", Schema: schema, Strict: openai.Bool(true)}}}})
	if msg.Content != `{"city": "Seoul", "days": 3}` {
		t.Fatalf("json_schema content %q", msg.Content)
	}
	r := s.Requests()[0]
	if r.ReasoningEffort != "high" || !strings.Contains(string(r.ResponseFormat), `"name":"weather"`) {
		t.Fatalf("recorded effort %q format %s", r.ReasoningEffort, r.ResponseFormat)
	}

	msg, _, _ = chat(t, c, false, openai.ChatCompletionNewParams{Model: "m",
		Messages:       []openai.ChatCompletionMessageParamUnion{openai.UserMessage("weather")},
		ResponseFormat: openai.ChatCompletionNewParamsResponseFormatUnion{OfJSONObject: &shared.ResponseFormatJSONObjectParam{}}})
	if msg.Content != `{"answer": "Seoul Korea"}` {
		t.Fatalf("json_object content %q", msg.Content)
	}

	_, err := c.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{Model: "m",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("weather")},
		ResponseFormat: openai.ChatCompletionNewParamsResponseFormatUnion{OfJSONSchema: &shared.ResponseFormatJSONSchemaParam{
			JSONSchema: shared.ResponseFormatJSONSchemaJSONSchemaParam{Name: "bad", Schema: map[string]any{"$ref": "#/nope"}}}}})
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 {
		t.Fatalf("unusable schema: %v", err)
	}
}

// Issue 21, P9: prefill costs PrefillPerToken for the prompt tokens past the
// longest prefix the server's prompt cache holds, reported as
// usage.prompt_tokens_details.cached_tokens and recorded; chat and text
// completions alike; a reset starts cold.
func TestPrefillCostsTheUnseenPrefix(t *testing.T) {
	const per = 20 * time.Microsecond
	s := fakeopenai.Start(fakeopenai.Config{Models: []fakeopenai.Model{{Name: "m", PrefillPerToken: per, TokenCount: 1},
		{Name: "fixed", Usage: &fakeopenai.Usage{PromptTokens: 9, CompletionTokens: 1, CachedTokens: 4}}}})
	defer s.Close()
	c := client(s, "")
	turn1 := []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("you are a careful coding agent"), openai.UserMessage("fix the bug")}
	turn2 := append(turn1[:2:2], openai.AssistantMessage("fixed it"), openai.UserMessage("now run the tests"))
	for i, tc := range []struct {
		msgs           []openai.ChatCompletionMessageParamUnion
		stream         bool
		prompt, cached int
	}{
		{turn1, true, 9, 0},
		{turn2, false, 15, 9},
		{turn2, true, 15, 15},
	} {
		_, _, u := chat(t, c, tc.stream, openai.ChatCompletionNewParams{Model: "m", Messages: tc.msgs})
		if u.PromptTokens != int64(tc.prompt) || u.PromptTokensDetails.CachedTokens != int64(tc.cached) {
			t.Fatalf("turn %d: usage %d tokens, %d cached; want %d, %d", i+1, u.PromptTokens, u.PromptTokensDetails.CachedTokens, tc.prompt, tc.cached)
		}
		r := s.Requests()[i]
		if r.PromptTokens != tc.prompt || r.CachedTokens != tc.cached || r.Prefill != time.Duration(tc.prompt-tc.cached)*per {
			t.Fatalf("turn %d: recorded %d tokens, %d cached, prefill %v", i+1, r.PromptTokens, r.CachedTokens, r.Prefill)
		}
	}
	s.ResetPromptCache()
	if _, _, u := chat(t, c, false, openai.ChatCompletionNewParams{Model: "m", Messages: turn2}); u.PromptTokensDetails.CachedTokens != 0 {
		t.Fatalf("after a reset: %d cached", u.PromptTokensDetails.CachedTokens)
	}

	params := openai.CompletionNewParams{Model: "m", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("def add(a, b):")}}
	if _, err := c.Completions.New(t.Context(), params); err != nil {
		t.Fatal(err)
	}
	params.Prompt.OfString = openai.String("def add(a, b): return a + b")
	res, err := c.Completions.New(t.Context(), params)
	if err != nil || res.Usage.PromptTokens != 7 || res.Usage.PromptTokensDetails.CachedTokens != 3 {
		t.Fatalf("completion usage %+v %v", res.Usage, err)
	}

	if _, _, u := chat(t, c, false, openai.ChatCompletionNewParams{Model: "fixed", Messages: turn1}); u.PromptTokens != 9 || u.PromptTokensDetails.CachedTokens != 4 {
		t.Fatalf("configured usage %+v", u)
	}
}
