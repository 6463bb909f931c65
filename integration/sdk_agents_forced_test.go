package integration

import (
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/responses"
	"github.com/openai/openai-go/v3/shared"

	"github.com/iop-dev/iop/internal/fakes/fakeollama"
)

// forcedTool is a tool offered in the forced-call tests, with the JSON
// schema of its parameters.
type forcedTool struct {
	name, description string
	schema            map[string]any
}

// The tools every forced-call request offers. Their schemas are strict
// (every property required, no others) so that a call's arguments can be
// checked against them whole.
var (
	forcedWeather = forcedTool{"get_weather", "The weather in a city now.", map[string]any{
		"type": "object", "additionalProperties": false, "required": []any{"city", "unit"},
		"properties": map[string]any{
			"city": map[string]any{"type": "string"},
			"unit": map[string]any{"type": "string", "enum": []any{"C", "F"}},
		},
	}}
	forcedTime = forcedTool{"get_time", "The time in a time zone now.", map[string]any{
		"type": "object", "additionalProperties": false, "required": []any{"timezone", "hour24"},
		"properties": map[string]any{
			"timezone": map[string]any{"type": "string"},
			"hour24":   map[string]any{"type": "boolean"},
		},
	}}
	forcedTools = []forcedTool{forcedWeather, forcedTime}
)

// forcedUnion is the format the ollama adapter sends for a choice among
// forcedTools (plugins/ollama/forced.go): a oneOf of whole calls, the
// tool's name as a const, then its parameters.
func forcedUnion() map[string]any {
	var branches []any
	for _, tool := range forcedTools {
		branches = append(branches, map[string]any{
			"type": "object", "additionalProperties": false, "required": []any{"name", "parameters"},
			"properties": map[string]any{"name": map[string]any{"const": tool.name}, "parameters": tool.schema},
		})
	}
	return map[string]any{"oneOf": branches}
}

// conforms says why args, a call's arguments, do not fit tool's schema
// (the subset of JSON schema forcedTools use), or "" when they do.
func (tool forcedTool) conforms(args []byte) string {
	var obj map[string]any
	if err := json.Unmarshal(args, &obj); err != nil {
		return fmt.Sprintf("not a JSON object: %v", err)
	}
	props := tool.schema["properties"].(map[string]any)
	for _, req := range tool.schema["required"].([]any) {
		if _, ok := obj[req.(string)]; !ok {
			return fmt.Sprintf("required %q missing", req)
		}
	}
	for k, v := range obj {
		p, ok := props[k].(map[string]any)
		if !ok {
			return fmt.Sprintf("property %q is not in the schema", k)
		}
		switch p["type"] {
		case "string":
			s, ok := v.(string)
			if !ok {
				return fmt.Sprintf("%q is not a string", k)
			}
			if enum, ok := p["enum"].([]any); ok && !slices.Contains(enum, any(s)) {
				return fmt.Sprintf("%q = %q is not one of %v", k, s, enum)
			}
		case "boolean":
			if _, ok := v.(bool); !ok {
				return fmt.Sprintf("%q is not a boolean", k)
			}
		}
	}
	return ""
}

// sdkSameJSON says whether a and b are the same JSON value.
func sdkSameJSON(t *testing.T, a json.RawMessage, b any) bool {
	t.Helper()
	var av, bv any
	bb, err := json.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	if json.Unmarshal(a, &av) != nil || json.Unmarshal(bb, &bv) != nil {
		return false
	}
	return reflect.DeepEqual(av, bv)
}

