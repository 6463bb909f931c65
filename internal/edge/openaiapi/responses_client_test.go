package openaiapi

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	ft "github.com/iop-dev/iop/internal/edge/frontend/frontendtest"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/packages/ssestream"
	"github.com/openai/openai-go/v3/responses"

	"github.com/iop-dev/iop/internal/edge/sched"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// These tests put the official OpenAI Go client's Responses API in front of
// the handler (P2: the official SDKs are the test of compatibility).

var weatherFunction = responses.ToolUnionParam{OfFunction: &responses.FunctionToolParam{
	Name: "get_weather", Description: openai.String("weather now"), Strict: openai.Bool(false),
	Parameters: map[string]any{"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string"}}},
}}

// P2, R2: a function call round trip through the SDK: the response's
// reasoning, text and call go back as input, with the call's output, and
// reach the model as one assistant turn and a tool answer.
func TestOfficialClientRespondsWithAFunctionCallRoundTrip(t *testing.T) {
	c, _ := officialClient(t, &ft.Dispatcher{Events: []ft.Step{
		ft.Reasoning("need weather"), ft.Text("Checking."),
		ft.ToolCall(0, "call_abc", "get_weather", `{"city":`), ft.ToolCall(0, "", "", `"Seoul"}`),
		ft.Usage(11, 9), ft.Completed("tool_calls"),
	}})
	first, err := c.Responses.New(t.Context(), responses.ResponseNewParams{
		Model: "m1", Instructions: openai.String("be brief"),
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("weather in Seoul?")},
		Tools: []responses.ToolUnionParam{weatherFunction},
	})
	if err != nil {
		t.Fatal(err)
	}
	if first.Status != responses.ResponseStatusCompleted || first.OutputText() != "Checking." || len(first.Output) != 3 ||
		first.Usage.InputTokens != 11 || first.Usage.OutputTokens != 9 || first.Usage.TotalTokens != 20 {
		t.Fatalf("first response %s", first.RawJSON())
	}
	call := first.Output[2].AsFunctionCall()
	if call.CallID != "call_abc" || call.Name != "get_weather" || call.Arguments != `{"city":"Seoul"}` {
		t.Fatalf("function call %+v", call)
	}

	// The next turn: the whole output back, and the call's output.
	c2, e2 := officialClient(t, &ft.Dispatcher{Events: []ft.Step{ft.Text("22C and sunny."), ft.Completed("stop")}})
	input := responses.ResponseInputParam{responses.ResponseInputItemParamOfMessage("weather in Seoul?", responses.EasyInputMessageRoleUser)}
	for _, item := range first.Output {
		switch v := item.AsAny().(type) {
		case responses.ResponseReasoningItem:
			p := v.ToParam()
			input = append(input, responses.ResponseInputItemUnionParam{OfReasoning: &p})
		case responses.ResponseOutputMessage:
			p := v.ToParam()
			input = append(input, responses.ResponseInputItemUnionParam{OfOutputMessage: &p})
		case responses.ResponseFunctionToolCall:
			p := v.ToParam()
			input = append(input, responses.ResponseInputItemUnionParam{OfFunctionCall: &p})
		}
	}
	answer := responses.ResponseInputItemParamOfFunctionCallOutput("22C, sunny")
	answer.OfFunctionCallOutput.CallID = openai.String(call.CallID)
	input = append(input, answer)
	second, err := c2.Responses.New(t.Context(), responses.ResponseNewParams{
		Model: "m1", Input: responses.ResponseNewParamsInputUnion{OfInputItemList: input},
		Tools: []responses.ToolUnionParam{weatherFunction},
	})
	if err != nil {
		t.Fatal(err)
	}
	if second.OutputText() != "22C and sunny." {
		t.Errorf("second response %s", second.RawJSON())
	}
	want := []string{"user:weather in Seoul?",
		`assistant:Checking. reasoning=need weather call[0]=call_abc:get_weather:{"city":"Seoul"}`,
		"tool:22C, sunny answers=call_abc"}
	if got := msgLines(e2.runner.RunRequests()[0]); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("the second run's messages\n got %q\nwant %q", got, want)
	}
}

