package anthropicapi

import (
	"encoding/base64"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/iop-dev/iop/internal/edge/frontdoor"
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
					ExtraJson: []byte(`{"top_k":40}`), Stop: []string{"END", "\n\n"}, Think: ptr(true), ReasoningEffort: "low",
					ToolChoice: "function:f", Format: []byte(`{"type":"object"}`)}}},
		{"thinking disabled, tool_choice any",
			`{"model":"m1","max_tokens":5,"thinking":{"type":"disabled"},"tools":[{"name":"f","type":"custom"}],"tool_choice":{"type":"any"},
			  "messages":[{"role":"user","content":"hi"}]}`,
			&wirepb.RunRequest{Messages: []*wirepb.ChatMessage{{Role: "user", Content: "hi"}},
				Tools:   []*wirepb.Tool{{Name: "f"}},
				Options: &wirepb.RunOptions{MaxTokens: ptr[int64](5), Think: ptr(false), ReasoningEffort: "none", ToolChoice: "required"}}},
		{"adaptive thinking is on at the model's default effort, tool_choice none",
			`{"model":"m1","max_tokens":5,"thinking":{"type":"adaptive"},"tools":[{"name":"f"}],"tool_choice":{"type":"none"},
			  "messages":[{"role":"user","content":"hi"}]}`,
			&wirepb.RunRequest{Messages: []*wirepb.ChatMessage{{Role: "user", Content: "hi"}},
				Tools:   []*wirepb.Tool{{Name: "f"}},
				Options: &wirepb.RunOptions{MaxTokens: ptr[int64](5), Think: ptr(true), ToolChoice: "none"}}},
		// Claude Code's shape (issue 21): a system turn after the first user
		// turn, cache_control on every kind of block and on tools, a deferred
		// tool, and the fields the Edge ignores on purpose.
		{"a system turn inside the conversation where it stands; cache_control anywhere",
			`{"model":"m1","max_tokens":32000,"stream":false,
			  "system":[{"type":"text","text":"You are an agent.","cache_control":{"type":"ephemeral"}}],
			  "messages":[{"role":"user","content":[{"type":"text","text":"fix it","cache_control":{"type":"ephemeral","ttl":"1h"}}]},
			    {"role":"system","content":[{"type":"text","text":"cwd: /src"},{"type":"text","text":"os: linux","cache_control":{"type":"ephemeral"}}]},
			    {"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"Read","input":{"path":"a"},"cache_control":{"type":"ephemeral"}}]},
			    {"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":[{"type":"text","text":"x","cache_control":{"type":"ephemeral"}}],"cache_control":{"type":"ephemeral"}}]},
			    {"role":"system","content":"be careful"},
			    {"role":"system","content":[]}],
			  "tools":[{"name":"Read","input_schema":{"type":"object"},"cache_control":{"type":"ephemeral"}},
			    {"name":"Later","input_schema":{"type":"object"},"defer_loading":true,"strict":true}],
			  "metadata":{"user_id":"{\"session_id\":\"s\"}"},"context_management":{"edits":[{"type":"clear_tool_uses_20250919"}]},
			  "service_tier":"auto","container":"c1","speed":"fast","cache_control":{"type":"ephemeral"}}`,
			&wirepb.RunRequest{Messages: []*wirepb.ChatMessage{
				{Role: "system", Content: "You are an agent."},
				{Role: "user", Content: "fix it"},
				{Role: "system", Content: "cwd: /src\n\nos: linux"},
				{Role: "assistant", ToolCalls: []*wirepb.ToolCall{{Id: "t1", Name: "Read", ArgumentsJson: []byte(`{"path":"a"}`)}}},
				{Role: "tool", ToolCallId: "t1", Name: "Read", Content: "x"},
				{Role: "system", Content: "be careful"}},
				Tools: []*wirepb.Tool{{Name: "Read", ParametersJson: []byte(`{"type":"object"}`)},
					{Name: "Later", ParametersJson: []byte(`{"type":"object"}`)}},
				Options: &wirepb.RunOptions{MaxTokens: ptr[int64](32000)}}},
		{"a system turn cleared at the next user turn is shown until one follows",
			`{"model":"m1","max_tokens":5,"messages":[{"role":"user","content":"a"},
			  {"role":"system","clear_at":"next_user_message","content":"old"},{"role":"assistant","content":"b"},{"role":"user","content":"c"},
			  {"role":"system","clear_at":"next_user_message","content":[{"type":"text","text":"new"}]},{"role":"system","clear_at":"never","content":"kept"}]}`,
			&wirepb.RunRequest{Messages: []*wirepb.ChatMessage{{Role: "user", Content: "a"}, {Role: "assistant", Content: "b"},
				{Role: "user", Content: "c"}, {Role: "system", Content: "new"}, {Role: "system", Content: "kept"}},
				Options: &wirepb.RunOptions{MaxTokens: ptr[int64](5)}}},
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
		{"developer role", `{"model":"m1","max_tokens":5,"messages":[{"role":"developer","content":"x"}]}`, "messages.0.role"},
		{"an image in a system turn", `{"model":"m1","max_tokens":5,"messages":[{"role":"user","content":"x"},` +
			`{"role":"system","content":[{"type":"image","source":{"type":"base64","data":"aGk="}}]}]}`, "messages.1.content.0.type"},
		{"image source of no known type", `{"model":"m1","max_tokens":5,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"ftp","url":"ftp://x/y.png"}}]}]}`,
			"messages.0.content.0.source.type"},
		{"image not base64", `{"model":"m1","max_tokens":5,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","data":"@@"}}]}]}`,
			"messages.0.content.0.source.data"},
		{"document without a source type", `{"model":"m1","max_tokens":5,"messages":[{"role":"user","content":[{"type":"document","source":{}}]}]}`,
			"messages.0.content.0.source.type"},
		{"a block no user turn has", `{"model":"m1","max_tokens":5,"messages":[{"role":"user","content":[{"type":"tool_addition","tool":{}}]}]}`,
			"messages.0.content.0.type"},
		{"tool_use from the user", `{"model":"m1","max_tokens":5,"messages":[{"role":"user","content":[{"type":"tool_use","id":"a","name":"f","input":{}}]}]}`,
			"messages.0.content.0.type"},
		{"tool_result without its id", `{"model":"m1","max_tokens":5,"messages":[{"role":"user","content":[{"type":"tool_result","content":"x"}]}]}`,
			"messages.0.content.0.tool_use_id"},
		{"tool_choice forcing a dropped server tool", `{"model":"m1","max_tokens":5,"tools":[{"type":"web_search_20250305","name":"web_search"}],` +
			`"tool_choice":{"type":"tool","name":"web_search"},` + msgs + `}`, "tool_choice.name"},
		{"a custom tool without a name", `{"model":"m1","max_tokens":5,"tools":[{"type":"custom","input_schema":{}}],` + msgs + `}`, "tools.0.name"},
		{"tool_choice of an unknown tool", `{"model":"m1","max_tokens":5,"tools":[{"name":"f"}],"tool_choice":{"type":"tool","name":"g"},` + msgs + `}`,
			"tool_choice.name"},
		{"tool_choice any without tools", `{"model":"m1","max_tokens":5,"tool_choice":{"type":"any"},` + msgs + `}`, "tool_choice"},
		{"temperature above 1", `{"model":"m1","max_tokens":5,"temperature":1.5,` + msgs + `}`, "temperature"},
		{"unknown thinking", `{"model":"m1","max_tokens":5,"thinking":{"type":"deep"},` + msgs + `}`, "thinking.type"},
		{"thinking without a type", `{"model":"m1","max_tokens":5,"thinking":{},` + msgs + `}`, "thinking.type"},
		{"a budget that is not a number", `{"model":"m1","max_tokens":5,"thinking":{"type":"enabled","budget_tokens":"lots"},` + msgs + `}`,
			"thinking.budget_tokens"},
		{"unknown effort", `{"model":"m1","max_tokens":5,"output_config":{"effort":"extreme"},` + msgs + `}`, "output_config.effort"},
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

