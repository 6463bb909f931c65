package integration

import (
	"errors"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/ollama/ollama/api"

	"github.com/iop-dev/iop/internal/fakes/fakeollama"
)

func (s *stack) ollama(t *testing.T) *api.Client {
	u, err := url.Parse(s.base)
	if err != nil {
		t.Fatal(err)
	}
	return api.NewClient(u, http.DefaultClient)
}

// The official Ollama Go client, unchanged, against the Edge (as the
// ollama CLI with OLLAMA_HOST would be): streaming chat with a tool call,
// the model list merged from the Nodes, show, version, and errors.
func TestOfficialOllamaClientThroughTheEdge(t *testing.T) {
	models := append(fakeModels(), fakeollama.Model{Name: "flaky:latest", TokenCount: 10, ErrorMessage: "out of memory", ErrorAfter: 3})
	s := startStack(t, models...)
	c := s.ollama(t)

	var text strings.Builder
	var calls []api.ToolCall
	var last api.ChatResponse
	chunks := 0
	stream := true
	err := c.Chat(t.Context(), &api.ChatRequest{
		Model:    "llama3.2",
		Stream:   &stream,
		Messages: []api.Message{{Role: "user", Content: "Why is the sky blue?"}},
		Tools:    api.Tools{{Type: "function", Function: api.ToolFunction{Name: "get_weather", Description: "weather"}}},
	}, func(r api.ChatResponse) error {
		chunks++
		text.WriteString(r.Message.Content)
		calls = append(calls, r.Message.ToolCalls...)
		last = r
		return nil
	})
	if err != nil {
		t.Fatalf("chat: %v", err)
	}
	if text.String() != "The sky is blue because of Rayleigh scattering." || chunks < 5 {
		t.Errorf("text %q in %d chunks", text.String(), chunks)
	}
	if len(calls) != 1 || calls[0].Function.Name != "get_weather" {
		t.Errorf("tool calls %+v", calls)
	}
	if !last.Done || last.EvalCount == 0 || last.DoneReason == "" {
		t.Errorf("final chunk %+v", last)
	}

	list, err := c.List(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range list.Models {
		names = append(names, m.Name)
	}
	if strings.Join(names, ",") != "flaky:latest,llama3.2:latest,slow:latest" {
		t.Errorf("list %v", names)
	}
	if _, err := c.Show(t.Context(), &api.ShowRequest{Model: "llama3.2"}); err != nil {
		t.Errorf("show: %v", err)
	}
	if v, err := c.Version(t.Context()); err != nil || v == "" {
		t.Errorf("version %q %v", v, err)
	}

	// A failure after output started is an error, not a silent success.
	err = c.Chat(t.Context(), &api.ChatRequest{Model: "flaky", Messages: []api.Message{{Role: "user", Content: "hi"}}},
		func(api.ChatResponse) error { return nil })
	if err == nil || !strings.Contains(err.Error(), "out of memory") {
		t.Errorf("mid-stream failure: %v, want the provider's error", err)
	}
	// P1, issue 11: a model no Node offers and no route names is 404 with
	// Ollama's own message (the CLI offers to pull on it), streamed or not.
	for _, stream := range []bool{true, false} {
		err = c.Chat(t.Context(), &api.ChatRequest{Model: "nope", Stream: &stream, Messages: []api.Message{{Role: "user", Content: "hi"}}},
			func(api.ChatResponse) error { return nil })
		var se api.StatusError
		if !errors.As(err, &se) || se.StatusCode != http.StatusNotFound || se.ErrorMessage != "model 'nope' not found" {
			t.Errorf("unknown model (stream %v): %#v, want a 404 StatusError \"model 'nope' not found\"", stream, err)
		}
	}
}
