package openai_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/iop-dev/iop/internal/fakes/fakeopenai"
	"github.com/iop-dev/iop/plugins/openai"
	"github.com/iop-dev/iop/sdk"
)

func ptr[T any](v T) *T { return &v }

// png is the start of a PNG file: enough for the media type to be sniffed.
var png = []byte("\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")

func TestRequestBodyFollowsTheChatCompletionsShape(t *testing.T) {
	s := startFake(t, fakeopenai.Config{Models: []fakeopenai.Model{{Name: "m"}}})
	a := configured(t, s.BaseURL())
	req := &sdk.Request{
		Target: "m",
		Messages: []sdk.Message{
			{Role: "system", Content: "be brief"},
			{Role: "user", Content: "what is this?", Images: [][]byte{png}},
			{Role: "assistant", Reasoning: "not sent", ToolCalls: []sdk.ToolCall{{ID: "call_1", Name: "look", Arguments: `{"x":1}`}}},
			{Role: "tool", ToolCallID: "call_1", Name: "look", Content: "a cat"},
		},
		Tools: []sdk.Tool{{Name: "look", Description: "looks", Parameters: json.RawMessage(`{"type":"object"}`)}},
		Options: sdk.Options{
			Temperature: ptr(0.5), TopP: ptr(0.9), MaxTokens: ptr(int64(64)), Stop: []string{"\n\n"},
			Seed: ptr(int64(42)), Format: json.RawMessage(`"json"`), Think: ptr(true),
			Extra:      json.RawMessage(`{"top_k":20,"max_tokens":128}`),
			ToolChoice: sdk.ToolChoiceFunction("look"),
		},
	}
	if _, err := a.Execute(t.Context(), req, &sink{}); err != nil {
		t.Fatal(err)
	}
	// P2: the normalized max_tokens wins over Extra's; top_k passes.
	const want = `{"max_tokens":64,"messages":[` +
		`{"role":"system","content":"be brief"},` +
		`{"role":"user","content":[{"type":"text","text":"what is this?"},{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgoAAAANSUhEUg=="}}]},` +
		`{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"look","arguments":"{\"x\":1}"}}]},` +
		`{"role":"tool","content":"a cat","tool_call_id":"call_1"}],` +
		`"model":"m","response_format":{"type":"json_object"},"seed":42,"stop":["\n\n"],` +
		`"stream":true,"stream_options":{"include_usage":true},"temperature":0.5,` +
		`"tool_choice":{"function":{"name":"look"},"type":"function"},` +
		`"tools":[{"type":"function","function":{"name":"look","description":"looks","parameters":{"type":"object"}}}],` +
		`"top_k":20,"top_p":0.9}`
	if got := string(s.Requests()[0].Body); got != want {
		t.Errorf("body\n got %s\nwant %s", got, want)
	}
}

// P2, issue 21: a schema reaches the server with the client's name for it
// and its strict flag; without a name it is "response".
func TestFormatSchemaBecomesJSONSchemaResponseFormat(t *testing.T) {
	const schema = `{"type":"object","properties":{"a":{"type":"string"}}}`
	for _, c := range []struct {
		name   string
		strict bool
		want   string
	}{
		{"", false, `{"json_schema":{"name":"response","schema":` + schema + `},"type":"json_schema"}`},
		{"person", true, `{"json_schema":{"name":"person","schema":` + schema + `,"strict":true},"type":"json_schema"}`},
	} {
		s := startFake(t, fakeopenai.Config{Models: []fakeopenai.Model{{Name: "m"}}})
		req := userRun("m", "hi")
		req.Options.Format = json.RawMessage(schema)
		req.Options.FormatName, req.Options.FormatStrict = c.name, c.strict
		if _, err := configured(t, s.BaseURL()).Execute(t.Context(), req, &sink{}); err != nil {
			t.Fatal(err)
		}
		var body struct {
			ResponseFormat json.RawMessage `json:"response_format"`
		}
		if err := json.Unmarshal(s.Requests()[0].Body, &body); err != nil {
			t.Fatal(err)
		}
		if string(body.ResponseFormat) != c.want {
			t.Errorf("response_format %s, want %s", body.ResponseFormat, c.want)
		}
	}
}

