package fakeopenai_test

import (
	"bufio"
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/shared"

	"github.com/iop-dev/iop/internal/fakes/fakeopenai"
)

func client(s *fakeopenai.Server, key string) openai.Client {
	return openai.NewClient(
		option.WithBaseURL(s.BaseURL()),
		option.WithAPIKey(key),
		option.WithMaxRetries(0),
	)
}

var weatherTool = openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{
	Name: "get_weather",
	Parameters: shared.FunctionParameters{
		"type":       "object",
		"properties": map[string]any{"city": map[string]any{"type": "string"}},
	},
})

func TestOfficialClientAssemblesStreamedToolCallsAndUsage(t *testing.T) {
	const args = `{"city":"Seoul","unit":"celsius"}`
	s := fakeopenai.Start(fakeopenai.Config{APIKey: "sk-test", Models: []fakeopenai.Model{{
		Name:      "m1",
		Tokens:    []string{"Let", " me", " check."},
		ToolCalls: []fakeopenai.ToolCall{{ID: "call_abc", Name: "get_weather", Arguments: args, FragmentSize: 5}},
		Usage:     &fakeopenai.Usage{PromptTokens: 11, CompletionTokens: 9},
	}}})
	defer s.Close()

	c := client(s, "sk-test")
	stream := c.Chat.Completions.NewStreaming(t.Context(), openai.ChatCompletionNewParams{
		Model:         "m1",
		Messages:      []openai.ChatCompletionMessageParamUnion{openai.UserMessage("weather in Seoul?")},
		Tools:         []openai.ChatCompletionToolUnionParam{weatherTool},
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
	})
	acc := openai.ChatCompletionAccumulator{}
	var fragments []string
	for stream.Next() {
		chunk := stream.Current()
		if !acc.AddChunk(chunk) {
			t.Fatalf("accumulator rejected chunk %s", chunk.RawJSON())
		}
		for _, ch := range chunk.Choices {
			for _, tc := range ch.Delta.ToolCalls {
				fragments = append(fragments, tc.Function.Arguments)
			}
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if len(fragments) < 3 {
		t.Errorf("tool call arrived in %d deltas, want it fragmented", len(fragments))
	}
	if got := strings.Join(fragments, ""); got != args {
		t.Errorf("fragments join to %q, want %q", got, args)
	}
	msg := acc.Choices[0].Message
	if msg.Content != "Let me check." {
		t.Errorf("content = %q", msg.Content)
	}
	if len(msg.ToolCalls) != 1 || msg.ToolCalls[0].ID != "call_abc" ||
		msg.ToolCalls[0].Function.Name != "get_weather" || msg.ToolCalls[0].Function.Arguments != args {
		t.Errorf("tool calls = %+v", msg.ToolCalls)
	}
	if fr := acc.Choices[0].FinishReason; fr != "tool_calls" {
		t.Errorf("finish reason = %q", fr)
	}
	if acc.Usage.PromptTokens != 11 || acc.Usage.CompletionTokens != 9 || acc.Usage.TotalTokens != 20 {
		t.Errorf("usage = %+v", acc.Usage)
	}
	reqs := s.Requests()
	if len(reqs) != 1 || reqs[0].Header.Get("Authorization") != "Bearer sk-test" || !reqs[0].Stream || reqs[0].Model != "m1" {
		t.Errorf("recorded %+v", reqs)
	}
}

func TestNonStreamingAnswerCarriesMessageAndUsage(t *testing.T) {
	s := fakeopenai.Start(fakeopenai.Config{Models: []fakeopenai.Model{{Name: "m1", TokenCount: 3}}})
	defer s.Close()
	c := client(s, "x")
	res, err := c.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{
		Model:    "m1",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("one two three four")},
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := res.Choices[0].Message.Content; got != "The quick brown" {
		t.Errorf("content = %q", got)
	}
	if res.Choices[0].FinishReason != "stop" || res.Usage.PromptTokens != 4 || res.Usage.CompletionTokens != 3 {
		t.Errorf("finish %q usage %+v", res.Choices[0].FinishReason, res.Usage)
	}
}

func TestErrorsHaveOpenAIShape(t *testing.T) {
	tests := []struct {
		name       string
		cfg        fakeopenai.Config
		key, model string
		wantStatus int
		wantCode   string
	}{
		{"missing key", fakeopenai.Config{APIKey: "k", Models: []fakeopenai.Model{{Name: "m"}}}, "", "m", 401, ""},
		{"wrong key", fakeopenai.Config{APIKey: "k", Models: []fakeopenai.Model{{Name: "m"}}}, "bad", "m", 401, "invalid_api_key"},
		{"unknown model", fakeopenai.Config{}, "x", "nope", 404, "model_not_found"},
		{"rate limited", fakeopenai.Config{Models: []fakeopenai.Model{{Name: "m", Fail: &fakeopenai.Failure{
			Status: 429, Message: "slow down", Type: "rate_limit_exceeded", Code: "rate_limit_exceeded"}}}}, "x", "m", 429, "rate_limit_exceeded"},
		{"server error", fakeopenai.Config{Models: []fakeopenai.Model{{Name: "m", Fail: &fakeopenai.Failure{Message: "boom"}}}}, "x", "m", 500, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := fakeopenai.Start(tt.cfg)
			defer s.Close()
			c := client(s, tt.key)
			_, err := c.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{
				Model:    tt.model,
				Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
			})
			var apiErr *openai.Error
			if !errors.As(err, &apiErr) {
				t.Fatalf("err = %v, want *openai.Error", err)
			}
			if apiErr.StatusCode != tt.wantStatus || apiErr.Code != tt.wantCode || apiErr.Message == "" {
				t.Errorf("status %d code %q message %q", apiErr.StatusCode, apiErr.Code, apiErr.Message)
			}
		})
	}
}

