package anthropicapi

import (
	"encoding/base64"
	"fmt"
	"net/http"
	"strings"
	"testing"

	ft "github.com/iop-dev/iop/internal/edge/frontend/frontendtest"

	"google.golang.org/protobuf/proto"

	"github.com/iop-dev/iop/quicwire/wirepb"
)

func ptr[T any](v T) *T { return &v }

// P2: a Messages request becomes the normalized run (R2) every provider
// serves: the system prompt first, tool results as tool messages that
// answer their calls, options in the run's fields.
func TestRequestTranslation(t *testing.T) {
	png := []byte("\x89PNG fake")
	img := base64.StdEncoding.EncodeToString(png)
	tests := []struct {
		name string
		body string
		want *wirepb.RunRequest
	}{
		{"string content and a string system prompt",
			`{"model":"m1","max_tokens":10,"system":"be brief","messages":[{"role":"user","content":"hi"}]}`,
			&wirepb.RunRequest{Messages: []*wirepb.ChatMessage{{Role: "system", Content: "be brief"}, {Role: "user", Content: "hi"}},
				Options: &wirepb.RunOptions{MaxTokens: ptr[int64](10)}}},
		{"system and content as text blocks, an image",
			`{"model":"m1","max_tokens":10,"system":[{"type":"text","text":"a","cache_control":{"type":"ephemeral"}},{"type":"text","text":"b"}],
			  "messages":[{"role":"user","content":[{"type":"text","text":"look"},{"type":"image","source":{"type":"base64","media_type":"image/png","data":"` + img + `"}},{"type":"text","text":"here"}]}]}`,
			&wirepb.RunRequest{Messages: []*wirepb.ChatMessage{{Role: "system", Content: "a\n\nb"},
				{Role: "user", Content: "look\n\nhere", Images: [][]byte{png}}},
				Options: &wirepb.RunOptions{MaxTokens: ptr[int64](10)}}},
		{"a tool_use round trip",
			`{"model":"m1","max_tokens":10,
			  "tools":[{"name":"get_weather","description":"weather now","input_schema":{"type":"object"}}],
			  "messages":[{"role":"user","content":"weather?"},
			    {"role":"assistant","content":[{"type":"thinking","thinking":"need a tool","signature":"sig"},{"type":"text","text":"Checking."},
			      {"type":"tool_use","id":"toolu_1","name":"get_weather","input":{"city":"Seoul"}},{"type":"tool_use","id":"toolu_2","name":"get_weather","input":{}}]},
			    {"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":"sunny"},
			      {"type":"tool_result","tool_use_id":"toolu_2","is_error":true,"content":[{"type":"text","text":"no city"},{"type":"image","source":{"type":"base64","media_type":"image/png","data":"` + img + `"}}]},
			      {"type":"text","text":"and now?"}]}]}`,
			&wirepb.RunRequest{Messages: []*wirepb.ChatMessage{
				{Role: "user", Content: "weather?"},
				{Role: "assistant", Content: "Checking.", Reasoning: "need a tool", ToolCalls: []*wirepb.ToolCall{
					{Index: 0, Id: "toolu_1", Name: "get_weather", ArgumentsJson: []byte(`{"city":"Seoul"}`)},
					{Index: 1, Id: "toolu_2", Name: "get_weather", ArgumentsJson: []byte(`{}`)}}},
				{Role: "tool", ToolCallId: "toolu_1", Name: "get_weather", Content: "sunny"},
				{Role: "tool", ToolCallId: "toolu_2", Name: "get_weather", Content: "Error: no city"},
				{Role: "user", Content: "and now?", Images: [][]byte{png}}},
				Tools:   []*wirepb.Tool{{Name: "get_weather", Description: "weather now", ParametersJson: []byte(`{"type":"object"}`)}},
				Options: &wirepb.RunOptions{MaxTokens: ptr[int64](10)}}},
		{"options: sampling, top_k, stops, thinking, tool_choice, format; metadata ignored",
			`{"model":"m1","max_tokens":99,"temperature":0.2,"top_p":0.9,"top_k":40,"stop_sequences":["END","\n\n"],
			  "thinking":{"type":"enabled","budget_tokens":2048},"metadata":{"user_id":"u1"},"service_tier":"auto",
			  "tools":[{"name":"f","input_schema":{"type":"object"}}],"tool_choice":{"type":"tool","name":"f","disable_parallel_tool_use":true},
			  "output_config":{"format":{"type":"json_schema","schema":{"type":"object"}}},
			  "messages":[{"role":"user","content":"hi"}]}`,
			&wirepb.RunRequest{Messages: []*wirepb.ChatMessage{{Role: "user", Content: "hi"}},
				Tools: []*wirepb.Tool{{Name: "f", ParametersJson: []byte(`{"type":"object"}`)}},
				Options: &wirepb.RunOptions{MaxTokens: ptr[int64](99), Temperature: ptr(0.2), TopP: ptr(0.9),
					ExtraJson: []byte(`{"top_k":40}`), Stop: []string{"END", "\n\n"}, Think: ptr(true),
					ToolChoice: "function:f", Format: []byte(`{"type":"object"}`)}}},
		{"thinking disabled, tool_choice any",
			`{"model":"m1","max_tokens":5,"thinking":{"type":"disabled"},"tools":[{"name":"f","type":"custom"}],"tool_choice":{"type":"any"},
			  "messages":[{"role":"user","content":"hi"}]}`,
			&wirepb.RunRequest{Messages: []*wirepb.ChatMessage{{Role: "user", Content: "hi"}},
				Tools:   []*wirepb.Tool{{Name: "f"}},
				Options: &wirepb.RunOptions{MaxTokens: ptr[int64](5), Think: ptr(false), ToolChoice: "required"}}},
		{"adaptive thinking leaves it to the provider, tool_choice none",
			`{"model":"m1","max_tokens":5,"thinking":{"type":"adaptive"},"tools":[{"name":"f"}],"tool_choice":{"type":"none"},
			  "messages":[{"role":"user","content":"hi"}]}`,
			&wirepb.RunRequest{Messages: []*wirepb.ChatMessage{{Role: "user", Content: "hi"}},
				Tools:   []*wirepb.Tool{{Name: "f"}},
				Options: &wirepb.RunOptions{MaxTokens: ptr[int64](5), ToolChoice: "none"}}},
		{"redacted thinking is dropped",
			`{"model":"m1","max_tokens":5,"messages":[{"role":"user","content":"hi"},
			  {"role":"assistant","content":[{"type":"redacted_thinking","data":"xyz"},{"type":"text","text":"hello"}]},{"role":"user","content":"again"}]}`,
			&wirepb.RunRequest{Messages: []*wirepb.ChatMessage{{Role: "user", Content: "hi"}, {Role: "assistant", Content: "hello"}, {Role: "user", Content: "again"}},
				Options: &wirepb.RunOptions{MaxTokens: ptr[int64](5)}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, &ft.Dispatcher{Events: []ft.Step{ft.Completed("stop")}})
			if w := e.post(tt.body); w.Code != http.StatusOK {
				t.Fatalf("status %d: %s", w.Code, w.Body)
			}
			if got := e.runner.RunRequest(t); !proto.Equal(got, tt.want) {
				t.Errorf("run request\n got %v\nwant %v", got, tt.want)
			}
		})
	}
}

