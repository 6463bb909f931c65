package openaiapi

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	ft "github.com/iop-dev/iop/internal/edge/frontend/frontendtest"
)

const ptMessages = `"messages":[{"role":"user","content":"hi"}]`

// ptTools is a tools list with one function, get_weather.
const ptTools = `"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}]`

// mustParse parses body, failing the test on a refusal.
func mustParse(t *testing.T, body string) *parsedChat {
	t.Helper()
	req, e := parseChat([]byte(body))
	if e != nil {
		t.Fatalf("refused with %d (%s): %s", e.Status, e.Param, e.Message)
	}
	return req
}

// P2: the fields of a chat request that the Edge does not interpret travel
// with the run, with their values as the client sent them (compacted), in
// RunOptions.extra_json; the ones it interprets do not.
func TestUninterpretedFieldsTravelWithTheRun(t *testing.T) {
	tests := []struct {
		name, fields, want string
	}{
		{"sampling fields OpenAI-compatible servers know",
			`"top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1, "presence_penalty": 0.5, "frequency_penalty": -0.5`,
			`{"frequency_penalty":-0.5,"min_p":0.05,"presence_penalty":0.5,"repetition_penalty":1.1,"top_k":20}`},
		{"OpenAI's fields the Edge does not act on",
			`"logit_bias": {"50256": -100}, "user": "u-1", "parallel_tool_calls": false, "logprobs": true, "top_logprobs": 2`,
			`{"logit_bias":{"50256":-100},"logprobs":true,"parallel_tool_calls":false,"top_logprobs":2,"user":"u-1"}`},
		{"vendor extras, nested, with strings that look like JSON",
			`"chat_template_kwargs": {"enable_thinking": false}, "x_vendor": {"a": [1, "}]", {"b": "\"{"}], "c": null}`,
			`{"chat_template_kwargs":{"enable_thinking":false},"x_vendor":{"a":[1,"}]",{"b":"\"{"}],"c":null}}`},
		{"a name with escapes is the name it spells",
			`"top\u005fk": 3`, `{"top_k":3}`},
		{"null is the default and is left out",
			`"top_k": null, "user": "u"`, `{"user":"u"}`},
		{"a repeated field keeps its last value, as decoding does",
			`"top_k": 1, "top_k": 2, "min_p": 0.1, "min_p": null`, `{"top_k":2}`},
		{"interpreted fields are matched without regard to case, as decoding does",
			`"Temperature": 0.5, "TOP_P": 0.5, "Stream_Options": {"include_usage": true}, "top_k": 4`, `{"top_k":4}`},
		{"none", ``, ``},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body := `{"model":"m1",` + ptMessages
			if tt.fields != "" {
				body += ", " + tt.fields
			}
			got := mustParse(t, body+"}").run.GetOptions().GetExtraJson()
			if string(got) != tt.want {
				t.Errorf("extra_json %s, want %s", got, tt.want)
			}
		})
	}
}

// P2: the fields the Edge interprets, or that shape its own answer, never
// reach the provider a second time through extra_json.
func TestInterpretedFieldsAreNotPassedThrough(t *testing.T) {
	body := `{"model":"m1",` + ptMessages + `,` + ptTools + `,"stream":true,"stream_options":{"include_usage":true},
		"temperature":0.1,"top_p":0.2,"max_tokens":3,"max_completion_tokens":4,"stop":"x","seed":5,"n":1,
		"response_format":{"type":"json_object"},"reasoning_effort":"low","tool_choice":"required",
		"web_search_options":{"search_context_size":"low"}}`
	req := mustParse(t, body)
	if got := req.run.GetOptions().GetExtraJson(); got != nil {
		t.Errorf("extra_json %s, want none", got)
	}
	if len(interpreted) != 16 {
		t.Errorf("%d interpreted fields; this test sends 16", len(interpreted))
	}
}

