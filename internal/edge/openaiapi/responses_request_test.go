package openaiapi

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	ft "github.com/iop-dev/iop/internal/edge/frontend/frontendtest"

	"github.com/iop-dev/iop/quicwire/wirepb"
)

// msgLine is a chat message in one line, for comparing histories.
func msgLine(m *wirepb.ChatMessage) string {
	s := m.GetRole() + ":" + m.GetContent()
	if r := m.GetReasoning(); r != "" {
		s += " reasoning=" + r
	}
	for _, tc := range m.GetToolCalls() {
		s += fmt.Sprintf(" call[%d]=%s:%s:%s", tc.GetIndex(), tc.GetId(), tc.GetName(), tc.GetArgumentsJson())
	}
	if id := m.GetToolCallId(); id != "" {
		s += " answers=" + id
	}
	if n := m.GetName(); n != "" {
		s += " name=" + n
	}
	if n := len(m.GetImages()); n > 0 {
		s += fmt.Sprintf(" images=%d", n)
	}
	return s
}

func msgLines(run *wirepb.RunRequest) []string {
	var out []string
	for _, m := range run.GetMessages() {
		out = append(out, msgLine(m))
	}
	return out
}

// P2: every kind of input item becomes the chat history a model server
// reads; the items of one assistant turn (reasoning, text, calls) join one
// assistant message, as a chat history has them.
func TestResponsesInputItemsBecomeTheRunsMessages(t *testing.T) {
	const png = "data:image/png;base64,aGk="
	tests := []struct {
		name string
		body string
		want []string
	}{
		{"a string is one user message", `{"model":"m","input":"hi"}`, []string{"user:hi"}},
		{"instructions come first, as system",
			`{"model":"m","instructions":"be brief","input":"hi"}`, []string{"system:be brief", "user:hi"}},
		{"messages with a role and no type; developer is system",
			`{"model":"m","input":[{"role":"developer","content":"rules"},{"role":"system","content":"more"},{"role":"user","content":"q"},{"role":"assistant","content":"a"}]}`,
			[]string{"system:rules", "system:more", "user:q", "assistant:a"}},
		{"parts: text joined with newlines, an image as bytes",
			`{"model":"m","input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"look"},{"type":"input_image","image_url":"` + png + `","detail":"auto"},{"type":"input_text","text":"here"}]}]}`,
			[]string{"user:look\nhere images=1"}},
		{"an assistant message of output_text parts",
			`{"model":"m","input":[{"type":"message","role":"assistant","id":"msg_1","status":"completed","content":[{"type":"output_text","text":"earlier","annotations":[]},{"type":"refusal","refusal":"no"}]}]}`,
			[]string{"assistant:earlier\nno"}},
		{"function call round trip",
			`{"model":"m","input":[{"role":"user","content":"weather?"},` +
				`{"type":"function_call","id":"fc_1","call_id":"call_1","name":"get_weather","arguments":"{\"city\":\"Seoul\"}","status":"completed"},` +
				`{"type":"function_call_output","call_id":"call_1","output":"22C"}]}`,
			[]string{"user:weather?", `assistant: call[0]=call_1:get_weather:{"city":"Seoul"}`, "tool:22C answers=call_1"}},
		{"one turn: reasoning, text and parallel calls join one message",
			`{"model":"m","input":[{"role":"user","content":"q"},` +
				`{"type":"reasoning","id":"rs_1","summary":[],"content":[{"type":"reasoning_text","text":"think"}]},` +
				`{"type":"message","role":"assistant","content":[{"type":"output_text","text":"checking"}]},` +
				`{"type":"function_call","call_id":"a","name":"f","arguments":"{}"},` +
				`{"type":"function_call","call_id":"b","name":"g","arguments":"{}"},` +
				`{"type":"function_call_output","call_id":"a","output":"1"},` +
				`{"type":"function_call_output","call_id":"b","output":[{"type":"input_text","text":"2"}]},` +
				`{"type":"reasoning","id":"rs_2","summary":[{"type":"summary_text","text":"sum"}]},` +
				`{"role":"assistant","content":"done"}]}`,
			[]string{"user:q", "assistant:checking reasoning=think call[0]=a:f:{} call[1]=b:g:{}",
				"tool:1 answers=a", "tool:2 answers=b", "assistant:done reasoning=sum"}},
		{"two assistant messages in a row stay two",
			`{"model":"m","input":[{"role":"assistant","content":"one"},{"role":"assistant","content":"two"}]}`,
			[]string{"assistant:one", "assistant:two"}},
		{"a reasoning item with only encrypted content adds nothing",
			`{"model":"m","input":[{"type":"reasoning","id":"rs","summary":[],"encrypted_content":"xyz"},{"role":"user","content":"q"}]}`,
			[]string{"user:q"}},
		{"a function_call_output may name its function",
			`{"model":"m","input":[{"type":"function_call_output","call_id":"c","name":"f","output":"x"}]}`,
			[]string{"tool:x answers=c name=f"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, e := parseResponses([]byte(tt.body))
			if e != nil {
				t.Fatalf("refused: %d %s (%s)", e.Status, e.Message, e.Param)
			}
			got := msgLines(req.run)
			if strings.Join(got, "\n---\n") != strings.Join(tt.want, "\n---\n") {
				t.Errorf("messages\n got %q\nwant %q", got, tt.want)
			}
		})
	}
}

