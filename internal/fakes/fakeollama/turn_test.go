package fakeollama

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ollama/ollama/api"
)

// bashTool is Claude Code's shell tool, trimmed to what matters.
func bashTool() api.Tool {
	props := api.NewToolPropertiesMap()
	props.Set("command", api.ToolProperty{Type: api.PropertyType{"string"}})
	props.Set("timeout", api.ToolProperty{Type: api.PropertyType{"number"}})
	return api.Tool{Type: "function", Function: api.ToolFunction{
		Name:       "Bash",
		Parameters: api.ToolFunctionParameters{Type: "object", Required: []string{"command"}, Properties: props},
	}}
}

// chatAll runs one chat with the official client and gathers its answer:
// the content, the thinking, the calls, and the final line.
func chatAll(t *testing.T, s *Server, req *api.ChatRequest) (content, thinking string, calls []api.ToolCall, final api.ChatResponse) {
	t.Helper()
	var c, th strings.Builder
	err := client(t, s).Chat(ctxTimeout(t, 5*time.Second), req, func(r api.ChatResponse) error {
		c.WriteString(r.Message.Content)
		th.WriteString(r.Message.Thinking)
		calls = append(calls, r.Message.ToolCalls...)
		final = r
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return c.String(), th.String(), calls, final
}

// Issue 21, P7: an agent model answers a coding agent's session as a model
// does: a user turn offering tools gets one call to the shell tool, with
// arguments that fit it; the turn carrying its result gets text that
// quotes it and no call; the next user turn gets a new call (a new id);
// a turn without tools gets the model's own answer. Streamed and not.
func TestAgentModelCallsThenQuotesTheResult(t *testing.T) {
	s := newServer(t, Model{Name: "coder", Text: "plain answer", Agent: &Agent{}})
	for _, stream := range []bool{true, false} {
		msgs := []api.Message{{Role: "system", Content: "You are a coding agent."}, {Role: "user", Content: "run it"}}
		req := &api.ChatRequest{Model: "coder", Messages: msgs, Tools: api.Tools{weatherTool(), bashTool()}, Stream: &stream}

		content, _, calls, final := chatAll(t, s, req)
		if content != "" || len(calls) != 1 || calls[0].Function.Name != "Bash" || !strings.HasPrefix(calls[0].ID, "call_") {
			t.Fatalf("stream=%v: first turn: content %q calls %+v", stream, content, calls)
		}
		if args := calls[0].Function.Arguments.String(); args != `{"command":"echo iop-agent-ok"}` {
			t.Fatalf("arguments %s", args)
		}
		if final.DoneReason != "stop" || final.EvalCount != 1 {
			t.Fatalf("final %+v", final)
		}

		// The turn with the result, and a reminder the agent appends to it.
		req.Messages = append(req.Messages,
			api.Message{Role: "assistant", ToolCalls: calls},
			api.Message{Role: "tool", Content: "iop-agent-ok\n", ToolName: "Bash", ToolCallID: calls[0].ID},
			api.Message{Role: "user", Content: "<system-reminder>keep going</system-reminder>"})
		content, _, more, _ := chatAll(t, s, req)
		if content != "The command printed: iop-agent-ok" || len(more) != 0 {
			t.Fatalf("stream=%v: result turn: content %q calls %+v", stream, content, more)
		}

		req.Messages = append(req.Messages, api.Message{Role: "assistant", Content: content},
			api.Message{Role: "user", Content: "again"})
		_, _, again, _ := chatAll(t, s, req)
		if len(again) != 1 || again[0].ID == calls[0].ID {
			t.Fatalf("stream=%v: next turn: calls %+v (first %s)", stream, again, calls[0].ID)
		}

		req.Tools = nil
		if content, _, none, _ := chatAll(t, s, req); content != "plain answer" || len(none) != 0 {
			t.Fatalf("stream=%v: no tools: %q %+v", stream, content, none)
		}
	}
}

// Issue 21, P2/P7: an Ollama format constrains the answer: a JSON schema gets
// JSON that conforms to it, streamed token by token as content (after the
// thinking, with no tool calls even when tools are offered); "json" gets a
// JSON object; the format is recorded. This is how a forced tool call is
// made on Ollama, so an agent model puts its command where the tool's
// schema wants one.
func TestFormatAnswersJSONThatFitsTheSchema(t *testing.T) {
	s := newServer(t,
		Model{Name: "m", Text: "Paris France", Thinking: "Structured."},
		Model{Name: "coder", Agent: &Agent{Command: "ls -la"}},
		Model{Name: "j", Text: `{"ok": true}`},
	)
	schema := json.RawMessage(`{"type":"object","properties":{"city":{"type":"string"},
		"temperature":{"type":"number","minimum":-50,"maximum":60},"unit":{"enum":["celsius","fahrenheit"]},
		"tags":{"type":"array","items":{"type":"string"}}},"required":["city","unit"]}`)

	content, thinking, calls, final := chatAll(t, s, &api.ChatRequest{Model: "m", Format: schema,
		Messages: []api.Message{{Role: "user", Content: "weather?"}}, Tools: api.Tools{weatherTool()}})
	var got struct {
		City        string   `json:"city"`
		Temperature float64  `json:"temperature"`
		Unit        string   `json:"unit"`
		Tags        []string `json:"tags"`
	}
	if err := json.Unmarshal([]byte(content), &got); err != nil {
		t.Fatalf("content %q: %v", content, err)
	}
	if content != `{"city": "Paris", "temperature": 1.5, "unit": "celsius", "tags": ["France"]}` {
		t.Errorf("content %q", content)
	}
	if thinking != "Structured." || len(calls) != 0 || final.EvalCount < 5 {
		t.Errorf("thinking %q calls %+v eval %d: want thinking, no calls, streamed in pieces", thinking, calls, final.EvalCount)
	}
	var compact bytes.Buffer
	_ = json.Compact(&compact, schema)
	if r := lastRecorded(t, s); string(r.Format) != compact.String() {
		t.Errorf("recorded format %s", r.Format)
	}

	// A forced tool call constrained to the shell tool's schema.
	content, _, _, _ = chatAll(t, s, &api.ChatRequest{Model: "coder",
		Format:   json.RawMessage(`{"type":"object","properties":{"command":{"type":"array","items":{"type":"string"}}},"required":["command"]}`),
		Messages: []api.Message{{Role: "user", Content: "list"}}})
	if content != `{"command": ["bash", "-lc", "ls -la"]}` {
		t.Errorf("forced shell call %q", content)
	}

	for model, want := range map[string]string{"j": `{"ok": true}`, "m": `{"answer": "Paris France"}`} {
		content, _, _, _ = chatAll(t, s, &api.ChatRequest{Model: model, Format: json.RawMessage(`"json"`),
			Messages: []api.Message{{Role: "user", Content: "x"}}, Think: &api.ThinkValue{Value: false}})
		if content != want {
			t.Errorf("%s: format json gave %q, want %q", model, content, want)
		}
	}

	var text strings.Builder
	stream := false
	err := client(t, s).Generate(ctxTimeout(t, 5*time.Second), &api.GenerateRequest{Model: "m", Prompt: "weather?",
		Format: schema, Stream: &stream, Think: &api.ThinkValue{Value: false}},
		func(r api.GenerateResponse) error { text.WriteString(r.Response); return nil })
	if err != nil || !json.Valid([]byte(text.String())) || !strings.HasPrefix(text.String(), `{"city": "Paris"`) {
		t.Errorf("generate with a schema: %q %v", text.String(), err)
	}
}

// A format Ollama cannot use fails as its runner does: a 500 with its
// message, before any output.
func TestUnusableFormatsFailAsOllamaDoes(t *testing.T) {
	s := newServer(t, Model{Name: "m"})
	cases := []struct{ format, msg string }{
		{`"yaml"`, `invalid format: "\"yaml\""; expected "json" or a valid JSON Schema object`},
		{`[1]`, `invalid format: "[1]"; expected "json" or a valid JSON Schema object`},
		{`{"$ref":"#/$defs/Nope"}`, "invalid JSON schema in format"},
	}
	for _, path := range []string{"/api/chat", "/api/generate"} {
		for _, tc := range cases {
			body := `{"model":"m","prompt":"x","messages":[{"role":"user","content":"x"}],"format":` + tc.format + `}`
			status, msg := post(t, s, path, body)
			if status != http.StatusInternalServerError || msg != tc.msg {
				t.Errorf("%s %s: %d %q", path, tc.format, status, msg)
			}
		}
	}
	for _, none := range []string{`null`, `""`} {
		if status, _ := post(t, s, "/api/chat", `{"model":"m","messages":[{"role":"user","content":"x"}],"format":`+none+`}`); status != 200 {
			t.Errorf("format %s: %d, want it taken as none", none, status)
		}
	}
}

// Issue 21, P7: think levels as Ollama takes them. A model whose template
// takes levels (gpt-oss) thinks more at higher levels and ignores a bool;
// another takes a level as true (Ollama 0.17.7 on) or refuses it
// (RefuseThinkLevels: 0.17.4 to 0.17.6); a model that cannot think refuses
// any level; a value that is not a level is refused as Ollama decodes it.
// The value is recorded.
func TestThinkLevels(t *testing.T) {
	const thought = "one two three four five six"
	s := newServer(t,
		Model{Name: "gpt-oss", Thinking: thought, ThinkLevels: true},
		Model{Name: "qwen3", Thinking: thought},
		Model{Name: "old", Thinking: thought, RefuseThinkLevels: true},
		Model{Name: "plain"},
	)
	cases := []struct {
		model    string
		think    any
		thinking string
	}{
		{"gpt-oss", "low", "one two"},
		{"gpt-oss", "medium", "one two three four"},
		{"gpt-oss", "high", thought},
		{"gpt-oss", "max", thought},
		{"gpt-oss", false, "one two three four"},
		{"gpt-oss", true, "one two three four"},
		{"gpt-oss", nil, "one two three four"},
		{"qwen3", "low", thought},
		{"qwen3", false, ""},
		{"old", true, thought},
	}
	for _, tc := range cases {
		req := &api.ChatRequest{Model: tc.model, Messages: []api.Message{{Role: "user", Content: "x"}}}
		if tc.think != nil {
			req.Think = &api.ThinkValue{Value: tc.think}
		}
		_, thinking, _, _ := chatAll(t, s, req)
		if thinking != tc.thinking {
			t.Errorf("%s think %v: thinking %q, want %q", tc.model, tc.think, thinking, tc.thinking)
		}
		want := ""
		if tc.think != nil {
			b, _ := json.Marshal(tc.think)
			want = strings.Trim(string(b), `"`)
		}
		if r := lastRecorded(t, s); r.Think != want {
			t.Errorf("%s think %v recorded as %q", tc.model, tc.think, r.Think)
		}
	}

	refusals := []struct {
		path, model, think string
		msg                string
	}{
		{"/api/chat", "old", `"high"`, `think value "high" is not supported for this model`},
		{"/api/generate", "old", `"low"`, `think value "low" is not supported for this model`},
		{"/api/chat", "plain", `"low"`, `"plain" does not support thinking`},
		{"/api/chat", "qwen3", `"extreme"`, `invalid think value: "extreme" (must be "high", "medium", "low", "max", true, or false)`},
		{"/api/generate", "qwen3", `2`, `think must be a boolean or string ("high", "medium", "low", "max", true, or false)`},
	}
	for _, tc := range refusals {
		body := `{"model":"` + tc.model + `","prompt":"x","messages":[{"role":"user","content":"x"}],"think":` + tc.think + `}`
		if status, msg := post(t, s, tc.path, body); status != http.StatusBadRequest || msg != tc.msg {
			t.Errorf("%s %s think %s: %d %q", tc.path, tc.model, tc.think, status, msg)
		}
	}
	// A load request carries no prompt to think about: Ollama answers it
	// before it looks at the level.
	if status, _ := post(t, s, "/api/chat", `{"model":"old","messages":[],"think":"high"}`); status != 200 {
		t.Errorf("load with a level: %d", status)
	}
}

// Issue 21, P9: prefill costs PrefillPerToken for every prompt token past the
// longest prefix the server's prompt cache holds: a session's next turn
// pays for what it adds, another session for all but the shared system
// prompt, and a reset cache for everything. The counts are recorded and
// prompt_eval_duration covers the delay; the cache is per model.
func TestPrefillCostsTheUnseenPrefix(t *testing.T) {
	const per = 50 * time.Microsecond
	s := newServer(t, Model{Name: "m", PrefillPerToken: per, PrefillDelay: time.Millisecond},
		Model{Name: "other", PrefillPerToken: per})
	system := api.Message{Role: "system", Content: "You are a helpful coding agent with many tools."} // 9 words
	turn := func(model string, msgs ...api.Message) (Request, api.ChatResponse) {
		t.Helper()
		_, _, _, final := chatAll(t, s, &api.ChatRequest{Model: model, Messages: msgs})
		return lastRecorded(t, s), final
	}
	u1 := api.Message{Role: "user", Content: "fix the bug"}           // 3 words
	a1 := api.Message{Role: "assistant", Content: "done it is fixed"} // 4
	u2 := api.Message{Role: "user", Content: "now test"}              // 2

	r, final := turn("m", system, u1)
	if r.PromptTokens != 9+3+8 || r.CachedTokens != 0 || r.Prefill != time.Millisecond+20*per {
		t.Fatalf("cold turn: %d tokens, %d cached, prefill %v", r.PromptTokens, r.CachedTokens, r.Prefill)
	}
	if final.PromptEvalCount != 20 || final.PromptEvalDuration < r.Prefill {
		t.Fatalf("cold turn reported %d tokens in %v", final.PromptEvalCount, final.PromptEvalDuration)
	}
	r, final = turn("m", system, u1, a1, u2)
	if r.PromptTokens != 20+8+6 || r.CachedTokens != 20 || r.Prefill != time.Millisecond+14*per {
		t.Fatalf("next turn: %d tokens, %d cached, prefill %v", r.PromptTokens, r.CachedTokens, r.Prefill)
	}
	if final.PromptEvalCount != 34 || final.PromptEvalDuration < r.Prefill {
		t.Fatalf("next turn reported %d tokens in %v", final.PromptEvalCount, final.PromptEvalDuration)
	}
	// The system message (4 template tokens and 9 words) and the template's
	// opening of the user message that follows it (3).
	if r, _ = turn("m", system, api.Message{Role: "user", Content: "another session"}); r.CachedTokens != 13+3 {
		t.Fatalf("another session cached %d, want the system message's 13 and 3 of the next", r.CachedTokens)
	}
	if r, _ = turn("other", system, u1); r.CachedTokens != 0 {
		t.Fatalf("another model cached %d", r.CachedTokens)
	}
	s.ResetPromptCache()
	if r, _ = turn("m", system, u1, a1, u2); r.CachedTokens != 0 || r.Prefill != time.Millisecond+34*per {
		t.Fatalf("after a reset: %d cached, prefill %v", r.CachedTokens, r.Prefill)
	}

	// Generate shares the cache's rule: system and prompt words.
	gen := func(prompt string) Request {
		t.Helper()
		err := client(t, s).Generate(ctxTimeout(t, 5*time.Second), &api.GenerateRequest{Model: "m", Prompt: prompt},
			func(api.GenerateResponse) error { return nil })
		if err != nil {
			t.Fatal(err)
		}
		return lastRecorded(t, s)
	}
	gen("a b c d")
	if r := gen("a b c d e f"); r.PromptTokens != 6 || r.CachedTokens != 4 {
		t.Fatalf("generate: %d tokens, %d cached", r.PromptTokens, r.CachedTokens)
	}
}

// The control API bounds and resets the prompt cache of a fake that runs
// as its own process.
func TestControlAPIPromptCache(t *testing.T) {
	s := newServer(t, Model{Name: "m"})
	do := func(method, body string) int {
		req, _ := http.NewRequest(method, s.URL()+"/_fake/prompt-cache", strings.NewReader(body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	msgs := []api.Message{{Role: "user", Content: "a b c"}}
	chatAll(t, s, &api.ChatRequest{Model: "m", Messages: msgs})
	if c := do("DELETE", ""); c != 204 {
		t.Fatalf("delete: %d", c)
	}
	chatAll(t, s, &api.ChatRequest{Model: "m", Messages: msgs})
	if r := lastRecorded(t, s); r.CachedTokens != 0 {
		t.Fatalf("cache not reset: %d cached", r.CachedTokens)
	}
	if c := do("PUT", `{"prompts":1}`); c != 204 {
		t.Fatalf("put: %d", c)
	}
	chatAll(t, s, &api.ChatRequest{Model: "m", Messages: msgs})
	chatAll(t, s, &api.ChatRequest{Model: "m", Messages: []api.Message{{Role: "user", Content: "x y"}}})
	chatAll(t, s, &api.ChatRequest{Model: "m", Messages: msgs})
	if r := lastRecorded(t, s); r.CachedTokens != 3 {
		t.Fatalf("a one-prompt cache kept two: %d cached, want the template's opening 3 only", r.CachedTokens)
	}
	if c := do("PUT", `{"prompts":`); c != 400 {
		t.Fatalf("bad body: %d", c)
	}
}

func lastRecorded(t *testing.T, s *Server) Request {
	t.Helper()
	reqs := s.Requests()
	if len(reqs) == 0 {
		t.Fatal("no request recorded")
	}
	return reqs[len(reqs)-1]
}

// post sends body and returns the status and the error message, if any.
func post(t *testing.T, s *Server, path, body string) (int, string) {
	t.Helper()
	resp, err := http.Post(s.URL()+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var eb errorBody
	_ = json.Unmarshal(b, &eb)
	return resp.StatusCode, eb.Error
}
