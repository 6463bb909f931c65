package anthropicapi

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/iop-dev/iop/internal/edge/dispatch"
	ft "github.com/iop-dev/iop/internal/edge/frontend/frontendtest"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/anthropics/anthropic-sdk-go/v2/shared"

	"github.com/iop-dev/iop/internal/edge/sched"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// These tests put the official Anthropic Go SDK, which nobody here wrote,
// in front of the handler (SPEC P2: the SDKs are the test of
// compatibility): what it parses is what Anthropic clients see.

func officialClient(t *testing.T, f *ft.Dispatcher) (anthropic.Client, *env) {
	t.Helper()
	e := newEnv(t, f)
	srv := httptest.NewServer(e.handler)
	t.Cleanup(srv.Close)
	return anthropic.NewClient(option.WithBaseURL(srv.URL), option.WithAPIKey(testKey), option.WithMaxRetries(0)), e
}

var weatherTool = anthropic.ToolUnionParam{OfTool: &anthropic.ToolParam{
	Name:        "get_weather",
	Description: anthropic.String("weather now"),
	InputSchema: anthropic.ToolInputSchemaParam{Properties: map[string]any{"city": map[string]any{"type": "string"}}},
}}

func TestOfficialClientAccumulatesTheStream(t *testing.T) {
	c, _ := officialClient(t, &ft.Dispatcher{Events: []ft.Step{
		ft.Reasoning("Rain?"), ft.Text("Let me"), ft.Text(" check."),
		ft.ToolCall(0, "call_1", "get_weather", ""), ft.ToolCall(0, "", "", `{"city":`), ft.ToolCall(0, "", "", `"Seoul"}`),
		ft.Usage(11, 9), ft.Completed("tool_calls"),
	}})
	stream := c.Messages.NewStreaming(t.Context(), anthropic.MessageNewParams{
		Model: "m1", MaxTokens: 64, Tools: []anthropic.ToolUnionParam{weatherTool},
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("weather in Seoul?"))},
	})
	var msg anthropic.Message
	for stream.Next() {
		if err := msg.Accumulate(stream.Current()); err != nil {
			t.Fatalf("accumulate %s: %v", stream.Current().RawJSON(), err)
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if len(msg.Content) != 3 || msg.Content[0].Thinking != "Rain?" || msg.Content[1].Text != "Let me check." ||
		msg.Content[2].ID != "call_1" || msg.Content[2].Name != "get_weather" || string(msg.Content[2].Input) != `{"city":"Seoul"}` {
		t.Errorf("content %s", msg.RawJSON())
	}
	if msg.StopReason != anthropic.StopReasonToolUse || msg.Usage.InputTokens != 11 || msg.Usage.OutputTokens != 9 ||
		msg.Model != "m1" || !strings.HasPrefix(msg.ID, "msg_") || msg.Role != "assistant" {
		t.Errorf("message %s", msg.RawJSON())
	}
}

// A tool_use round trip as an agent does it: the assistant's message
// (from the SDK's own ToParam) and the tool's result go back, and the
// final answer comes.
func TestOfficialClientToolUseRoundTrip(t *testing.T) {
	f := &ft.Dispatcher{Events: []ft.Step{ft.ToolCall(0, "call_1", "get_weather", `{"city":"Seoul"}`), ft.Usage(5, 3), ft.Completed("stop")}}
	c, _ := officialClient(t, f)
	params := anthropic.MessageNewParams{
		Model: "m1", MaxTokens: 64, Tools: []anthropic.ToolUnionParam{weatherTool},
		System:   []anthropic.TextBlockParam{{Text: "be brief"}},
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("weather in Seoul?"))},
	}
	first, err := c.Messages.New(t.Context(), params)
	if err != nil {
		t.Fatal(err)
	}
	if first.StopReason != anthropic.StopReasonToolUse || len(first.Content) != 1 {
		t.Fatalf("first answer %s", first.RawJSON())
	}
	use := first.Content[0].AsToolUse()
	if use.ID != "call_1" || use.Name != "get_weather" || string(use.Input) != `{"city":"Seoul"}` {
		t.Fatalf("tool use %s", first.Content[0].RawJSON())
	}

	f2 := &ft.Dispatcher{Events: []ft.Step{ft.Text("Sunny in Seoul."), ft.Completed("stop")}}
	c2, _ := officialClient(t, f2)
	params.Messages = append(params.Messages, first.ToParam(),
		anthropic.NewUserMessage(anthropic.NewToolResultBlock(use.ID, "sunny, 21C", false)))
	final, err := c2.Messages.New(t.Context(), params)
	if err != nil {
		t.Fatal(err)
	}
	if final.StopReason != anthropic.StopReasonEndTurn || final.Content[0].Text != "Sunny in Seoul." {
		t.Errorf("final answer %s", final.RawJSON())
	}
	msgs := f2.RunRequest(t).GetMessages()
	if len(msgs) != 4 || msgs[0].GetContent() != "be brief" ||
		msgs[2].GetToolCalls()[0].GetId() != "call_1" || string(msgs[2].GetToolCalls()[0].GetArgumentsJson()) != `{"city":"Seoul"}` ||
		msgs[3].GetRole() != "tool" || msgs[3].GetToolCallId() != "call_1" || msgs[3].GetName() != "get_weather" || msgs[3].GetContent() != "sunny, 21C" {
		t.Errorf("second run's messages %v", msgs)
	}
}

