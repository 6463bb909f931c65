package ollamaapi

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/iop-dev/iop/internal/edge/dispatch"
	ft "github.com/iop-dev/iop/internal/edge/frontend/frontendtest"

	"github.com/ollama/ollama/api"

	"github.com/iop-dev/iop/quicwire/wirepb"
)

// used is a usage event with the eval duration Ollama's final line
// reports.
func used(prompt, completion int64) ft.Step {
	s := ft.Usage(prompt, completion)
	s.Event.Usage.EvalDurationNs = 1e6
	return s
}

// P2, issue 11: a model that no Ollama server serves (here an
// OpenAI-compatible one) answers the official Ollama client's chat as a
// normalized run written in Ollama's NDJSON: content and thinking as they
// come, the tool call whole (its fragments gathered, arguments an object),
// then done:true with the reason and the counts. The request became a run
// request with the messages, tools and options.
func TestChatOnAModelNoOllamaServesIsANormalizedRun(t *testing.T) {
	f := &ft.Dispatcher{Offerings: []dispatch.Offering{ft.Offer("qwen3-8b", "openai")},
		Events: []ft.Step{ft.Reasoning("hmm"), ft.Text("Let me "), ft.Text("check."), ft.ToolCall(0, "", "get_weather", `{"city":`),
			ft.ToolCall(0, "", "", `"Seoul"}`), used(12, 5), ft.Completed("tool_calls")}}
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
	req := f.RunRequests()[0]
	o := req.GetOptions()
	if len(req.GetMessages()) != 2 || len(req.GetTools()) != 1 || o.GetTemperature() != 0.2 || o.GetMaxTokens() != 64 ||
		!strings.Contains(string(o.GetExtraJson()), `"top_k":40`) || strings.Contains(string(o.GetExtraJson()), "num_ctx") {
		t.Errorf("run request %v", req)
	}
	if len(f.Tunnels()) != 0 {
		t.Error("a model no Ollama server serves was tunnelled")
	}
}

// Generate, streamed and not, on such a model; a "load" call (no prompt)
// answers done_reason load without running anything.
func TestGenerateOnAModelNoOllamaServes(t *testing.T) {
	steps := []ft.Step{ft.Text("4"), used(3, 1), ft.Completed("stop")}
	f := &ft.Dispatcher{Offerings: []dispatch.Offering{ft.Offer("sim-small", "simulator")}, Events: steps}
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
	if msgs := f.RunRequests()[0].GetMessages(); len(msgs) != 2 || msgs[0].GetRole() != "system" || msgs[1].GetContent() != "2+2?" {
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
	if len(load) != 1 || load[0].DoneReason != "load" || len(f.RunRequests()) != 2 {
		t.Errorf("load: %+v, runs %d", load, len(f.RunRequests()))
	}
}

// P1, issue 11: a model nobody offers is the client's 404 StatusError,
// streamed or not, load call included; a known model nobody can serve now
// is 503. /api/show of a model no Ollama server serves says what is known.
func TestUnknownAndUnavailableModelsOnTheRunPath(t *testing.T) {
	f := &ft.Dispatcher{Offerings: []dispatch.Offering{ft.Offer("sim-small", "simulator")}, Unknown: []string{"ghost"}}
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
	f := &ft.Dispatcher{Offerings: []dispatch.Offering{ft.Offer("m", "openai")},
		Events: []ft.Step{ft.Text("partial"), ft.Failed(wirepb.FailureKind_FAILURE_KIND_UPSTREAM, "upstream reset")}}
	c, _ := officialClient(t, f)
	var out strings.Builder
	err := c.Chat(t.Context(), &api.ChatRequest{Model: "m", Messages: []api.Message{{Role: "user", Content: "hi"}}},
		func(r api.ChatResponse) error { out.WriteString(r.Message.Content); return nil })
	if err == nil || !strings.Contains(err.Error(), "upstream reset") || out.String() != "partial" {
		t.Errorf("after output: %v (content %q)", err, out.String())
	}
	f.Events = []ft.Step{ft.Failed(wirepb.FailureKind_FAILURE_KIND_RATE_LIMITED, "slow down")}
	err = c.Chat(t.Context(), &api.ChatRequest{Model: "m", Messages: []api.Message{{Role: "user", Content: "hi"}}},
		func(api.ChatResponse) error { return nil })
	var se api.StatusError
	if !errors.As(err, &se) || se.StatusCode != http.StatusTooManyRequests {
		t.Errorf("before output: %#v", err)
	}
}
