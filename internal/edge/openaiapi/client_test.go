package openaiapi

import (
	"errors"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/iop-dev/iop/internal/edge/dispatch"
	ft "github.com/iop-dev/iop/internal/edge/frontend/frontendtest"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/ssestream"
	"github.com/openai/openai-go/v3/shared"
	"google.golang.org/protobuf/proto"

	"github.com/iop-dev/iop/internal/edge/sched"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// These tests put the official OpenAI Go client, which nobody here wrote,
// in front of the handler: what it parses is what OpenAI clients see.

func officialClient(t *testing.T, f *ft.Dispatcher) (openai.Client, *env) {
	t.Helper()
	e := newEnv(t, f)
	srv := httptest.NewServer(e.handler)
	t.Cleanup(srv.Close)
	return openai.NewClient(
		option.WithBaseURL(srv.URL+"/v1/"),
		option.WithAPIKey(testKey),
		option.WithMaxRetries(0),
	), e
}

var weatherTool = openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{
	Name:        "get_weather",
	Description: openai.String("weather now"),
	Parameters: shared.FunctionParameters{
		"type":       "object",
		"properties": map[string]any{"city": map[string]any{"type": "string"}},
	},
})

func TestOfficialClientAccumulatesStreamedToolCallsAndUsage(t *testing.T) {
	const args = `{"city":"Seoul"}`
	c, e := officialClient(t, &ft.Dispatcher{Events: []ft.Step{
		ft.Text("Let me"), ft.Text(" check."),
		ft.ToolCall(0, "call_abc", "get_weather", ""), ft.ToolCall(0, "", "", `{"city":`), ft.ToolCall(0, "", "", `"Seoul"}`),
		ft.Usage(11, 9), ft.Completed("stop"),
	}})
	stream := c.Chat.Completions.NewStreaming(t.Context(), openai.ChatCompletionNewParams{
		Model:         "m1",
		Messages:      []openai.ChatCompletionMessageParamUnion{openai.UserMessage("weather in Seoul?")},
		Tools:         []openai.ChatCompletionToolUnionParam{weatherTool},
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
	})
	acc := openai.ChatCompletionAccumulator{}
	var finished []openai.FinishedChatCompletionToolCall
	for stream.Next() {
		if !acc.AddChunk(stream.Current()) {
			t.Fatalf("accumulator rejected chunk %s", stream.Current().RawJSON())
		}
		if tc, ok := acc.JustFinishedToolCall(); ok {
			finished = append(finished, tc)
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	msg := acc.Choices[0].Message
	if msg.Content != "Let me check." || acc.Choices[0].FinishReason != "tool_calls" {
		t.Errorf("content %q, finish %q", msg.Content, acc.Choices[0].FinishReason)
	}
	if len(msg.ToolCalls) != 1 || msg.ToolCalls[0].ID != "call_abc" || msg.ToolCalls[0].Function.Name != "get_weather" ||
		msg.ToolCalls[0].Function.Arguments != args {
		t.Errorf("tool calls = %+v", msg.ToolCalls)
	}
	if len(finished) != 1 || finished[0].Arguments != args {
		t.Errorf("finished tool calls = %+v", finished)
	}
	if acc.Usage.PromptTokens != 11 || acc.Usage.CompletionTokens != 9 || acc.Usage.TotalTokens != 20 {
		t.Errorf("usage = %+v", acc.Usage)
	}
	if acc.ID != "chatcmpl-run-1" || acc.Model != "m1" {
		t.Errorf("id %q model %q", acc.ID, acc.Model)
	}
	want := &wirepb.RunRequest{
		Messages: []*wirepb.ChatMessage{{Role: "user", Content: "weather in Seoul?"}},
		Tools: []*wirepb.Tool{{Name: "get_weather", Description: "weather now",
			ParametersJson: []byte(`{"properties":{"city":{"type":"string"}},"type":"object"}`)}},
		Options: &wirepb.RunOptions{},
	}
	if got := e.runner.RunRequests()[0]; !proto.Equal(got, want) {
		t.Errorf("run request %v, want %v", got, want)
	}
}

func TestOfficialClientSendsToolResultsBack(t *testing.T) {
	c, e := officialClient(t, &ft.Dispatcher{Events: []ft.Step{ft.Text("Sunny."), ft.Completed("stop")}})
	assistant := openai.ChatCompletionMessage{Role: "assistant", ToolCalls: []openai.ChatCompletionMessageToolCallUnion{{
		ID: "call_abc", Type: "function",
		Function: openai.ChatCompletionMessageFunctionToolCallFunction{Name: "get_weather", Arguments: `{"city":"Seoul"}`},
	}}}
	res, err := c.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{
		Model: "m1",
		Messages: []openai.ChatCompletionMessageParamUnion{
			openai.SystemMessage("be brief"),
			openai.UserMessage("weather in Seoul?"),
			assistant.ToParam(),
			openai.ToolMessage(`{"sky":"clear"}`, "call_abc"),
		},
		Tools:               []openai.ChatCompletionToolUnionParam{weatherTool},
		Temperature:         openai.Float(0.5),
		MaxCompletionTokens: openai.Int(64),
		Seed:                openai.Int(3),
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Choices[0].Message.Content != "Sunny." || res.Choices[0].FinishReason != "stop" || res.Object != "chat.completion" {
		t.Errorf("answer %+v", res.Choices[0])
	}
	got := e.runner.RunRequests()[0]
	msgs := got.GetMessages()
	if len(msgs) != 4 || msgs[0].GetRole() != "system" || msgs[2].GetToolCalls()[0].GetId() != "call_abc" ||
		string(msgs[2].GetToolCalls()[0].GetArgumentsJson()) != `{"city":"Seoul"}` ||
		msgs[3].GetRole() != "tool" || msgs[3].GetToolCallId() != "call_abc" || msgs[3].GetContent() != `{"sky":"clear"}` {
		t.Errorf("messages %v", msgs)
	}
	if o := got.GetOptions(); o.GetTemperature() != 0.5 || o.GetMaxTokens() != 64 || o.GetSeed() != 3 {
		t.Errorf("options %v", o)
	}
}

func TestOfficialClientSeesErrorsAsOpenAIErrors(t *testing.T) {
	tests := []struct {
		name   string
		runner *ft.Dispatcher
		status int
		code   string
	}{
		{"queue full", &ft.Dispatcher{StartErr: &sched.RefusalError{Reason: sched.ReasonQueueFull, Model: "m1", RetryAfter: time.Second}}, 429, "queue_full"},
		{"no candidate", &ft.Dispatcher{StartErr: &sched.RefusalError{Reason: sched.ReasonNoCandidate, Model: "m1"}}, 503, "no_candidate"},
		{"forbidden", &ft.Dispatcher{ResolveErr: dispatch.ErrForbidden}, 404, "model_not_found"},
		{"stalled before output", &ft.Dispatcher{Events: []ft.Step{ft.Ended(wirepb.RunEventType_RUN_EVENT_TYPE_RESPONSE_STALLED, 0, "")}}, 504, "response_stalled"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := tt.runner
			c, _ := officialClient(t, f)
			params := openai.ChatCompletionNewParams{Model: "m1", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}}
			_, err := c.Chat.Completions.New(t.Context(), params)
			stream := c.Chat.Completions.NewStreaming(t.Context(), params)
			for stream.Next() {
			}
			for _, err := range []error{err, stream.Err()} {
				var apiErr *openai.Error
				if !errors.As(err, &apiErr) {
					t.Fatalf("err = %v, want *openai.Error", err)
				}
				if apiErr.StatusCode != tt.status || apiErr.Code != tt.code || apiErr.Message == "" {
					t.Errorf("status %d code %q message %q", apiErr.StatusCode, apiErr.Code, apiErr.Message)
				}
			}
		})
	}
}

func TestOfficialClientSeesMidStreamError(t *testing.T) {
	c, _ := officialClient(t, &ft.Dispatcher{Events: []ft.Step{ft.Text("Hel"),
		ft.Ended(wirepb.RunEventType_RUN_EVENT_TYPE_FAILED, wirepb.FailureKind_FAILURE_KIND_UPSTREAM, "provider crashed")}})
	stream := c.Chat.Completions.NewStreaming(t.Context(), openai.ChatCompletionNewParams{
		Model: "m1", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
	})
	var content strings.Builder
	for stream.Next() {
		for _, ch := range stream.Current().Choices {
			content.WriteString(ch.Delta.Content)
		}
	}
	var se *ssestream.StreamError
	if !errors.As(stream.Err(), &se) || !strings.Contains(se.Message, "provider crashed") || !strings.Contains(se.Message, "upstream") {
		t.Fatalf("err = %v, want a stream error naming the failure", stream.Err())
	}
	if content.String() != "Hel" {
		t.Errorf("content before the error = %q", content.String())
	}
}

func TestOfficialClientListsModels(t *testing.T) {
	c, _ := officialClient(t, &ft.Dispatcher{Offerings: []dispatch.Offering{{ID: "llama3.2"}, {ID: "qwen3"}}})
	page, err := c.Models.List(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, m := range page.Data {
		ids = append(ids, m.ID)
	}
	if strings.Join(ids, ",") != "llama3.2,qwen3" {
		t.Errorf("models = %v", ids)
	}
	m, err := c.Models.Get(t.Context(), "qwen3")
	if err != nil || m.ID != "qwen3" {
		t.Errorf("get: %v %+v", err, m)
	}
}