func TestMidStreamFailureSendsErrorObject(t *testing.T) {
	s := fakeopenai.Start(fakeopenai.Config{Models: []fakeopenai.Model{{Name: "m", Fail: &fakeopenai.Failure{
		MidStream: true, AfterChunks: 2, Message: "overloaded", Type: "server_error"}}}})
	defer s.Close()
	body := `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	resp, err := http.Post(s.BaseURL()+"/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var data []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			data = append(data, v)
		}
	}
	if resp.StatusCode != 200 || len(data) != 4 {
		t.Fatalf("status %d, data %q", resp.StatusCode, data)
	}
	if !strings.Contains(data[2], `"error":{"message":"overloaded"`) || data[3] != "[DONE]" {
		t.Errorf("tail = %q", data[2:])
	}
}

func TestStallHoldsConnectionUntilClientLeaves(t *testing.T) {
	s := fakeopenai.Start(fakeopenai.Config{Models: []fakeopenai.Model{{Name: "m", Stall: true, StallAfter: 2}}})
	defer s.Close()
	ctx, cancel := context.WithCancel(t.Context())
	c := client(s, "x")
	stream := c.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
		Model:    "m",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
	})
	for range 2 {
		if !stream.Next() {
			t.Fatalf("stream ended early: %v", stream.Err())
		}
	}
	wait, stop := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer stop()
	if _, err := s.WaitFinished(wait, 1); err == nil {
		t.Fatal("a stalled request finished by itself")
	}
	cancelled := time.Now()
	cancel()
	stream.Close()
	wait2, stop2 := context.WithTimeout(t.Context(), 5*time.Second)
	defer stop2()
	req, err := s.WaitGone(wait2, 1)
	if err != nil {
		t.Fatalf("client departure not recorded: %v", err)
	}
	if d := req.GoneAt.Sub(cancelled); d > time.Second {
		t.Errorf("departure noticed %v after the cancel", d)
	}
}

func TestCompletedRequestIsNotRecordedAsGone(t *testing.T) {
	s := fakeopenai.Start(fakeopenai.Config{Models: []fakeopenai.Model{{Name: "m"}}})
	defer s.Close()
	c := client(s, "x")
	stream := c.Chat.Completions.NewStreaming(t.Context(), openai.ChatCompletionNewParams{
		Model:    "m",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
	})
	for stream.Next() {
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	stream.Close()
	req, err := s.WaitFinished(t.Context(), 1)
	if err != nil {
		t.Fatal(err)
	}
	if req.ClientGone {
		t.Errorf("completed request recorded as gone")
	}
}

func TestModelsListsConfiguredModels(t *testing.T) {
	s := fakeopenai.Start(fakeopenai.Config{Models: []fakeopenai.Model{{Name: "a"}, {Name: "b"}}})
	defer s.Close()
	c := client(s, "x")
	page, err := c.Models.List(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, m := range page.Data {
		ids = append(ids, m.ID)
	}
	if strings.Join(ids, ",") != "a,b" {
		t.Errorf("models = %v", ids)
	}
}