// Issue 21, P2, P7: Ollama has no tool_choice, so a forced tool call on an
// Ollama model is a call constrained to the tool's schema (Ollama's format
// takes a JSON schema; the fake answers with JSON that fits it), sent
// without the tools (plugins/ollama/forced.go). Through each of the three
// chat APIs, with the official SDKs unchanged: the answer is a call of the
// forced tool (for required/any, of one of the tools) whose arguments fit
// its schema, and the fake Ollama got format = that tool's parameters
// schema (the union of every tool's calls for required/any) and no tools.
func TestForcedToolCallOnOllamaThroughEveryChatAPI(t *testing.T) {
	b := ollamaSDKBackend(t, fakeollama.Model{Name: "llama3.2:latest", Text: "I would rather chat."})
	oc, ac := responsesClient(b.base), anthropicClient(b.base)
	question := "What is the weather in Seoul, and the time there?"

	var chatTools []openai.ChatCompletionToolUnionParam
	var respTools []responses.ToolUnionParam
	var anthTools []anthropic.ToolUnionParam
	for _, tool := range forcedTools {
		chatTools = append(chatTools, openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{
			Name: tool.name, Description: openai.String(tool.description), Parameters: tool.schema}))
		respTools = append(respTools, responses.ToolUnionParam{OfFunction: &responses.FunctionToolParam{
			Name: tool.name, Description: openai.String(tool.description), Parameters: tool.schema, Strict: openai.Bool(true)}})
		extra := map[string]any{}
		for k, v := range tool.schema {
			if k != "type" && k != "properties" && k != "required" {
				extra[k] = v
			}
		}
		var required []string
		for _, r := range tool.schema["required"].([]any) {
			required = append(required, r.(string))
		}
		anthTools = append(anthTools, anthropic.ToolUnionParam{OfTool: &anthropic.ToolParam{
			Name: tool.name, Description: anthropic.String(tool.description),
			InputSchema: anthropic.ToolInputSchemaParam{Properties: tool.schema["properties"], Required: required, ExtraFields: extra}}})
	}
	chatParams := func(choice openai.ChatCompletionToolChoiceOptionUnionParam) openai.ChatCompletionNewParams {
		return openai.ChatCompletionNewParams{Model: b.model, Tools: chatTools, ToolChoice: choice,
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(question)}}
	}
	anthParams := func(choice anthropic.ToolChoiceUnionParam) anthropic.MessageNewParams {
		return anthropic.MessageNewParams{Model: anthropic.Model(b.model), MaxTokens: 512, Tools: anthTools, ToolChoice: choice,
			Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock(question))}}
	}

	// call is the forced call as the client got it: the tool's name and
	// its arguments.
	type call struct {
		name string
		args []byte
	}
	tests := []struct {
		name string
		// forced is the tool the choice names; "" lets the model choose.
		forced string
		ask    func(t *testing.T) call
	}{
		{"openai chat, a named function", forcedTime.name, func(t *testing.T) call {
			resp, err := oc.Chat.Completions.New(t.Context(), chatParams(openai.ToolChoiceOptionFunctionToolChoice(
				openai.ChatCompletionNamedToolChoiceFunctionParam{Name: forcedTime.name})))
			if err != nil {
				t.Fatal(err)
			}
			ch := resp.Choices[0]
			if ch.FinishReason != "tool_calls" || len(ch.Message.ToolCalls) != 1 || ch.Message.Content != "" {
				t.Fatalf("want one tool call: %s", resp.RawJSON())
			}
			tc := ch.Message.ToolCalls[0]
			return call{tc.Function.Name, []byte(tc.Function.Arguments)}
		}},
		{"openai chat, required, streamed", "", func(t *testing.T) call {
			stream := oc.Chat.Completions.NewStreaming(t.Context(), chatParams(openai.ChatCompletionToolChoiceOptionUnionParam{
				OfAuto: openai.String(string(openai.ChatCompletionToolChoiceOptionAutoRequired))}))
			var acc openai.ChatCompletionAccumulator
			for stream.Next() {
				acc.AddChunk(stream.Current())
			}
			if err := stream.Err(); err != nil {
				t.Fatal(err)
			}
			ch := acc.Choices[0]
			if ch.FinishReason != "tool_calls" || len(ch.Message.ToolCalls) != 1 || ch.Message.Content != "" {
				t.Fatalf("want one tool call: %+v", acc.ChatCompletion)
			}
			tc := ch.Message.ToolCalls[0]
			return call{tc.Function.Name, []byte(tc.Function.Arguments)}
		}},
		{"responses, a function", forcedTime.name, func(t *testing.T) call {
			resp, err := oc.Responses.New(t.Context(), responses.ResponseNewParams{Model: b.model, Tools: respTools,
				Input:      responses.ResponseNewParamsInputUnion{OfString: openai.String(question)},
				ToolChoice: responses.ResponseNewParamsToolChoiceUnion{OfFunctionTool: &responses.ToolChoiceFunctionParam{Name: forcedTime.name}}})
			if err != nil {
				t.Fatal(err)
			}
			if resp.Status != responses.ResponseStatusCompleted || len(resp.Output) != 1 || resp.Output[0].Type != "function_call" {
				t.Fatalf("want one function_call: %s", resp.RawJSON())
			}
			fc := resp.Output[0].AsFunctionCall()
			return call{fc.Name, []byte(fc.Arguments)}
		}},
		{"anthropic, tool", forcedTime.name, func(t *testing.T) call {
			msg, err := ac.Messages.New(t.Context(), anthParams(anthropic.ToolChoiceParamOfTool(forcedTime.name)))
			if err != nil {
				t.Fatal(err)
			}
			if msg.StopReason != anthropic.StopReasonToolUse || len(msg.Content) != 1 || msg.Content[0].Type != "tool_use" {
				t.Fatalf("want one tool_use: %s", msg.RawJSON())
			}
			use := msg.Content[0].AsToolUse()
			return call{use.Name, use.Input}
		}},
		{"anthropic, any, streamed", "", func(t *testing.T) call {
			stream := ac.Messages.NewStreaming(t.Context(), anthParams(anthropic.ToolChoiceUnionParam{OfAny: &anthropic.ToolChoiceAnyParam{}}))
			var msg anthropic.Message
			for stream.Next() {
				if err := msg.Accumulate(stream.Current()); err != nil {
					t.Fatal(err)
				}
			}
			if err := stream.Err(); err != nil {
				t.Fatal(err)
			}
			if msg.StopReason != anthropic.StopReasonToolUse || len(msg.Content) != 1 || msg.Content[0].Type != "tool_use" {
				t.Fatalf("want one tool_use: %s", msg.RawJSON())
			}
			use := msg.Content[0].AsToolUse()
			return call{use.Name, use.Input}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := tt.ask(t)
			i := slices.IndexFunc(forcedTools, func(f forcedTool) bool { return f.name == got.name })
			if i < 0 || tt.forced != "" && got.name != tt.forced {
				t.Fatalf("a call of %q, want %q (one of the tools if empty)", got.name, tt.forced)
			}
			if why := forcedTools[i].conforms(got.args); why != "" {
				t.Errorf("the arguments %s do not fit %s's schema: %s", got.args, got.name, why)
			}
			chat := b.lastChat(t)
			var want any = forcedUnion()
			if tt.forced != "" {
				want = forcedTools[i].schema
			}
			if !sdkSameJSON(t, chat.Format, want) || len(chat.Tools) != 0 {
				t.Errorf("the fake Ollama got format %s and tools %q; want format %v and no tools", chat.Format, chat.toolNames(), want)
			}
		})
	}
}
