package openai_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/iop-dev/iop/internal/fakes/fakeopenai"
	"github.com/iop-dev/iop/plugins/openai"
	"github.com/iop-dev/iop/sdk"
)

// sentMessages runs req through an adapter configured with cfg's extra
// keys and returns the "messages" of the chat request the server got.
func sentMessages(t *testing.T, cfg map[string]any, req *sdk.Request) string {
	t.Helper()
	s := startFake(t, fakeopenai.Config{Models: []fakeopenai.Model{{Name: "m"}}})
	c := map[string]any{"base_url": s.BaseURL()}
	for k, v := range cfg {
		c[k] = v
	}
	a := openai.New()
	if err := a.Configure(t.Context(), sdk.MustConfig(c)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(t.Context()) })
	req.Target = "m"
	if _, err := a.Execute(t.Context(), req, &sink{}); err != nil {
		t.Fatal(err)
	}
	var body struct {
		Messages json.RawMessage `json:"messages"`
	}
	if err := json.Unmarshal(s.Requests()[0].Body, &body); err != nil {
		t.Fatal(err)
	}
	return string(body.Messages)
}

func toolCall(id, name string) sdk.ToolCall {
	return sdk.ToolCall{ID: id, Name: name, Arguments: `{}`}
}

// Issue 21, P7: a system turn inside the conversation, which Qwen's,
// Gemma's and other strict chat templates refuse, is folded into a user
// turn where it stands; the leading ones are joined. Exact wire bodies.
func TestSystemTurnsAreFoldedWhereTheyStand(t *testing.T) {
	const env = "<env>\ncwd: /src\n</env>"
	tests := []struct {
		name string
		msgs []sdk.Message
		want string
	}{
		{"Claude Code: the environment block after the first user turn goes at the end of that turn, as it is (markup already)",
			[]sdk.Message{{Role: "system", Content: "You are an agent."}, {Role: "user", Content: "fix it"}, {Role: "system", Content: env},
				{Role: "assistant", ToolCalls: []sdk.ToolCall{toolCall("c1", "Read")}}, {Role: "tool", ToolCallID: "c1", Content: "ok"}},
			`[{"role":"system","content":"You are an agent."},` +
				`{"role":"user","content":"fix it\n\n\u003cenv\u003e\ncwd: /src\n\u003c/env\u003e"},` +
				`{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"Read","arguments":"{}"}}]},` +
				`{"role":"tool","content":"ok","tool_call_id":"c1"}]`},
		{"the leading system messages are joined into one",
			[]sdk.Message{{Role: "system", Content: "a"}, {Role: "system", Content: ""}, {Role: "system", Content: "b"}, {Role: "user", Content: "hi"}},
			`[{"role":"system","content":"a\n\nb"},{"role":"user","content":"hi"}]`},
		{"before a user turn: first in it, plain text wrapped in system-reminder tags",
			[]sdk.Message{{Role: "user", Content: "q1"}, {Role: "assistant", Content: "a1"}, {Role: "system", Content: " be terse "}, {Role: "user", Content: "q2"}},
			`[{"role":"user","content":"q1"},{"role":"assistant","content":"a1"},` +
				`{"role":"user","content":"\u003csystem-reminder\u003e\nbe terse\n\u003c/system-reminder\u003e\n\nq2"}]`},
		{"after an assistant turn, nothing after it: a user turn of its own",
			[]sdk.Message{{Role: "user", Content: "q1"}, {Role: "assistant", Content: "a1"}, {Role: "system", Content: "<x>go on</x>"}},
			`[{"role":"user","content":"q1"},{"role":"assistant","content":"a1"},{"role":"user","content":"\u003cx\u003ego on\u003c/x\u003e"}]`},
		{"between a call's results: after the last of them, never between a call and its result",
			[]sdk.Message{{Role: "user", Content: "q"},
				{Role: "assistant", ToolCalls: []sdk.ToolCall{toolCall("c1", "f"), toolCall("c2", "f")}},
				{Role: "tool", ToolCallID: "c1", Content: "r1"}, {Role: "system", Content: "<n>note</n>"}, {Role: "tool", ToolCallID: "c2", Content: "r2"},
				{Role: "assistant", Content: "done"}},
			`[{"role":"user","content":"q"},` +
				`{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}},{"id":"c2","type":"function","function":{"name":"f","arguments":"{}"}}]},` +
				`{"role":"tool","content":"r1","tool_call_id":"c1"},{"role":"tool","content":"r2","tool_call_id":"c2"},` +
				`{"role":"user","content":"\u003cn\u003enote\u003c/n\u003e"},{"role":"assistant","content":"done"}]`},
		{"after tool results, before the user's turn: first in it",
			[]sdk.Message{{Role: "user", Content: "q"}, {Role: "assistant", ToolCalls: []sdk.ToolCall{toolCall("c1", "f")}},
				{Role: "tool", ToolCallID: "c1", Content: "r"}, {Role: "system", Content: "<n>1</n>"}, {Role: "user", Content: "next"}},
			`[{"role":"user","content":"q"},{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]},` +
				`{"role":"tool","content":"r","tool_call_id":"c1"},{"role":"user","content":"\u003cn\u003e1\u003c/n\u003e\n\nnext"}]`},
		{"consecutive system turns fold together, in order; an empty one says nothing",
			[]sdk.Message{{Role: "user", Content: "q"}, {Role: "system", Content: "one"}, {Role: "system"}, {Role: "system", Content: "<b>two</b>"}, {Role: "assistant", Content: "a"}},
			`[{"role":"user","content":"q\n\n\u003csystem-reminder\u003e\none\n\u003c/system-reminder\u003e\n\n\u003cb\u003etwo\u003c/b\u003e"},{"role":"assistant","content":"a"}]`},
		{"text that only starts with a tag is not one element: wrapped",
			[]sdk.Message{{Role: "user", Content: "q"}, {Role: "system", Content: "<b>Note</b>: be brief"}},
			`[{"role":"user","content":"q\n\n\u003csystem-reminder\u003e\n\u003cb\u003eNote\u003c/b\u003e: be brief\n\u003c/system-reminder\u003e"}]`},
		{"a folded system turn's image goes with its text, to the user turn",
			[]sdk.Message{{Role: "user", Content: "q"}, {Role: "assistant", Content: "a"}, {Role: "system", Content: "<s>see</s>", Images: [][]byte{png}}, {Role: "user", Content: "and?"}},
			`[{"role":"user","content":"q"},{"role":"assistant","content":"a"},` +
				`{"role":"user","content":[{"type":"text","text":"\u003cs\u003esee\u003c/s\u003e\n\nand?"},{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgoAAAANSUhEUg=="}}]}]`},
		{"a single leading system message and no other: as it is",
			[]sdk.Message{{Role: "system", Content: "s"}, {Role: "user", Content: "q"}},
			`[{"role":"system","content":"s"},{"role":"user","content":"q"}]`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := sentMessages(t, nil, &sdk.Request{Messages: tt.msgs}); got != tt.want {
				t.Errorf("messages\n got %s\nwant %s", got, tt.want)
			}
		})
	}
}