// P3: lists are bounded as they are decoded, and a body past the Edge's
// request limit (limits.max_request_mib) is 413 request_too_large before
// any of it is decoded.
// (How large the run it becomes may be is the front end's bound, tested
// there.)
func TestBounds(t *testing.T) {
	many := strings.Repeat(`{"role":"user","content":"x"},`, MaxMessages) + `{"role":"user","content":"x"}`
	e := newEnv(t, &ft.Dispatcher{})
	w := e.post(`{"model":"m1","max_tokens":5,"messages":[` + many + `]}`)
	if b := errorBodyOf(t, w.Body.String()); w.Code != http.StatusBadRequest || !strings.Contains(b.Error.Message, fmt.Sprint(MaxMessages)) {
		t.Errorf("too many messages: %d %s", w.Code, w.Body)
	}
	w = e.post(`{"model":"m1","max_tokens":5,"messages":[{"role":"user","content":"` + strings.Repeat("x", frontdoor.DefaultMaxRequest) + `"}]}`)
	if b := errorBodyOf(t, w.Body.String()); w.Code != http.StatusRequestEntityTooLarge || b.Error.Type != typeTooLarge {
		t.Errorf("body past the cap: %d %s", w.Code, w.Body)
	}
	if len(e.runner.RunRequests()) != 0 {
		t.Error("a run started")
	}
}