// Every failure reaches the SDK as its own error type, with the status
// and Anthropic's error type: before output as the response, after it as
// the stream's error event (with the stream's 200).
func TestOfficialClientSeesAnthropicErrors(t *testing.T) {
	tests := []struct {
		name   string
		runner *ft.Dispatcher
		status int
		typ    shared.ErrorType
	}{
		{"unknown model", &ft.Dispatcher{StartErr: dispatch.ErrUnknownModel}, 404, shared.ErrorTypeNotFoundError},
		{"queue full", &ft.Dispatcher{StartErr: &sched.RefusalError{Reason: sched.ReasonQueueFull, Model: "m1", RetryAfter: time.Second}},
			429, shared.ErrorTypeRateLimitError},
		{"no candidate", &ft.Dispatcher{StartErr: &sched.RefusalError{Reason: sched.ReasonNoCandidate, Model: "m1"}},
			503, shared.ErrorTypeOverloadedError},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, _ := officialClient(t, tt.runner)
			params := anthropic.MessageNewParams{Model: "m1", MaxTokens: 8,
				Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))}}
			_, err := c.Messages.New(t.Context(), params)
			stream := c.Messages.NewStreaming(t.Context(), params)
			for stream.Next() {
				t.Error("an event of a failed request was delivered")
			}
			for _, err := range []error{err, stream.Err()} {
				var apiErr *anthropic.Error
				if !errors.As(err, &apiErr) || apiErr.StatusCode != tt.status || apiErr.Type() != tt.typ || apiErr.Message == "" {
					t.Errorf("err = %v, want *anthropic.Error %d %s", err, tt.status, tt.typ)
				}
			}
		})
	}
	c, _ := officialClient(t, &ft.Dispatcher{Events: []ft.Step{ft.Text("Hel"), ft.Failed(wirepb.FailureKind_FAILURE_KIND_UPSTREAM, "provider crashed")}})
	stream := c.Messages.NewStreaming(t.Context(), anthropic.MessageNewParams{Model: "m1", MaxTokens: 8,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))}})
	var msg anthropic.Message
	for stream.Next() {
		_ = msg.Accumulate(stream.Current())
	}
	var apiErr *anthropic.Error
	if !errors.As(stream.Err(), &apiErr) || apiErr.Type() != shared.ErrorTypeAPIError || !strings.Contains(apiErr.Message, "provider crashed") {
		t.Errorf("mid-stream: %v, want an api_error naming the failure", stream.Err())
	}
	if len(msg.Content) != 1 || msg.Content[0].Text != "Hel" {
		t.Errorf("content before the error: %s", msg.RawJSON())
	}
}

// GET /v1/models in Anthropic's shape, paged as Anthropic pages it; with
// ModelsOr in front, a client without the anthropic-version header gets
// the other API's list.
func TestOfficialClientListsModels(t *testing.T) {
	var models []dispatch.Offering
	for i := range 25 {
		models = append(models, dispatch.Offering{ID: fmt.Sprintf("model-%02d", i)})
	}
	e := newEnv(t, &ft.Dispatcher{Offerings: models})
	other := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte(`{"object":"list"}`)) })
	srv := httptest.NewServer(ModelsOr(e.handler, other))
	t.Cleanup(srv.Close)
	c := anthropic.NewClient(option.WithBaseURL(srv.URL), option.WithAPIKey(testKey), option.WithMaxRetries(0))

	page, err := c.Models.List(t.Context(), anthropic.ModelListParams{})
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Data) != 20 || !page.HasMore || page.FirstID != "model-00" || page.LastID != "model-19" || page.Data[0].Type != "model" ||
		page.Data[0].DisplayName != "model-00" {
		t.Errorf("first page %s", page.RawJSON())
	}
	var all []string
	iter := c.Models.ListAutoPaging(t.Context(), anthropic.ModelListParams{Limit: anthropic.Int(10)})
	for iter.Next() {
		all = append(all, iter.Current().ID)
	}
	if iter.Err() != nil || len(all) != 25 || all[24] != "model-24" {
		t.Errorf("auto paging: %v, %v", all, iter.Err())
	}
	before, err := c.Models.List(t.Context(), anthropic.ModelListParams{BeforeID: anthropic.String("model-05"), Limit: anthropic.Int(3)})
	if err != nil || len(before.Data) != 3 || before.FirstID != "model-02" || !before.HasMore {
		t.Errorf("before_id: %v %s", err, before.RawJSON())
	}
	m, err := c.Models.Get(t.Context(), "model-03", anthropic.ModelGetParams{})
	if err != nil || m.ID != "model-03" {
		t.Errorf("get: %v %+v", err, m)
	}
	_, err = c.Models.Get(t.Context(), "nope", anthropic.ModelGetParams{})
	var apiErr *anthropic.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 404 || apiErr.Type() != shared.ErrorTypeNotFoundError {
		t.Errorf("unknown model: %v", err)
	}

	resp, err := http.Get(srv.URL + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.ContentLength != int64(len(`{"object":"list"}`)) {
		t.Errorf("without the header the list is not the other API's")
	}
}
