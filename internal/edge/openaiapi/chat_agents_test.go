package openaiapi

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/iop-dev/iop/internal/edge/dispatch"
	"github.com/iop-dev/iop/internal/edge/edgeconfig"
	"github.com/iop-dev/iop/internal/edge/frontend"
	ft "github.com/iop-dev/iop/internal/edge/frontend/frontendtest"
	"github.com/iop-dev/iop/internal/yamlconf"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// chatPatchTool is a custom tool of chat completions, with a grammar.
var chatPatchTool = openai.ChatCompletionCustomTool(openai.ChatCompletionCustomToolCustomParam{
	Name: "apply_patch", Description: openai.String("Edit files."),
	Format: openai.ChatCompletionCustomToolCustomFormatUnionParam{OfGrammar: &openai.ChatCompletionCustomToolCustomFormatGrammarParam{
		Grammar: openai.ChatCompletionCustomToolCustomFormatGrammarGrammarParam{Syntax: "regex", Definition: `\*\*\* Begin Patch.*`}}},
})

// P2: a chat custom tool is a function of one string to the model; its
// call reaches the SDK as a custom tool call with its input, whole and
// streamed, and comes back as the model's call.
func TestOfficialClientChatRoundTripsACustomTool(t *testing.T) {
	const patch = "*** Begin Patch\n*** End Patch"
	args, _ := json.Marshal(map[string]string{"input": patch})
	events := []ft.Step{ft.ToolCall(0, "call_w", "get_weather", `{"city":"Seoul"}`),
		ft.ToolCall(1, "call_p", "apply_patch", string(args[:9])), ft.ToolCall(1, "", "", string(args[9:])), ft.Completed("stop")}
	c, e := officialClient(t, &ft.Dispatcher{Events: events})
	params := openai.ChatCompletionNewParams{Model: "m1", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("patch it")},
		Tools: []openai.ChatCompletionToolUnionParam{weatherTool, chatPatchTool}}
	resp, err := c.Chat.Completions.New(t.Context(), params)
	if err != nil {
		t.Fatal(err)
	}
	msg := resp.Choices[0].Message
	custom := msg.ToolCalls[1].AsCustom()
	if len(msg.ToolCalls) != 2 || msg.ToolCalls[0].Function.Name != "get_weather" || msg.ToolCalls[1].Type != "custom" ||
		custom.ID != "call_p" || custom.Custom.Name != "apply_patch" || custom.Custom.Input != patch || resp.Choices[0].FinishReason != "tool_calls" {
		t.Fatalf("message %s", resp.RawJSON())
	}
	tools := e.runner.RunRequest(t).GetTools()
	if len(tools) != 2 || tools[1].GetName() != "apply_patch" || string(tools[1].GetParametersJson()) != string(customParameters) ||
		!strings.Contains(tools[1].GetDescription(), "regex grammar") {
		t.Errorf("the run's tools %v", tools)
	}

	// Streamed: the function call's deltas as they come, the custom call whole before the finish.
	c, _ = officialClient(t, &ft.Dispatcher{Events: events})
	stream := c.Chat.Completions.NewStreaming(t.Context(), params)
	var calls []string
	for stream.Next() {
		var chunk struct {
			Choices []struct {
				Delta struct {
					ToolCalls []json.RawMessage `json:"tool_calls"`
				} `json:"delta"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(stream.Current().RawJSON()), &chunk); err != nil {
			t.Fatal(err)
		}
		for _, ch := range chunk.Choices {
			for _, tc := range ch.Delta.ToolCalls {
				calls = append(calls, string(tc))
			}
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	want := []string{`{"index":0,"id":"call_w","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Seoul\"}"}}`,
		`{"index":1,"id":"call_p","type":"custom","custom":{"name":"apply_patch","input":"*** Begin Patch\n*** End Patch"}}`}
	if strings.Join(calls, "\n") != strings.Join(want, "\n") {
		t.Errorf("streamed calls\n got %q\nwant %q", calls, want)
	}

	// The next turn: the message back, as the SDK makes it.
	c, e = officialClient(t, &ft.Dispatcher{Events: []ft.Step{ft.Text("Done."), ft.Completed("stop")}})
	params.Messages = append(params.Messages, msg.ToParam(), openai.ToolMessage("22C", "call_w"), openai.ToolMessage("Success.", "call_p"))
	if _, err := c.Chat.Completions.New(t.Context(), params); err != nil {
		t.Fatal(err)
	}
	wantMsgs := []string{"user:patch it",
		`assistant: call[0]=call_w:get_weather:{"city":"Seoul"} call[1]=call_p:apply_patch:` + string(args),
		"tool:22C answers=call_w", "tool:Success. answers=call_p"}
	if got := msgLines(e.runner.RunRequest(t)); strings.Join(got, "\n") != strings.Join(wantMsgs, "\n") {
		t.Errorf("the next run's messages\n got %q\nwant %q", got, wantMsgs)
	}
}

// P2: a custom tool may be chosen, as chat's tool_choice names it.
func TestChatToolChoiceOfACustomTool(t *testing.T) {
	const tools = `"tools":[{"type":"custom","custom":{"name":"apply_patch"}}]`
	req, e := parseChat([]byte(`{"model":"m","messages":[{"role":"user","content":"x"}],` + tools +
		`,"tool_choice":{"type":"custom","custom":{"name":"apply_patch"}}}`))
	if e != nil || req.run.GetOptions().GetToolChoice() != "function:apply_patch" {
		t.Fatalf("%v %v", e, req)
	}
	for body, param := range map[string]string{
		`"tool_choice":{"type":"custom","custom":{"name":"nope"}}`:                    "tool_choice",
		`"tool_choice":{"type":"custom"}`:                                             "tool_choice",
		`"tools":[{"type":"custom","custom":{}}]`:                                     "tools[0].custom.name",
		`"tools":[{"type":"custom"}]`:                                                 "tools[0].custom.name",
		`"messages":[{"role":"assistant","tool_calls":[{"id":"c","type":"custom"}]}]`: "messages[0].tool_calls[0].custom.name",
	} {
		b := `{"model":"m",` + body + `}`
		if !strings.Contains(body, "messages") {
			b = `{"model":"m","messages":[{"role":"user","content":"x"}],` + body
			if !strings.Contains(body, `"tools"`) {
				b += "," + tools
			}
			b += "}"
		}
		if _, e := parseChat([]byte(b)); e == nil || e.Param != param {
			t.Errorf("%s: %v", b, e)
		}
	}
}

// P2: web_search_options asks for OpenAI's hosted search: dropped, and
// said in X-IOP-Dropped-Tools; refused where the profile says so.
func TestOfficialClientChatWebSearchIsDroppedOrRefused(t *testing.T) {
	params := openai.ChatCompletionNewParams{Model: "m1", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("news?")},
		WebSearchOptions: openai.ChatCompletionNewParamsWebSearchOptions{SearchContextSize: "low"}}
	c, e := officialClient(t, &ft.Dispatcher{Events: []ft.Step{ft.Text("No news."), ft.Completed("stop")}})
	var httpResp *http.Response
	if _, err := c.Chat.Completions.New(t.Context(), params, option.WithResponseInto(&httpResp)); err != nil {
		t.Fatal(err)
	}
	if got := httpResp.Header.Get(frontend.DroppedToolsHeader); got != "web_search" {
		t.Errorf("%s: %q", frontend.DroppedToolsHeader, got)
	}
	if x := e.runner.RunRequest(t).GetOptions().GetExtraJson(); strings.Contains(string(x), "web_search") {
		t.Errorf("extra_json %s", x)
	}
	refuse := &edgeconfig.Profile{Name: "strict", IdleTimeout: yamlconf.Duration(time.Hour), HostedTools: edgeconfig.HostedToolsRefuse}
	c, _ = officialClient(t, &ft.Dispatcher{Profile: refuse})
	_, err := c.Chat.Completions.New(t.Context(), params)
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadRequest || apiErr.Param != "web_search_options" {
		t.Errorf("refused: %v", err)
	}
}

// P2: the chat fields of OpenAI's current reference reach the provider:
// max_completion_tokens as the run's max tokens; the ones the Edge does
// not read pass through (SPEC P2), the session key among them.
func TestOfficialClientChatCurrentFieldsReachTheProvider(t *testing.T) {
	c, e := officialClient(t, &ft.Dispatcher{Events: []ft.Step{ft.Completed("stop")}})
	_, err := c.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{Model: "m1",
		Messages:            []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
		MaxCompletionTokens: openai.Int(77), PromptCacheKey: openai.String("sess-1"), SafetyIdentifier: openai.String("h1"),
		Verbosity: openai.ChatCompletionNewParamsVerbosityLow, ParallelToolCalls: openai.Bool(false),
		ServiceTier: openai.ChatCompletionNewParamsServiceTierFlex, Store: openai.Bool(false),
		PromptCacheRetention: openai.ChatCompletionNewParamsPromptCacheRetention24h,
	})
	if err != nil {
		t.Fatal(err)
	}
	o := e.runner.RunRequest(t).GetOptions()
	want := `{"parallel_tool_calls":false,"prompt_cache_key":"sess-1","prompt_cache_retention":"24h","safety_identifier":"h1",` +
		`"service_tier":"flex","store":false,"verbosity":"low"}`
	if o.GetMaxTokens() != 77 || string(o.GetExtraJson()) != want {
		t.Errorf("max tokens %d, extra_json\n got %s\nwant %s", o.GetMaxTokens(), o.GetExtraJson(), want)
	}
}

// sessionRecorder is the fake dispatcher, recording the session each run
// was planned with.
type sessionRecorder struct {
	*ft.Dispatcher
	mu       sync.Mutex
	sessions []string
}

func (s *sessionRecorder) StartRun(ctx context.Context, plan *dispatch.Plan, req *wirepb.RunRequest, watch dispatch.Watch) (frontend.Run, error) {
	s.mu.Lock()
	s.sessions = append(s.sessions, plan.Session)
	s.mu.Unlock()
	return s.Dispatcher.StartRun(ctx, plan, req, watch)
}

// Session affinity reads a session key from what the client sends: its
// prompt_cache_key, else the session-id (or session_id) header Codex sends,
// else user, then safety_identifier; on both APIs.
func TestSessionKeyIsWhatTheClientNames(t *testing.T) {
	tests := []struct {
		name, fields string
		header       [2]string
		want         string
	}{
		{"prompt_cache_key first", `"prompt_cache_key":"pck","user":"u","safety_identifier":"s"`, [2]string{"session-id", "hdr"}, "pck"},
		{"the session-id header", `"user":"u"`, [2]string{"session-id", "hdr"}, "hdr"},
		{"the session_id header", `"user":"u"`, [2]string{"session_id", "hdr2"}, "hdr2"},
		{"user", `"user":"u","safety_identifier":"s"`, [2]string{}, "u"},
		{"safety_identifier", `"safety_identifier":"s"`, [2]string{}, "s"},
		{"none", ``, [2]string{}, ""},
	}
	for _, tt := range tests {
		for _, api := range []string{"responses", "chat", "input_tokens"} {
			t.Run(tt.name+"/"+api, func(t *testing.T) {
				rec := &sessionRecorder{Dispatcher: &ft.Dispatcher{Events: []ft.Step{ft.Completed("stop")}}}
				h := Handler(frontend.New(rec, testAuth(t), frontend.Options{}))
				fields := tt.fields
				if fields != "" {
					fields = "," + fields
				}
				var r *http.Request
				switch api {
				case "responses":
					r = respReq(`{"model":"m1","input":"hi"` + fields + `}`)
				case "input_tokens":
					r = respReq(`{"model":"m1","input":"hi"` + fields + `}`)
					r.URL.Path = "/v1/responses/input_tokens"
				default:
					r = chatReq(`{"model":"m1","messages":[{"role":"user","content":"hi"}]` + fields + `}`)
				}
				if tt.header[0] != "" {
					r.Header.Set(tt.header[0], tt.header[1]) // canonical, as the server reads them
				}
				w := httptest.NewRecorder()
				h.ServeHTTP(w, r)
				if w.Code != http.StatusOK {
					t.Fatalf("status %d: %s", w.Code, w.Body)
				}
				if len(rec.sessions) != 1 || rec.sessions[0] != tt.want {
					t.Errorf("sessions %q, want %q", rec.sessions, tt.want)
				}
			})
		}
	}
}