// P2: tools, tool_choice and the options become the run's; reasoning
// effort turns thinking on or off; text.format is the run's format.
func TestResponsesOptionsBecomeTheRunsOptions(t *testing.T) {
	const tools = `"tools":[{"type":"function","name":"get_weather","description":"now","parameters":{"type":"object"},"strict":true}]`
	req, e := parseResponses([]byte(`{"model":"m","input":"hi",` + tools + `,"tool_choice":{"type":"function","name":"get_weather"},` +
		`"max_output_tokens":64,"temperature":0.5,"top_p":0.9,"reasoning":{"effort":"high","summary":"auto"},` +
		`"text":{"format":{"type":"json_schema","name":"w","schema":{"type":"object"},"strict":true}}}`))
	if e != nil {
		t.Fatal(e.Message)
	}
	o := req.run.GetOptions()
	if len(req.run.GetTools()) != 1 || req.run.GetTools()[0].GetName() != "get_weather" || req.run.GetTools()[0].GetDescription() != "now" ||
		string(req.run.GetTools()[0].GetParametersJson()) != `{"type":"object"}` {
		t.Errorf("tools %v", req.run.GetTools())
	}
	if o.GetToolChoice() != "function:get_weather" || o.GetMaxTokens() != 64 || o.GetTemperature() != 0.5 || o.GetTopP() != 0.9 ||
		!o.GetThink() || string(o.GetFormat()) != `{"type":"object"}` {
		t.Errorf("options %v", o)
	}
	for body, want := range map[string]struct {
		think, set bool
		format     string
		choice     string
	}{
		`{"model":"m","input":"hi","reasoning":{"effort":"none"}}`:                       {false, true, "", ""},
		`{"model":"m","input":"hi","reasoning":{"summary":"auto"}}`:                      {false, false, "", ""},
		`{"model":"m","input":"hi","text":{"format":{"type":"json_object"}}}`:            {false, false, "json", ""},
		`{"model":"m","input":"hi","text":{"format":{"type":"text"},"verbosity":"low"}}`: {false, false, "", ""},
		`{"model":"m","input":"hi",` + tools + `,"tool_choice":"required"}`:              {false, false, "", "required"},
		`{"model":"m","input":"hi",` + tools + `,"tool_choice":"none"}`:                  {false, false, "", "none"},
	} {
		req, e := parseResponses([]byte(body))
		if e != nil {
			t.Fatalf("%s: %s", body, e.Message)
		}
		o := req.run.GetOptions()
		if (o.Think != nil) != want.set || o.GetThink() != want.think || string(o.GetFormat()) != want.format || o.GetToolChoice() != want.choice {
			t.Errorf("%s: think %v format %q choice %q", body, o.Think, o.GetFormat(), o.GetToolChoice())
		}
	}
}

// P2: the fields the Edge does not interpret reach the provider
// (extra_json); the Responses API's own ones, which a chat server would
// not know, do not.
func TestResponsesPassThroughLeavesTheAPIsOwnFieldsOut(t *testing.T) {
	req, e := parseResponses([]byte(`{"model":"m","input":"hi","top_k":20,"user":"u1","chat_template_kwargs":{"enable_thinking":false},` +
		`"store":false,"include":["reasoning.encrypted_content"],"parallel_tool_calls":false,"metadata":{"k":"v"},"truncation":"auto",` +
		`"stream_options":{"include_obfuscation":false},"max_tool_calls":3,"top_logprobs":2,"previous_response_id":null,"prompt_cache_key":"p"}`))
	if e != nil {
		t.Fatal(e.Message)
	}
	want := `{"chat_template_kwargs":{"enable_thinking":false},"prompt_cache_key":"p","top_k":20,"user":"u1"}`
	if got := string(req.run.GetOptions().GetExtraJson()); got != want {
		t.Errorf("extra_json\n got %s\nwant %s", got, want)
	}
	if req.echo.ParallelToolCalls || req.echo.Metadata["k"] != "v" {
		t.Errorf("echo %+v", req.echo)
	}
}

