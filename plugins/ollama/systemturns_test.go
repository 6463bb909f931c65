package ollama

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/iop-dev/iop/sdk"
)

// sentMessages runs msgs on an Ollama of the test's own, through an
// adapter configured with cfg's extra keys, and returns the "messages" of
// the /api/chat request it got.
func sentMessages(t *testing.T, cfg map[string]any, msgs []sdk.Message) string {
	t.Helper()
	s := newScripted(t, func(int, string) (int, string) { return 200, answerLines("stop", "ok") })
	a := newAdapter(t, s.URL, cfg)
	if _, err := a.Execute(ctxTimeout(t, 5*time.Second), &sdk.Request{Target: "m", Messages: msgs}, &sink{}); err != nil {
		t.Fatal(err)
	}
	var body struct {
		Messages json.RawMessage `json:"messages"`
	}
	if err := json.Unmarshal([]byte(s.sent()[0]), &body); err != nil {
		t.Fatal(err)
	}
	return string(body.Messages)
}

func call(id, name string) sdk.ToolCall { return sdk.ToolCall{ID: id, Name: name, Arguments: `{}`} }

// Issue 21, P7: a system turn inside the conversation, which most
// models' templates on Ollama move to the top of the prompt, drop or
// refuse, is folded into a user turn where it stands; the leading ones
// are joined. Exact wire bodies.
func TestSystemTurnsAreFoldedWhereTheyStand(t *testing.T) {
	tests := []struct {
		name string
		msgs []sdk.Message
		want string
	}{
		{"Claude Code: the environment block after the first user turn goes at its end, as it is (markup already)",
			[]sdk.Message{{Role: "system", Content: "You are an agent."}, {Role: "user", Content: "fix it"}, {Role: "system", Content: "<env>cwd</env>"},
				{Role: "assistant", Reasoning: "look", ToolCalls: []sdk.ToolCall{call("c1", "Read")}}, {Role: "tool", ToolCallID: "c1", Content: "ok"}},
			`[{"role":"system","content":"You are an agent."},` +
				`{"role":"user","content":"fix it\n\n\u003cenv\u003ecwd\u003c/env\u003e"},` +
				`{"role":"assistant","content":"","thinking":"look","tool_calls":[{"id":"c1","function":{"index":0,"name":"Read","arguments":{}}}]},` +
				`{"role":"tool","content":"ok","tool_name":"Read","tool_call_id":"c1"}]`},
		{"the leading system messages are joined into one, images in order",
			[]sdk.Message{{Role: "system", Content: "a", Images: [][]byte{{1}}}, {Role: "system", Content: "b", Images: [][]byte{{2}}}, {Role: "user", Content: "hi"}},
			`[{"role":"system","content":"a\n\nb","images":["AQ==","Ag=="]},{"role":"user","content":"hi"}]`},
		{"before a user turn: first in it, its image first, plain text wrapped in system-reminder tags",
			[]sdk.Message{{Role: "user", Content: "q1"}, {Role: "assistant", Content: "a1"}, {Role: "system", Content: "be terse", Images: [][]byte{{1}}},
				{Role: "user", Content: "q2", Images: [][]byte{{2}}}},
			`[{"role":"user","content":"q1"},{"role":"assistant","content":"a1"},` +
				`{"role":"user","content":"\u003csystem-reminder\u003e\nbe terse\n\u003c/system-reminder\u003e\n\nq2","images":["AQ==","Ag=="]}]`},
		{"between a call's results: after the last of them, a user turn of its own",
			[]sdk.Message{{Role: "user", Content: "q"}, {Role: "assistant", ToolCalls: []sdk.ToolCall{call("c1", "f"), call("c2", "g")}},
				{Role: "tool", ToolCallID: "c1", Content: "r1"}, {Role: "system", Content: "<n>note</n>"}, {Role: "tool", ToolCallID: "c2", Content: "r2"}},
			`[{"role":"user","content":"q"},` +
				`{"role":"assistant","content":"","tool_calls":[{"id":"c1","function":{"index":0,"name":"f","arguments":{}}},{"id":"c2","function":{"index":1,"name":"g","arguments":{}}}]},` +
				`{"role":"tool","content":"r1","tool_name":"f","tool_call_id":"c1"},{"role":"tool","content":"r2","tool_name":"g","tool_call_id":"c2"},` +
				`{"role":"user","content":"\u003cn\u003enote\u003c/n\u003e"}]`},
		{"after an assistant turn, before another: a user turn of its own",
			[]sdk.Message{{Role: "user", Content: "q"}, {Role: "assistant", Content: "a1"}, {Role: "system", Content: "<n>x</n>"}, {Role: "assistant", Content: "a2"}},
			`[{"role":"user","content":"q"},{"role":"assistant","content":"a1"},{"role":"user","content":"\u003cn\u003ex\u003c/n\u003e"},{"role":"assistant","content":"a2"}]`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := sentMessages(t, nil, tt.msgs); got != tt.want {
				t.Errorf("messages\n got %s\nwant %s", got, tt.want)
			}
		})
	}
}