func TestInvalidRequestsNeverReachTheServer(t *testing.T) {
	tests := []struct {
		name string
		edit func(*sdk.Request)
	}{
		{"no target", func(r *sdk.Request) { r.Target = "" }},
		{"unknown role", func(r *sdk.Request) { r.Messages[0].Role = "narrator" }},
		{"tool message without call id", func(r *sdk.Request) { r.Messages = append(r.Messages, sdk.Message{Role: "tool", Content: "x"}) }},
		{"image on a system message", func(r *sdk.Request) { r.Messages[0] = sdk.Message{Role: "system", Images: [][]byte{png}} }},
		{"tool without name", func(r *sdk.Request) { r.Tools = []sdk.Tool{{}} }},
		{"tool with broken schema", func(r *sdk.Request) { r.Tools = []sdk.Tool{{Name: "f", Parameters: json.RawMessage(`{`)}} }},
		{"unknown format word", func(r *sdk.Request) { r.Options.Format = json.RawMessage(`"yaml"`) }},
		{"extra not an object", func(r *sdk.Request) { r.Options.Extra = json.RawMessage(`[1]`) }},
		{"extra replaces stream", func(r *sdk.Request) { r.Options.Extra = json.RawMessage(`{"stream":false}`) }},
		{"extra replaces messages", func(r *sdk.Request) { r.Options.Extra = json.RawMessage(`{"messages":[]}`) }},
		{"zero max tokens", func(r *sdk.Request) { r.Options.MaxTokens = ptr(int64(0)) }},
		{"unsupported credential kind", func(r *sdk.Request) { r.Credential = &sdk.Credential{Kind: "basic", Secret: "s"} }},
		{"credential with a line break", func(r *sdk.Request) { r.Credential = &sdk.Credential{Secret: "a\r\nX-Evil: 1"} }},
	}
	s := startFake(t, fakeopenai.Config{Models: []fakeopenai.Model{{Name: "m"}}})
	a := configured(t, s.BaseURL())
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := userRun("m", "hi")
			tt.edit(req)
			_, err := a.Execute(t.Context(), req, &sink{})
			if !errors.Is(err, sdk.ErrInvalidRequest) {
				t.Errorf("err = %v, want invalid_request", err)
			}
		})
	}
	if n := len(s.Requests()); n != 0 {
		t.Errorf("the server received %d requests", n)
	}
}

func TestBearerHeaderOnlyWithACredential(t *testing.T) {
	tests := []struct {
		name string
		cred *sdk.Credential
		want string
	}{
		{"no credential", nil, ""},
		{"bearer credential", &sdk.Credential{Kind: "bearer", Secret: "sk-lease"}, "Bearer sk-lease"},
		{"credential without kind is bearer", &sdk.Credential{Secret: "sk-2"}, "Bearer sk-2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := startFake(t, fakeopenai.Config{Models: []fakeopenai.Model{{Name: "m"}}})
			a := openai.New()
			if err := a.Configure(t.Context(), sdk.MustConfig(map[string]any{
				"base_url": s.BaseURL(), "headers": map[string]string{"X-Route": "blue"},
			})); err != nil {
				t.Fatal(err)
			}
			req := userRun("m", "hi")
			req.Credential = tt.cred
			if _, err := a.Execute(t.Context(), req, &sink{}); err != nil {
				t.Fatal(err)
			}
			h := s.Requests()[0].Header
			if got := h.Get("Authorization"); got != tt.want {
				t.Errorf("Authorization = %q, want %q", got, tt.want)
			}
			if _, ok := h["Authorization"]; ok != (tt.want != "") {
				t.Errorf("Authorization present = %v", ok)
			}
			if h.Get("X-Route") != "blue" {
				t.Errorf("configured header missing: %v", h)
			}
		})
	}
}

func TestKeyedServerAcceptsTheLeasedKeyOnly(t *testing.T) {
	s := startFake(t, fakeopenai.Config{APIKey: "sk-right", Models: []fakeopenai.Model{{Name: "m"}}})
	a := configured(t, s.BaseURL())
	req := userRun("m", "hi")
	req.Credential = &sdk.Credential{Kind: "bearer", Secret: "sk-wrong"}
	_, err := a.Execute(t.Context(), req, &sink{})
	if !errors.Is(err, sdk.ErrUnauthenticated) {
		t.Fatalf("wrong key: err = %v", err)
	}
	if e := err.Error(); strings.Contains(e, "sk-wrong") {
		t.Errorf("error reveals the credential: %s", e)
	}
	req.Credential.Secret = "sk-right"
	if _, err := a.Execute(t.Context(), req, &sink{}); err != nil {
		t.Fatalf("right key: %v", err)
	}
}

func TestConfigureIsStrict(t *testing.T) {
	tests := []struct {
		name string
		cfg  string
		ok   bool
	}{
		{"base url", `{"base_url":"http://127.0.0.1:8000/v1"}`, true},
		{"trailing slash and headers", `{"base_url":"https://api.example.com/v1/","headers":{"OpenAI-Organization":"org-1"}}`, true},
		{"unknown key", `{"base_url":"http://h/v1","api_key_env":"OPENAI_API_KEY"}`, false},
		{"misspelt key", `{"baseurl":"http://h/v1"}`, false},
		{"missing base url", `{}`, false},
		{"relative base url", `{"base_url":"/v1"}`, false},
		{"other scheme", `{"base_url":"ftp://h/v1"}`, false},
		{"credentials in the url", `{"base_url":"http://user:pass@h/v1"}`, false},
		{"authorization header", `{"base_url":"http://h/v1","headers":{"authorization":"Bearer sk"}}`, false},
		{"bad header name", `{"base_url":"http://h/v1","headers":{"X Bad":"1"}}`, false},
		{"header value with line break", `{"base_url":"http://h/v1","headers":{"X-A":"1\r\nX-B: 2"}}`, false},
		{"not an object", `[1]`, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := openai.New().Configure(t.Context(), sdk.Config(tt.cfg))
			if tt.ok && err != nil {
				t.Errorf("rejected: %v", err)
			}
			if !tt.ok && !errors.Is(err, sdk.ErrInvalidRequest) {
				t.Errorf("err = %v, want invalid_request", err)
			}
		})
	}
}

func TestExecuteBeforeConfigureFails(t *testing.T) {
	_, err := openai.New().Execute(t.Context(), userRun("m", "hi"), &sink{})
	if sdk.KindOf(err) != sdk.KindInternal {
		t.Errorf("err = %v", err)
	}
}