// P2: the SDK's stream decodes every event, and response.completed carries
// the whole response.
func TestOfficialClientStreamsAResponse(t *testing.T) {
	c, _ := officialClient(t, &ft.Dispatcher{Events: []ft.Step{
		ft.Text("Let me"), ft.Text(" check."), ft.ToolCall(0, "call_abc", "get_weather", `{"city":"Seoul"}`),
		ft.Usage(4, 5), ft.Completed("stop"),
	}})
	stream := c.Responses.NewStreaming(t.Context(), responses.ResponseNewParams{
		Model: "m1", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("weather?")},
		Tools: []responses.ToolUnionParam{weatherFunction},
	})
	var text strings.Builder
	var final responses.Response
	var args string
	// The SDK's accumulator checks what it collects (ids, indices, the
	// terminal); it reads the same events on OpenAI's WebSocket transport.
	var acc responses.ResponseAccumulator
	for stream.Next() {
		var ev responses.ResponsesServerEventUnion
		if err := json.Unmarshal([]byte(stream.Current().RawJSON()), &ev); err != nil {
			t.Fatal(err)
		}
		if err := acc.AddEvent(ev); err != nil {
			t.Fatalf("the accumulator refused %s: %v", stream.Current().RawJSON(), err)
		}
		switch ev := stream.Current().AsAny().(type) {
		case responses.ResponseTextDeltaEvent:
			text.WriteString(ev.Delta)
		case responses.ResponseFunctionCallArgumentsDoneEvent:
			args = ev.Arguments
		case responses.ResponseCompletedEvent:
			final = ev.Response
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if text.String() != "Let me check." || args != `{"city":"Seoul"}` || final.OutputText() != "Let me check." ||
		final.Usage.TotalTokens != 9 || final.Output[1].AsFunctionCall().CallID != "call_abc" {
		t.Errorf("text %q args %q final %s", text.String(), args, final.RawJSON())
	}
	whole, err := acc.ReconstructedResponse()
	if snap := acc.Snapshot(); err != nil || whole.OutputText() != "Let me check." || snap.TerminalEvent != "response.completed" ||
		len(snap.Output) != 2 || snap.Output[1].Arguments != `{"city":"Seoul"}` || snap.Output[1].CallID != "call_abc" {
		t.Errorf("accumulated %+v, %v", snap, err)
	}
}

// P2: errors reach the SDK as its own: before output an *openai.Error with
// the status and code, streamed or not; after output the stream's error.
func TestOfficialClientSeesResponsesErrors(t *testing.T) {
	params := responses.ResponseNewParams{Model: "m1", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("hi")}}
	refusal := &ft.Dispatcher{StartErr: &sched.RefusalError{Reason: sched.ReasonQueueFull, Model: "m1", RetryAfter: time.Second}}
	c, _ := officialClient(t, refusal)
	var apiErr *openai.Error
	if _, err := c.Responses.New(t.Context(), params); !errors.As(err, &apiErr) ||
		apiErr.StatusCode != http.StatusTooManyRequests || apiErr.Code != "queue_full" {
		t.Errorf("refusal: %v", err)
	}
	stream := c.Responses.NewStreaming(t.Context(), params)
	for stream.Next() {
		t.Error("an event of a refused request")
	}
	if !errors.As(stream.Err(), &apiErr) || apiErr.StatusCode != http.StatusTooManyRequests {
		t.Errorf("refusal, streamed: %v", stream.Err())
	}

	c, _ = officialClient(t, &ft.Dispatcher{Events: []ft.Step{ft.Text("Hel"),
		ft.Ended(wirepb.RunEventType_RUN_EVENT_TYPE_FAILED, wirepb.FailureKind_FAILURE_KIND_UPSTREAM, "model crashed")}})
	stream = c.Responses.NewStreaming(t.Context(), params)
	var text strings.Builder
	for stream.Next() {
		if ev, ok := stream.Current().AsAny().(responses.ResponseTextDeltaEvent); ok {
			text.WriteString(ev.Delta)
		}
	}
	var se *ssestream.StreamError
	if text.String() != "Hel" || !errors.As(stream.Err(), &se) || !strings.Contains(se.Error(), "upstream") ||
		!strings.Contains(se.Error(), "model crashed") {
		t.Errorf("text %q, stream error %v", text.String(), stream.Err())
	}
}