// P2, P3: pass-through has bounds. The number of fields is capped as the
// body is scanned; their size is bounded by the frame the run must fit.
func TestPassThroughIsBounded(t *testing.T) {
	many := func(n int) string {
		var b strings.Builder
		for i := range n {
			fmt.Fprintf(&b, `,"x%d":1`, i)
		}
		return `{"model":"m1",` + ptMessages + b.String() + `}`
	}
	if got := mustParse(t, many(MaxExtraFields)).run.GetOptions().GetExtraJson(); !json.Valid(got) {
		t.Fatalf("extra_json of %d fields is not JSON: %.100s", MaxExtraFields, got)
	}
	_, e := parseChat([]byte(many(MaxExtraFields + 1)))
	if e == nil || e.Status != http.StatusBadRequest || !strings.Contains(e.Message, "at most 256") {
		t.Errorf("%d fields: %v", MaxExtraFields+1, e)
	}
	// A repeated name is one field.
	dup := `{"model":"m1",` + ptMessages + strings.Repeat(`,"x":1`, MaxExtraFields+10) + `}`
	if got := string(mustParse(t, dup).run.GetOptions().GetExtraJson()); got != `{"x":1}` {
		t.Errorf("repeated field: %s", got)
	}
	// An extra field counts toward the request's size like any other: one
	// past a frame travels (the front end bounds the run, not the frame),
	// one past the request limit is 413.
	env := newEnv(t, &ft.Dispatcher{Events: []ft.Step{ft.Text("ok"), ft.Completed("stop")}})
	big := `{"model":"m1",` + ptMessages + `,"documents":"` + strings.Repeat("a", testMaxRequest/2) + `"}`
	if w := env.do(chatReq(big)); w.Code != http.StatusOK || len(env.runner.RunRequests()) != 1 {
		t.Errorf("a run past one frame through an extra field: %d %s", w.Code, w.Body)
	}
	huge := `{"model":"m1",` + ptMessages + `,"documents":"` + strings.Repeat("a", testMaxRequest) + `"}`
	if w := env.do(chatReq(huge)); w.Code != http.StatusRequestEntityTooLarge || len(env.runner.RunRequests()) != 1 {
		t.Errorf("an extra field past the request limit: %d %s", w.Code, w.Body)
	}
	fits := `{"model":"m1",` + ptMessages + `,"documents":"` + strings.Repeat("a", 256<<10) + `"}`
	if got := mustParse(t, fits).run.GetOptions().GetExtraJson(); len(got) < 256<<10 {
		t.Errorf("a 256 KiB extra field was cut to %d bytes", len(got))
	}
}

// P2: tool_choice travels as the wire's tool_choice in each of OpenAI's
// forms.
func TestToolChoiceForms(t *testing.T) {
	tests := []struct{ choice, want string }{
		{`"auto"`, "auto"},
		{`"none"`, "none"},
		{`"required"`, "required"},
		{`{"type":"function","function":{"name":"get_weather"}}`, "function:get_weather"},
		{`null`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.choice, func(t *testing.T) {
			req := mustParse(t, `{"model":"m1",`+ptMessages+`,`+ptTools+`,"tool_choice":`+tt.choice+`}`)
			if got := req.run.GetOptions().GetToolChoice(); got != tt.want {
				t.Errorf("tool_choice %q, want %q", got, tt.want)
			}
		})
	}
	// auto and none need no tools: they ask for nothing a model without
	// tools does not already do.
	for _, c := range []string{`"auto"`, `"none"`} {
		mustParse(t, `{"model":"m1",`+ptMessages+`,"tool_choice":`+c+`}`)
	}
}

// P2: a tool_choice the Edge cannot pass on faithfully is a clear 400
// naming tool_choice, before any run starts.
func TestToolChoiceRefusals(t *testing.T) {
	tests := []struct{ name, fields, says string }{
		{"required without tools", `"tool_choice":"required"`, "needs tools"},
		{"a named function without tools", `"tool_choice":{"type":"function","function":{"name":"get_weather"}}`, "no tools"},
		{"a named function not among tools", ptTools + `,"tool_choice":{"type":"function","function":{"name":"send_mail"}}`, "not among tools"},
		{"a function without a name", ptTools + `,"tool_choice":{"type":"function","function":{}}`, "name"},
		{"an unknown word", ptTools + `,"tool_choice":"any"`, `"any"`},
		{"an unknown type", ptTools + `,"tool_choice":{"type":"allowed_tools","allowed_tools":{"mode":"auto","tools":[]}}`, `"allowed_tools"`},
		{"a number", ptTools + `,"tool_choice":1`, "must be"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, e := parseChat([]byte(`{"model":"m1",` + ptMessages + `,` + tt.fields + `}`))
			if e == nil || e.Status != http.StatusBadRequest || e.Param != "tool_choice" || !strings.Contains(e.Message, tt.says) {
				t.Errorf("got %+v, want a 400 on tool_choice saying %s", e, tt.says)
			}
		})
	}
}