func TestSystemTurnsKeepSendsThemAsTheyAre(t *testing.T) {
	msgs := []sdk.Message{{Role: "system", Content: "a"}, {Role: "system", Content: "b"}, {Role: "user", Content: "q"}, {Role: "system", Content: "c"}}
	const want = `[{"role":"system","content":"a"},{"role":"system","content":"b"},{"role":"user","content":"q"},{"role":"system","content":"c"}]`
	if got := sentMessages(t, map[string]any{"system_turns": "keep"}, msgs); got != want {
		t.Errorf("messages\n got %s\nwant %s", got, want)
	}
}

func TestSystemTurnsConfigIsValidated(t *testing.T) {
	for _, v := range []string{"hoist", "KEEP"} {
		err := New().Configure(t.Context(), sdk.MustConfig(map[string]any{"system_turns": v}))
		if !errors.Is(err, sdk.ErrInvalidRequest) || !strings.Contains(err.Error(), "system_turns") {
			t.Errorf("system_turns %q: err = %v", v, err)
		}
	}
}

// P9: each turn of a session sends the previous turn's prompt as the start
// of its own, so Ollama's prompt cache serves it: the messages of a turn
// are those of the turn before, the last at most extended at its end.
func TestFoldedSystemTurnsKeepTheSessionPrefix(t *testing.T) {
	session := []sdk.Message{
		{Role: "system", Content: "You are an agent."},
		{Role: "user", Content: "fix the build"},
		{Role: "system", Content: "<env>cwd: /src</env>"},
		{Role: "assistant", ToolCalls: []sdk.ToolCall{call("c1", "Bash")}},
		{Role: "tool", ToolCallID: "c1", Content: "exit 1"},
		{Role: "system", Content: "todo list is empty"},
		{Role: "assistant", Content: "Fixed."},
		{Role: "system", Content: "the user is back"},
		{Role: "user", Content: "now the tests"},
	}
	var prev []json.RawMessage
	for n := 2; n <= len(session); n++ {
		var sent []json.RawMessage
		if err := json.Unmarshal([]byte(sentMessages(t, nil, session[:n])), &sent); err != nil {
			t.Fatal(err)
		}
		for i := range prev {
			if i < len(prev)-1 && !bytes.Equal(prev[i], sent[i]) {
				t.Fatalf("turn of %d messages: message %d changed:\n was %s\n now %s", n, i, prev[i], sent[i])
			}
			if i == len(prev)-1 && !bytes.Equal(prev[i], sent[i]) && !extends(prev[i], sent[i]) {
				t.Fatalf("turn of %d messages: the last message before is not a prefix:\n was %s\n now %s", n, prev[i], sent[i])
			}
		}
		prev = sent
	}
}

// extends reports whether message now is message was with text added at
// the end of its content.
func extends(was, now json.RawMessage) bool {
	var a, b message
	return json.Unmarshal(was, &a) == nil && json.Unmarshal(now, &b) == nil && a.Role == b.Role && strings.HasPrefix(b.Content, a.Content)
}

// An error names the run's message, not its place in what is sent.
func TestFoldedMessagesErrorsNameTheRunsMessage(t *testing.T) {
	s := newScripted(t, func(int, string) (int, string) { return 200, answerLines("stop") })
	msgs := []sdk.Message{{Role: "system", Content: "a"}, {Role: "system", Content: "b"}, {Role: "user", Content: "q"},
		{Role: "assistant", ToolCalls: []sdk.ToolCall{{ID: "c", Name: "f", Arguments: "[1]"}}}}
	_, err := newAdapter(t, s.URL, nil).Execute(ctxTimeout(t, 5*time.Second), &sdk.Request{Target: "m", Messages: msgs}, &sink{})
	if !errors.Is(err, sdk.ErrInvalidRequest) || !strings.Contains(err.Error(), "messages[3]") {
		t.Errorf("err = %v, want one about messages[3]", err)
	}
	if n := len(s.sent()); n != 0 {
		t.Errorf("Ollama got %d requests", n)
	}
}