// P2, S6: what the Edge cannot do is refused before anything runs, with a
// 400 naming the field and saying why: state it does not keep, built-in
// tools, images it would have to fetch, and malformed items.
func TestResponsesRefusesWhatTheEdgeCannotDo(t *testing.T) {
	const tool = `"tools":[{"type":"function","name":"f","parameters":{"type":"object"}}]`
	tests := []struct {
		name, body, param, says string
	}{
		{"no model", `{"input":"hi"}`, "model", "model"},
		{"no input", `{"model":"m"}`, "input", "input"},
		{"empty input", `{"model":"m","input":[]}`, "input", "input"},
		{"previous_response_id", `{"model":"m","input":"hi","previous_response_id":"resp_1"}`, "previous_response_id", "no conversation state"},
		{"conversation", `{"model":"m","input":"hi","conversation":"conv_1"}`, "conversation", "no conversation state"},
		{"background", `{"model":"m","input":"hi","background":true}`, "background", "background"},
		{"stored prompt", `{"model":"m","input":"hi","prompt":{"id":"pmpt_1"}}`, "prompt", "Stored prompts"},
		{"nameless function", `{"model":"m","input":"hi","tools":[{"type":"function"}]}`, "tools[0].name", "name"},
		{"http image", `{"model":"m","input":[{"role":"user","content":[{"type":"input_image","image_url":"https://example.com/a.png"}]}]}`,
			"input[0].content[0].image_url", "data URLs"},
		{"image by file id", `{"model":"m","input":[{"role":"user","content":[{"type":"input_image","file_id":"file_1"}]}]}`,
			"input[0].content[0].image_url", "file_id"},
		{"input file", `{"model":"m","input":[{"role":"user","content":[{"type":"input_file","file_id":"file_1"}]}]}`,
			"input[0].content[0].type", "input_file"},
		{"item reference", `{"model":"m","input":[{"type":"item_reference","id":"msg_1"}]}`, "input[0].type", "item_reference"},
		{"built-in tool call item", `{"model":"m","input":[{"type":"web_search_call","id":"ws_1"}]}`, "input[0].type", "web_search_call"},
		{"unknown role", `{"model":"m","input":[{"role":"tool","content":"x"}]}`, "input[0].role", "tool"},
		{"no content", `{"model":"m","input":[{"role":"user"}]}`, "input[0].content", "content"},
		{"call without call_id", `{"model":"m","input":[{"type":"function_call","name":"f","arguments":"{}"}]}`, "input[0].call_id", "call_id"},
		{"output without call_id", `{"model":"m","input":[{"type":"function_call_output","output":"x"}]}`, "input[0].call_id", "call_id"},
		{"tool_choice of an unknown function", `{"model":"m","input":"hi",` + tool + `,"tool_choice":{"type":"function","name":"g"}}`,
			"tool_choice", `"g"`},
		{"tool_choice of a built-in tool", `{"model":"m","input":"hi",` + tool + `,"tool_choice":{"type":"web_search_preview"}}`,
			"tool_choice", "web_search_preview"},
		{"required without tools", `{"model":"m","input":"hi","tool_choice":"required"}`, "tool_choice", "required"},
		{"json_schema without a schema", `{"model":"m","input":"hi","text":{"format":{"type":"json_schema","name":"x"}}}`,
			"text.format.schema", "schema"},
		{"unknown format", `{"model":"m","input":"hi","text":{"format":{"type":"yaml"}}}`, "text.format.type", "yaml"},
		{"temperature", `{"model":"m","input":"hi","temperature":3}`, "temperature", "between 0 and 2"},
		{"max_output_tokens", `{"model":"m","input":"hi","max_output_tokens":0}`, "max_output_tokens", "at least 1"},
		{"metadata past OpenAI's bound", `{"model":"m","input":"hi","metadata":{` + metadataPairs(17) + `}}`, "metadata", "16"},
		{"input of the wrong type", `{"model":"m","input":7}`, "input", "input"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, &ft.Dispatcher{Events: []ft.Step{ft.Completed("stop")}})
			w := e.do(respReq(tt.body))
			b := apiErrorOf(t, w.Body.String())
			if w.Code != http.StatusBadRequest || paramOf(b) != tt.param || !strings.Contains(b.Error.Message, tt.says) ||
				b.Error.Type != typeInvalidRequest {
				t.Errorf("status %d param %q: %s", w.Code, paramOf(b), w.Body)
			}
			if len(e.runner.RunRequests()) != 0 {
				t.Error("a refused request reached the runner")
			}
		})
	}
}

func metadataPairs(n int) string {
	pairs := make([]string, n)
	for i := range pairs {
		pairs[i] = fmt.Sprintf(`"k%d":"v"`, i)
	}
	return strings.Join(pairs, ",")
}

// P3: the input is bounded as it is decoded, like chat's messages.
func TestResponsesInputIsBoundedAsItIsDecoded(t *testing.T) {
	e := newEnv(t, &ft.Dispatcher{})
	w := e.do(respReq(`{"model":"m1","input":[` + strings.Repeat("{},", MaxMessages) + `{}]}`))
	b := apiErrorOf(t, w.Body.String())
	if w.Code != http.StatusBadRequest || paramOf(b) != "input" || !strings.Contains(b.Error.Message, "at most 10000") {
		t.Fatalf("status %d param %q: %s", w.Code, paramOf(b), w.Body)
	}
	big := `{"model":"m1","input":"` + strings.Repeat("a", testMaxRequest) + `"}`
	if w := e.do(respReq(big)); w.Code != http.StatusRequestEntityTooLarge {
		t.Errorf("a body over the limit: status %d", w.Code)
	}
	if len(e.runner.RunRequests()) != 0 {
		t.Error("a refused request reached the runner")
	}
}