// Requests the Edge cannot run are 400 invalid_request_error naming the
// field, before any run starts.
func TestInvalidRequests(t *testing.T) {
	msgs := `"messages":[{"role":"user","content":"hi"}]`
	tests := []struct {
		name, body, field string
	}{
		{"not JSON", `{"model":`, ""},
		{"no model", `{"max_tokens":5,` + msgs + `}`, "model"},
		{"no max_tokens", `{"model":"m1",` + msgs + `}`, "max_tokens"},
		{"max_tokens zero", `{"model":"m1","max_tokens":0,` + msgs + `}`, "max_tokens"},
		{"no messages", `{"model":"m1","max_tokens":5,"messages":[]}`, "messages"},
		{"system role", `{"model":"m1","max_tokens":5,"messages":[{"role":"system","content":"x"}]}`, "messages.0.role"},
		{"image URL", `{"model":"m1","max_tokens":5,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"url","url":"http://x/y.png"}}]}]}`,
			"messages.0.content.0.source.type"},
		{"image not base64", `{"model":"m1","max_tokens":5,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","data":"@@"}}]}]}`,
			"messages.0.content.0.source.data"},
		{"document block", `{"model":"m1","max_tokens":5,"messages":[{"role":"user","content":[{"type":"document","source":{}}]}]}`,
			"messages.0.content.0.type"},
		{"tool_use from the user", `{"model":"m1","max_tokens":5,"messages":[{"role":"user","content":[{"type":"tool_use","id":"a","name":"f","input":{}}]}]}`,
			"messages.0.content.0.type"},
		{"tool_result without its id", `{"model":"m1","max_tokens":5,"messages":[{"role":"user","content":[{"type":"tool_result","content":"x"}]}]}`,
			"messages.0.content.0.tool_use_id"},
		{"server tool", `{"model":"m1","max_tokens":5,"tools":[{"type":"web_search_20250305","name":"web_search"}],` + msgs + `}`, "tools.0.type"},
		{"tool_choice of an unknown tool", `{"model":"m1","max_tokens":5,"tools":[{"name":"f"}],"tool_choice":{"type":"tool","name":"g"},` + msgs + `}`,
			"tool_choice.name"},
		{"tool_choice any without tools", `{"model":"m1","max_tokens":5,"tool_choice":{"type":"any"},` + msgs + `}`, "tool_choice"},
		{"temperature above 1", `{"model":"m1","max_tokens":5,"temperature":1.5,` + msgs + `}`, "temperature"},
		{"unknown thinking", `{"model":"m1","max_tokens":5,"thinking":{"type":"deep"},` + msgs + `}`, "thinking.type"},
		{"content of the wrong type", `{"model":"m1","max_tokens":5,"messages":[{"role":"user","content":5}]}`, "messages.0.content"},
		{"a message field of the wrong type", `{"model":"m1","max_tokens":5,"messages":[{"role":5,"content":"x"}]}`, "messages.0.role"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, &ft.Dispatcher{})
			w := e.post(tt.body)
			if w.Code != http.StatusBadRequest {
				t.Fatalf("status %d, want 400: %s", w.Code, w.Body)
			}
			b := errorBodyOf(t, w.Body.String())
			if b.Error.Type != typeInvalidRequest || !strings.HasPrefix(b.Error.Message, tt.field) {
				t.Errorf("error %+v, want invalid_request_error about %q", b.Error, tt.field)
			}
			if len(e.runner.RunRequests()) != 0 {
				t.Error("a run started")
			}
		})
	}
}

