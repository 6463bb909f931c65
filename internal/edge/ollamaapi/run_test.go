package ollamaapi

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/ollama/ollama/api"

	"github.com/iop-dev/iop/internal/edge/gateway"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// Events a run script is made of.
func text(s string) runStep {
	return runStep{ev: &wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_TEXT_DELTA, Text: s}}
}
func thought(s string) runStep {
	return runStep{ev: &wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_REASONING_DELTA, Text: s}}
}
func callFragment(i int32, name, args string) runStep {
	return runStep{ev: &wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_TOOL_CALL_DELTA,
		ToolCall: &wirepb.ToolCall{Index: i, Name: name, ArgumentsJson: []byte(args)}}}
}
func used(prompt, completion int64) runStep {
	return runStep{ev: &wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_USAGE,
		Usage: &wirepb.Usage{PromptTokens: prompt, CompletionTokens: completion, EvalDurationNs: 1e6}}}
}
func finished(reason string) runStep {
	return runStep{ev: &wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED, DoneReason: reason}}
}
func failed(kind wirepb.FailureKind, msg string) runStep {
	return runStep{ev: &wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_FAILED, Failure: &wirepb.Failure{Kind: kind, Message: msg}}}
}

// P2, issue 11: a model that no Ollama server serves (here an
// OpenAI-compatible one) answers the official Ollama client's chat as a
// normalized run written in Ollama's NDJSON: content and thinking as they
// come, the tool call whole (its fragments gathered, arguments an object),
// then done:true with the reason and the counts. The request became a run
// request with the messages, tools and options.
func TestChatOnAModelNoOllamaServesIsANormalizedRun(t *testing.T) {
	f := &fakeRunner{inventory: []gateway.Offering{offering("qwen3-8b", "openai")},
		events: []runStep{thought("hmm"), text("Let me "), text("check."), callFragment(0, "get_weather", `{"city":`),
			callFragment(0, "", `"Seoul"}`), used(12, 5), finished("tool_calls")}}
	c, _ := officialClient(t, f)
	var got []api.ChatResponse
	err := c.Chat(t.Context(), &api.ChatRequest{Model: "qwen3-8b", Tools: api.Tools{weatherTool},
		Messages: []api.Message{{Role: "system", Content: "be brief"}, {Role: "user", Content: "weather in Seoul?"}},
		Options:  map[string]any{"temperature": 0.2, "top_k": 40, "num_predict": 64, "num_ctx": 8192}},
		func(r api.ChatResponse) error { got = append(got, r); return nil })
	if err != nil {
		t.Fatal(err)
	}
	var content, thinking strings.Builder
	var calls []api.ToolCall
	for _, r := range got {
		content.WriteString(r.Message.Content)
		thinking.WriteString(r.Message.Thinking)
		calls = append(calls, r.Message.ToolCalls...)
	}
	last := got[len(got)-1]
	if content.String() != "Let me check." || thinking.String() != "hmm" || !last.Done || last.DoneReason != "stop" ||
		last.PromptEvalCount != 12 || last.EvalCount != 5 || last.TotalDuration <= 0 || last.Model != "qwen3-8b" {
		t.Errorf("content %q thinking %q last %+v", content.String(), thinking.String(), last)
	}
	if len(calls) != 1 || calls[0].Function.Name != "get_weather" {
		t.Fatalf("tool calls %+v", calls)
	}
	if city, _ := calls[0].Function.Arguments.Get("city"); city != "Seoul" {
		t.Errorf("tool call arguments %v", calls[0].Function.Arguments)
	}
	req := f.runReqs[0]
	o := req.GetOptions()
	if len(req.GetMessages()) != 2 || len(req.GetTools()) != 1 || o.GetTemperature() != 0.2 || o.GetMaxTokens() != 64 ||
		!strings.Contains(string(o.GetExtraJson()), `"top_k":40`) || strings.Contains(string(o.GetExtraJson()), "num_ctx") {
		t.Errorf("run request %v", req)
	}
	if len(f.tunnels) != 0 {
		t.Error("a model no Ollama server serves was tunnelled")
	}
}