func TestSystemTurnsKeepSendsThemAsTheyAre(t *testing.T) {
	msgs := []sdk.Message{{Role: "system", Content: "a"}, {Role: "system", Content: "b"}, {Role: "user", Content: "q"}, {Role: "system", Content: "c"}}
	const want = `[{"role":"system","content":"a"},{"role":"system","content":"b"},{"role":"user","content":"q"},{"role":"system","content":"c"}]`
	if got := sentMessages(t, map[string]any{"system_turns": "keep"}, &sdk.Request{Messages: msgs}); got != want {
		t.Errorf("messages\n got %s\nwant %s", got, want)
	}
	// The run's own messages are never changed by a fold.
	before := append([]sdk.Message(nil), msgs...)
	sentMessages(t, nil, &sdk.Request{Messages: msgs})
	for i := range msgs {
		if msgs[i].Content != before[i].Content || msgs[i].Role != before[i].Role {
			t.Fatalf("the run's message %d changed: %+v", i, msgs[i])
		}
	}
}

func TestSystemTurnsConfigIsValidated(t *testing.T) {
	for _, v := range []string{"hoist", "Fold", "drop"} {
		err := openai.New().Configure(t.Context(), sdk.MustConfig(map[string]any{"base_url": "http://127.0.0.1:1/v1", "system_turns": v}))
		if !errors.Is(err, sdk.ErrInvalidRequest) || !strings.Contains(err.Error(), "system_turns") {
			t.Errorf("system_turns %q: err = %v", v, err)
		}
	}
	for _, v := range []string{"", "fold", "keep"} {
		if err := openai.New().Configure(t.Context(), sdk.MustConfig(map[string]any{"base_url": "http://127.0.0.1:1/v1", "system_turns": v})); err != nil {
			t.Errorf("system_turns %q: %v", v, err)
		}
	}
}

// P9: each turn of a session sends the previous turn's prompt as the start
// of its own, so the server's prompt cache serves it: the messages sent
// for a turn are those of the previous turn, the last of them at most
// extended at its end.
func TestFoldedSystemTurnsKeepTheSessionPrefix(t *testing.T) {
	session := []sdk.Message{
		{Role: "system", Content: "You are an agent."},
		{Role: "user", Content: "fix the build"},
		{Role: "system", Content: "<env>cwd: /src</env>"},
		{Role: "assistant", ToolCalls: []sdk.ToolCall{toolCall("c1", "Bash")}},
		{Role: "tool", ToolCallID: "c1", Content: "exit 1"},
		{Role: "system", Content: "todo list is empty"},
		{Role: "assistant", Content: "Fixed."},
		{Role: "system", Content: "<system-reminder>the user is back</system-reminder>"},
		{Role: "user", Content: "thanks; now the tests"},
		{Role: "assistant", ToolCalls: []sdk.ToolCall{toolCall("c2", "Bash")}},
		{Role: "tool", ToolCallID: "c2", Content: "ok"},
	}
	var prev []json.RawMessage
	for n := 2; n <= len(session); n++ {
		var sent []json.RawMessage
		if err := json.Unmarshal([]byte(sentMessages(t, nil, &sdk.Request{Messages: session[:n]})), &sent); err != nil {
			t.Fatal(err)
		}
		if len(prev) > 0 {
			if len(sent) < len(prev) {
				t.Fatalf("turn of %d messages sends %d, fewer than the turn before (%d)", n, len(sent), len(prev))
			}
			for i := range prev[:len(prev)-1] {
				if !bytes.Equal(prev[i], sent[i]) {
					t.Fatalf("turn of %d messages: message %d changed:\n was %s\n now %s", n, i, prev[i], sent[i])
				}
			}
			last, now := prev[len(prev)-1], sent[len(prev)-1]
			if !bytes.Equal(last, now) && !extends(last, now) {
				t.Fatalf("turn of %d messages: the previous turn's last message is not a prefix:\n was %s\n now %s", n, last, now)
			}
		}
		prev = sent
	}
}

