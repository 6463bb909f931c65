package ollamaapi

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/iop-dev/iop/internal/edge/dispatch"
	"github.com/iop-dev/iop/internal/edge/frontend"
	ft "github.com/iop-dev/iop/internal/edge/frontend/frontendtest"

	"github.com/ollama/ollama/api"

	"github.com/iop-dev/iop/internal/edge/sched"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// These tests put the official Ollama Go client, which nobody here wrote,
// in front of the handler: what it makes of the answers is what Ollama
// clients (and the ollama CLI, built on it) see.

// bearer adds the Edge key to every request, as a client configured with
// extra headers does: the official client has no option for a key of its
// own.
type bearer struct{ key string }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.key)
	return http.DefaultTransport.RoundTrip(r)
}

func officialClient(t *testing.T, f *ft.Dispatcher) (*api.Client, *env) {
	t.Helper()
	e := newEnv(t, f)
	srv := httptest.NewServer(e.handler)
	t.Cleanup(srv.Close)
	u, err := url.Parse(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	return api.NewClient(u, &http.Client{Transport: bearer{testKey}}), e
}

var weatherTool = api.Tool{Type: "function", Function: api.ToolFunction{
	Name: "get_weather", Description: "weather now",
	Parameters: api.ToolFunctionParameters{Type: "object", Required: []string{"city"},
		Properties: func() *api.ToolPropertiesMap {
			m := api.NewToolPropertiesMap()
			m.Set("city", api.ToolProperty{Type: api.PropertyType{"string"}})
			return m
		}()},
}}

func TestOfficialClientStreamsChatWithToolCalls(t *testing.T) {
	c, e := officialClient(t, &ft.Dispatcher{Pieces: []ft.Step{
		ft.Line(`{"model":"m1","created_at":"2026-01-01T00:00:00Z","message":{"role":"assistant","content":"Let me"},"done":false}`),
		ft.Line(`{"model":"m1","created_at":"2026-01-01T00:00:00Z","message":{"role":"assistant","content":" check."},"done":false}`),
		ft.Line(`{"model":"m1","created_at":"2026-01-01T00:00:00Z","message":{"role":"assistant","content":"","tool_calls":[{"function":{"index":0,"name":"get_weather","arguments":{"city":"Seoul"}}}]},"done":false}`),
		ft.Line(`{"model":"m1","created_at":"2026-01-01T00:00:00Z","message":{"role":"assistant","content":""},"done":true,"done_reason":"stop","prompt_eval_count":11,"eval_count":9}`),
	}})
	var chunks int
	var content strings.Builder
	var calls []api.ToolCall
	var last api.ChatResponse
	err := c.Chat(t.Context(), &api.ChatRequest{
		Model:    "m1",
		Messages: []api.Message{{Role: "user", Content: "weather in Seoul?"}},
		Tools:    api.Tools{weatherTool},
	}, func(r api.ChatResponse) error {
		chunks++
		content.WriteString(r.Message.Content)
		calls = append(calls, r.Message.ToolCalls...)
		last = r
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if chunks != 4 || content.String() != "Let me check." || !last.Done || last.DoneReason != "stop" || last.EvalCount != 9 {
		t.Errorf("%d chunks, content %q, last %+v", chunks, content.String(), last)
	}
	if len(calls) != 1 || calls[0].Function.Name != "get_weather" {
		t.Fatalf("tool calls %+v", calls)
	}
	if city, _ := calls[0].Function.Arguments.Get("city"); city != "Seoul" {
		t.Errorf("arguments %v", calls[0].Function.Arguments.ToMap())
	}
	// What the client sent reached the provider as it was sent.
	s := e.runner.Start(t)
	var sent struct {
		Model string
		Tools []struct{ Function struct{ Name string } }
	}
	if err := json.Unmarshal(s.Body, &sent); err != nil || sent.Model != "m1" || len(sent.Tools) != 1 ||
		sent.Tools[0].Function.Name != "get_weather" || s.Req.GetPath() != "/api/chat" {
		t.Errorf("sent %s to %q (%v)", s.Body, s.Req.GetPath(), err)
	}
}

func TestOfficialClientStreamsGenerate(t *testing.T) {
	c, _ := officialClient(t, &ft.Dispatcher{Pieces: []ft.Step{
		ft.Line(`{"model":"m1","response":"Hel","done":false}`),
		ft.Line(`{"model":"m1","response":"lo","done":false}`),
		ft.Line(`{"model":"m1","response":"","done":true,"done_reason":"stop"}`),
	}})
	var got strings.Builder
	err := c.Generate(t.Context(), &api.GenerateRequest{Model: "m1", Prompt: "hi"}, func(r api.GenerateResponse) error {
		got.WriteString(r.Response)
		return nil
	})
	if err != nil || got.String() != "Hello" {
		t.Fatalf("generate %q, %v", got.String(), err)
	}
}

func TestOfficialClientListsShowsAndVersions(t *testing.T) {
	c, _ := officialClient(t, &ft.Dispatcher{
		Head:   &wirepb.TunnelResponseHead{Status: 200, Headers: []*wirepb.Header{{Name: "Content-Type", Value: "application/json; charset=utf-8"}}},
		Pieces: []ft.Step{{Data: `{"modelfile":"FROM m1","details":{"family":"llama","parameter_size":"3B"},"capabilities":["completion","tools"]}`}},
		Offerings: []dispatch.Offering{ft.Offer("qwen3:8b", "ollama"),
			{ID: "llama3.2:latest", Candidates: []sched.Candidate{{NodeID: "n2", Provider: "ollama", Adapter: "ollama", Target: "llama3.2:latest"}}},
			ft.Offer("m1", "ollama")},
		Replies: map[string][]dispatch.MetadataReply{
			"/api/tags": {reply("n1", `{"models":[{"name":"qwen3:8b","model":"qwen3:8b","size":5},{"name":"m1","model":"m1"}]}`),
				reply("n2", `{"models":[{"name":"llama3.2:latest","model":"llama3.2:latest","size":2}]}`)},
			"/api/ps":      {reply("n1", `{"models":[{"name":"qwen3:8b","model":"qwen3:8b","size_vram":7}]}`)},
			"/api/version": {reply("n1", `{"version":"0.17.4"}`)},
		},
	})
	if err := c.Heartbeat(t.Context()); err != nil {
		t.Errorf("heartbeat: %v", err)
	}
	list, err := c.List(t.Context())
	if err != nil || len(list.Models) != 3 || list.Models[0].Name != "llama3.2:latest" || list.Models[2].Size != 5 {
		t.Errorf("list %+v, %v", list, err)
	}
	ps, err := c.ListRunning(t.Context())
	if err != nil || len(ps.Models) != 1 || ps.Models[0].SizeVRAM != 7 {
		t.Errorf("ps %+v, %v", ps, err)
	}
	show, err := c.Show(t.Context(), &api.ShowRequest{Model: "m1"})
	if err != nil || show.Details.Family != "llama" || len(show.Capabilities) != 2 {
		t.Errorf("show %+v, %v", show, err)
	}
	v, err := c.Version(t.Context())
	if err != nil || v != "0.17.4" {
		t.Errorf("version %q, %v", v, err)
	}
}

// TestOfficialClientSeesMidStreamFailure (issue 4): a tunnel that fails
// after output is an error from Chat, not a success that just stopped.
func TestOfficialClientSeesMidStreamFailure(t *testing.T) {
	c, _ := officialClient(t, &ft.Dispatcher{
		Pieces: []ft.Step{ft.Line(`{"model":"m1","message":{"role":"assistant","content":"Hel"},"done":false}`)},
		End:    ft.TunnelEnd(wirepb.TunnelOutcome_TUNNEL_OUTCOME_DISCONNECTED, wirepb.FailureKind_FAILURE_KIND_PROVIDER_UNAVAILABLE, "node lost"),
	})
	var content strings.Builder
	err := c.Chat(t.Context(), &api.ChatRequest{Model: "m1", Messages: []api.Message{{Role: "user", Content: "hi"}}},
		func(r api.ChatResponse) error { content.WriteString(r.Message.Content); return nil })
	if err == nil || err.Error() != "the Node running the request was lost: node lost" {
		t.Fatalf("err = %v, want the failure", err)
	}
	if content.String() != "Hel" {
		t.Errorf("content before the error %q", content.String())
	}
}

// TestOfficialClientSeesErrorsBeforeOutput: refusals and a forbidden model
// are StatusErrors with the status and message.
func TestOfficialClientSeesErrorsBeforeOutput(t *testing.T) {
	tests := []struct {
		name   string
		runner *ft.Dispatcher
		status int
		msg    string
	}{
		{"queue full", &ft.Dispatcher{StartErr: &sched.RefusalError{Reason: sched.ReasonQueueFull, Model: "m1"}}, 429, `queue full for model "m1"`},
		{"no candidate", &ft.Dispatcher{StartErr: &sched.RefusalError{Reason: sched.ReasonNoCandidate, Model: "m1"}}, 503, `no candidate for model "m1"`},
		{"forbidden", &ft.Dispatcher{Forbidden: []string{"m1"}}, 404, `model 'm1' not found`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, _ := officialClient(t, tt.runner)
			err := c.Chat(t.Context(), &api.ChatRequest{Model: "m1", Messages: []api.Message{{Role: "user", Content: "hi"}}},
				func(api.ChatResponse) error { t.Error("a chunk was delivered"); return nil })
			var se api.StatusError
			if !errors.As(err, &se) || se.StatusCode != tt.status || se.ErrorMessage != tt.msg {
				t.Errorf("err = %#v", err)
			}
			_, err = c.Show(t.Context(), &api.ShowRequest{Model: "m1"})
			if !errors.As(err, &se) || se.StatusCode != tt.status {
				t.Errorf("show err = %#v", err)
			}
		})
	}
}

// TestOfficialClientSeesStreamWithoutDoneLine (R3, issue 10 item 8): a
// provider stream that just stops, its tunnel completed, is an error from
// Chat and Generate (the client alone would report success), after the
// chunks that came.
func TestOfficialClientSeesStreamWithoutDoneLine(t *testing.T) {
	c, _ := officialClient(t, &ft.Dispatcher{Pieces: []ft.Step{
		ft.Line(`{"model":"m1","created_at":"2026-01-01T00:00:00Z","message":{"role":"assistant","content":"Hel"},"response":"Hel","done":false}`),
	}})
	var content strings.Builder
	err := c.Chat(t.Context(), &api.ChatRequest{Model: "m1", Messages: []api.Message{{Role: "user", Content: "hi"}}},
		func(r api.ChatResponse) error { content.WriteString(r.Message.Content); return nil })
	if err == nil || err.Error() != frontend.IncompleteStream(missingDone).Message {
		t.Errorf("chat err = %v, want %q", err, frontend.IncompleteStream(missingDone).Message)
	}
	if content.String() != "Hel" {
		t.Errorf("content before the error %q", content.String())
	}
	err = c.Generate(t.Context(), &api.GenerateRequest{Model: "m1", Prompt: "hi"}, func(api.GenerateResponse) error { return nil })
	if err == nil || err.Error() != frontend.IncompleteStream(missingDone).Message {
		t.Errorf("generate err = %v, want %q", err, frontend.IncompleteStream(missingDone).Message)
	}
}

// TestOfficialClientThroughAnAliasRoute (P2, issue 10 item 8): a client
// asking for "fast", on a route whose target is "llama3.2:latest", gets
// every chunk named "fast", while the provider was asked for the target.
func TestOfficialClientThroughAnAliasRoute(t *testing.T) {
	c, e := officialClient(t, &ft.Dispatcher{Targets: []string{"llama3.2:latest"}, Pieces: []ft.Step{
		ft.Line(`{"model":"llama3.2:latest","created_at":"2026-01-01T00:00:00Z","message":{"role":"assistant","content":"Hi"},"done":false}`),
		ft.Line(`{"model":"llama3.2:latest","created_at":"2026-01-01T00:00:00Z","message":{"role":"assistant","content":""},"done":true,"done_reason":"stop"}`),
	}})
	var models []string
	err := c.Chat(t.Context(), &api.ChatRequest{Model: "fast", Messages: []api.Message{{Role: "user", Content: "hi"}}},
		func(r api.ChatResponse) error { models = append(models, r.Model); return nil })
	if err != nil || strings.Join(models, ",") != "fast,fast" {
		t.Errorf("chunks named %v, %v; want fast,fast", models, err)
	}
	s := e.runner.Start(t)
	var sent api.ChatRequest
	if err := json.Unmarshal(s.Body, &sent); err != nil || sent.Model != "llama3.2:latest" || len(sent.Messages) != 1 || sent.Messages[0].Content != "hi" {
		t.Errorf("the provider got %s (%v)", s.Body, err)
	}
}