// Generate, streamed and not, on such a model; a "load" call (no prompt)
// answers done_reason load without running anything.
func TestGenerateOnAModelNoOllamaServes(t *testing.T) {
	steps := []runStep{text("4"), used(3, 1), finished("stop")}
	f := &fakeRunner{inventory: []gateway.Offering{offering("sim-small", "simulator")}, events: steps}
	c, _ := officialClient(t, f)
	var out strings.Builder
	var last api.GenerateResponse
	if err := c.Generate(t.Context(), &api.GenerateRequest{Model: "sim-small", Prompt: "2+2?", System: "math"},
		func(r api.GenerateResponse) error { out.WriteString(r.Response); last = r; return nil }); err != nil {
		t.Fatal(err)
	}
	if out.String() != "4" || !last.Done || last.EvalCount != 1 {
		t.Errorf("streamed: %q %+v", out.String(), last)
	}
	if msgs := f.runReqs[0].GetMessages(); len(msgs) != 2 || msgs[0].GetRole() != "system" || msgs[1].GetContent() != "2+2?" {
		t.Errorf("messages %v", msgs)
	}
	no := false
	var whole []api.GenerateResponse
	if err := c.Generate(t.Context(), &api.GenerateRequest{Model: "sim-small", Prompt: "2+2?", Stream: &no},
		func(r api.GenerateResponse) error { whole = append(whole, r); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(whole) != 1 || whole[0].Response != "4" || !whole[0].Done {
		t.Errorf("not streamed: %+v", whole)
	}
	var load []api.GenerateResponse
	if err := c.Generate(t.Context(), &api.GenerateRequest{Model: "sim-small"},
		func(r api.GenerateResponse) error { load = append(load, r); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(load) != 1 || load[0].DoneReason != "load" || len(f.runReqs) != 2 {
		t.Errorf("load: %+v, runs %d", load, len(f.runReqs))
	}
}

// P1, issue 11: a model nobody offers is the client's 404 StatusError,
// streamed or not, load call included; a known model nobody can serve now
// is 503. /api/show of a model no Ollama server serves says what is known.
func TestUnknownAndUnavailableModelsOnTheRunPath(t *testing.T) {
	f := &fakeRunner{inventory: []gateway.Offering{offering("sim-small", "simulator")}, unknown: []string{"ghost"}}
	c, _ := officialClient(t, f)
	for _, stream := range []bool{true, false} {
		err := c.Chat(t.Context(), &api.ChatRequest{Model: "ghost", Stream: &stream, Messages: []api.Message{{Role: "user", Content: "hi"}}},
			func(api.ChatResponse) error { return nil })
		var se api.StatusError
		if !errors.As(err, &se) || se.StatusCode != http.StatusNotFound || se.ErrorMessage != "model 'ghost' not found" {
			t.Errorf("unknown model (stream %v): %#v", stream, err)
		}
	}
	err := c.Generate(t.Context(), &api.GenerateRequest{Model: "ghost"}, func(api.GenerateResponse) error { return nil })
	var se api.StatusError
	if !errors.As(err, &se) || se.StatusCode != http.StatusNotFound {
		t.Errorf("load of an unknown model: %#v", err)
	}
	if _, err := c.Show(t.Context(), &api.ShowRequest{Model: "gone"}); !errors.As(err, &se) || se.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("show of a known model nobody serves now: %#v", err)
	}
	show, err := c.Show(t.Context(), &api.ShowRequest{Model: "sim-small"})
	if err != nil || len(show.Capabilities) == 0 || show.Capabilities[0] != "completion" {
		t.Errorf("show of a served model: %+v, %v", show, err)
	}
}

// A run that fails after output ends with an error line the client
// reports: never a silent end. One that fails before is an HTTP error.
func TestARunThatFailsEndsWithAnErrorLine(t *testing.T) {
	f := &fakeRunner{inventory: []gateway.Offering{offering("m", "openai")},
		events: []runStep{text("partial"), failed(wirepb.FailureKind_FAILURE_KIND_UPSTREAM, "upstream reset")}}
	c, _ := officialClient(t, f)
	var out strings.Builder
	err := c.Chat(t.Context(), &api.ChatRequest{Model: "m", Messages: []api.Message{{Role: "user", Content: "hi"}}},
		func(r api.ChatResponse) error { out.WriteString(r.Message.Content); return nil })
	if err == nil || !strings.Contains(err.Error(), "upstream reset") || out.String() != "partial" {
		t.Errorf("after output: %v (content %q)", err, out.String())
	}
	f.events = []runStep{failed(wirepb.FailureKind_FAILURE_KIND_RATE_LIMITED, "slow down")}
	err = c.Chat(t.Context(), &api.ChatRequest{Model: "m", Messages: []api.Message{{Role: "user", Content: "hi"}}},
		func(api.ChatResponse) error { return nil })
	var se api.StatusError
	if !errors.As(err, &se) || se.StatusCode != http.StatusTooManyRequests {
		t.Errorf("before output: %#v", err)
	}
}