// extends reports whether message now is message was with text added at
// the end of its content.
func extends(was, now json.RawMessage) bool {
	var a, b struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	return json.Unmarshal(was, &a) == nil && json.Unmarshal(now, &b) == nil && a.Role == b.Role && strings.HasPrefix(b.Content, a.Content)
}

// strictTemplate is a server whose chat template is Qwen's: a system
// message anywhere but first is a 400, as vLLM answers.
func strictTemplate(t *testing.T) *httptest.Server {
	t.Helper()
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Messages []struct {
				Role string `json:"role"`
			} `json:"messages"`
		}
		b, _ := io.ReadAll(r.Body)
		json.Unmarshal(b, &req)
		for i, m := range req.Messages {
			if m.Role == "system" && i > 0 {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusBadRequest)
				io.WriteString(w, `{"error":{"message":"System message must be at the beginning.","type":"BadRequestError","code":400}}`)
				return
			}
		}
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"ok\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n")
	}))
	t.Cleanup(s.Close)
	return s
}

// Issue 21: against a strict template, a Claude Code turn is answered
// when folded, and refused as the server refuses it when kept.
func TestStrictTemplateAnswersFoldedSystemTurns(t *testing.T) {
	s := strictTemplate(t)
	req := func() *sdk.Request {
		return &sdk.Request{Target: "qwen", Messages: []sdk.Message{
			{Role: "system", Content: "agent"}, {Role: "system", Content: "billing"}, {Role: "user", Content: "hi"}, {Role: "system", Content: "<env/>"}}}
	}
	var out sink
	if _, err := configured(t, s.URL+"/v1").Execute(t.Context(), req(), &out); err != nil {
		t.Fatalf("folded: %v", err)
	}
	if got := summary(out.all()); got != "t:ok" {
		t.Errorf("events %s", got)
	}
	a := openai.New()
	if err := a.Configure(t.Context(), sdk.MustConfig(map[string]any{"base_url": s.URL + "/v1", "system_turns": "keep"})); err != nil {
		t.Fatal(err)
	}
	_, err := a.Execute(t.Context(), req(), &sink{})
	if !errors.Is(err, sdk.ErrInvalidRequest) || !strings.Contains(err.Error(), "System message must be at the beginning") {
		t.Errorf("kept: err = %v, want the server's 400", err)
	}
}

// An error names the run's message, not its place in what is sent.
func TestFoldedMessagesErrorsNameTheRunsMessage(t *testing.T) {
	s := startFake(t, fakeopenai.Config{Models: []fakeopenai.Model{{Name: "m"}}})
	req := &sdk.Request{Target: "m", Messages: []sdk.Message{
		{Role: "system", Content: "a"}, {Role: "system", Content: "b"}, {Role: "user", Content: "q"}, {Role: "system", Content: "c"},
		{Role: "tool", Content: "no call id"}}}
	_, err := configured(t, s.BaseURL()).Execute(t.Context(), req, &sink{})
	if !errors.Is(err, sdk.ErrInvalidRequest) || !strings.Contains(err.Error(), "messages[4]") {
		t.Errorf("err = %v, want one about messages[4]", err)
	}
}

// A token count counts the prompt the run sends: the folded one.
func TestCountTokensCountsTheFoldedPrompt(t *testing.T) {
	srv := newTokenServer(t, vllm("42"))
	a := openai.New()
	if err := a.Configure(t.Context(), sdk.MustConfig(map[string]any{"base_url": srv.URL + "/v1"})); err != nil {
		t.Fatal(err)
	}
	req := &sdk.Request{Target: "m", Credential: &sdk.Credential{Secret: "sk-count"}, Messages: []sdk.Message{
		{Role: "user", Content: "q"}, {Role: "system", Content: "s"}}}
	if _, err := a.CountTokens(t.Context(), req); err != nil {
		t.Fatal(err)
	}
	const want = `/tokenize {"add_generation_prompt":true,"messages":[{"role":"user","content":"q\n\n\u003csystem-reminder\u003e\ns\n\u003c/system-reminder\u003e"}],"model":"m"}`
	if got := srv.requests(); len(got) != 1 || got[0] != want {
		t.Errorf("requests %q\nwant %q", got, want)
	}
}