// P3: lists are bounded as they are decoded, and a run that would not fit
// its frame is 413 request_too_large.
func TestBounds(t *testing.T) {
	many := strings.Repeat(`{"role":"user","content":"x"},`, MaxMessages) + `{"role":"user","content":"x"}`
	e := newEnv(t, &ft.Dispatcher{})
	w := e.post(`{"model":"m1","max_tokens":5,"messages":[` + many + `]}`)
	if b := errorBodyOf(t, w.Body.String()); w.Code != http.StatusBadRequest || !strings.Contains(b.Error.Message, fmt.Sprint(MaxMessages)) {
		t.Errorf("too many messages: %d %s", w.Code, w.Body)
	}
	big := strings.Repeat("x", 700<<10)
	w = e.post(`{"model":"m1","max_tokens":5,"messages":[{"role":"user","content":"` + big + `"},{"role":"user","content":"` + big + `"}]}`)
	if b := errorBodyOf(t, w.Body.String()); w.Code != http.StatusRequestEntityTooLarge || b.Error.Type != typeTooLarge {
		t.Errorf("run past the frame: %d %s", w.Code, w.Body)
	}
	w = e.post(`{"model":"m1","max_tokens":5,"messages":[{"role":"user","content":"` + strings.Repeat("x", MaxRequestBytes) + `"}]}`)
	if b := errorBodyOf(t, w.Body.String()); w.Code != http.StatusRequestEntityTooLarge || b.Error.Type != typeTooLarge {
		t.Errorf("body past the cap: %d %s", w.Code, w.Body)
	}
	if len(e.runner.RunRequests()) != 0 {
		t.Error("a run started")
	}
}
