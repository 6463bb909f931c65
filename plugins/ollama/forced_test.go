package ollama

import (
	"encoding/json"
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/iop-dev/iop/sdk"
)

var (
	weather = sdk.Tool{Name: "get_weather", Description: "the weather in a city",
		Parameters: json.RawMessage(`{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}`)}
	mail = sdk.Tool{Name: "send_mail", Parameters: json.RawMessage(`{"type":"object","properties":{"to":{"type":"string"}}}`)}
	ping = sdk.Tool{Name: "ping"} // no parameters
)

// callID is the shape of a forced call's generated id.
var callID = regexp.MustCompile(`^call_[A-Z2-7]{26}$`)

// P2, issue 21: Ollama cannot force a tool call, so a forced choice is
// sent with format set to the call's schema and without the tools (the
// conversation as it is), and the answer's JSON comes back as that tool's
// call: one whole call at the end with an id of its own, no text, thinking
// still streamed, "tool_calls". The bodies are asserted byte for byte.
func TestForcedToolCallIsConstrainedAndReturnedAsTheCall(t *testing.T) {
	tests := []struct {
		name   string
		tools  []sdk.Tool
		choice sdk.ToolChoice
		format json.RawMessage // the run's own, replaced by the call's schema
		answer []string        // the content pieces Ollama streams
		schema string          // the format sent
		call   string          // name(arguments) of the call returned
	}{
		{"a named function", []sdk.Tool{weather, mail}, sdk.ToolChoiceFunction("get_weather"), nil,
			[]string{`{"ci`, `ty": "Paris"`, `}`},
			`{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}`,
			`get_weather({"city":"Paris"})`},
		{"a named function without parameters", []sdk.Tool{weather, ping}, sdk.ToolChoiceFunction("ping"), nil,
			[]string{`{}`},
			`{"type":"object","properties":{}}`,
			`ping({})`},
		{"required over one tool is that tool", []sdk.Tool{weather}, sdk.ToolChoiceRequired, json.RawMessage(`"json"`),
			[]string{` {"city":"Oslo"} `},
			`{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}`,
			`get_weather({"city":"Oslo"})`},
		{"required over several tools is their union", []sdk.Tool{weather, mail, ping}, sdk.ToolChoiceRequired, nil,
			[]string{`{"name": "send_mail", `, `"parameters": {"to": "ana@example.com"}}`},
			`{"oneOf":[` +
				`{"type":"object","properties":{"name":{"const":"get_weather"},"parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}},"required":["name","parameters"],"additionalProperties":false},` +
				`{"type":"object","properties":{"name":{"const":"send_mail"},"parameters":{"type":"object","properties":{"to":{"type":"string"}}}},"required":["name","parameters"],"additionalProperties":false},` +
				`{"type":"object","properties":{"name":{"const":"ping"},"parameters":{"type":"object","properties":{}}},"required":["name","parameters"],"additionalProperties":false}]}`,
			`send_mail({"to":"ana@example.com"})`},
		{"a union answer spelled with arguments", []sdk.Tool{weather, mail}, sdk.ToolChoiceRequired, nil,
			[]string{`{"name":"get_weather","arguments":{"city":"Rome"}}`}, "", `get_weather({"city":"Rome"})`},
		{"a union answer without parameters", []sdk.Tool{weather, ping}, sdk.ToolChoiceRequired, nil,
			[]string{`{"name":"ping"}`}, "", `ping({})`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := newScripted(t, func(int, string) (int, string) {
				return 200, `{"message":{"role":"assistant","content":"","thinking":"let me see"},"done":false}` + "\n" +
					answerLines("stop", tt.answer...)
			})
			req := userRun("m")
			req.Tools, req.Options.ToolChoice, req.Options.Format = tt.tools, tt.choice, tt.format
			var out sink
			res, err := newAdapter(t, srv.URL, nil).Execute(ctxTimeout(t, 5*time.Second), req, &out)
			if err != nil {
				t.Fatal(err)
			}
			body := srv.sent()[0]
			wantBody := `{"model":"m","messages":[{"role":"user","content":"hello"}],"stream":true,"format":` + tt.schema + `}`
			if tt.schema != "" && body != wantBody {
				t.Errorf("body\n got %s\nwant %s", body, wantBody)
			}
			evs := out.all()
			kinds := make([]string, len(evs))
			for i, ev := range evs {
				kinds[i] = ev.Kind.String()
			}
			if got := strings.Join(kinds, " "); got != "reasoning_delta tool_call_delta usage" {
				t.Fatalf("events %s, want reasoning_delta tool_call_delta usage", got)
			}
			c := evs[1].ToolCall
			if got := c.Name + "(" + c.Arguments + ")"; got != tt.call || c.Index != 0 || !callID.MatchString(c.ID) {
				t.Errorf("call %d %s %s, want %s with a generated id", c.Index, c.ID, got, tt.call)
			}
			if res.DoneReason != "tool_calls" || res.Usage.PromptTokens != 7 {
				t.Errorf("result %+v", res)
			}
		})
	}
}

// Issue 21: a forced call's id is the run's own: two runs, two ids.
func TestForcedCallIDsDiffer(t *testing.T) {
	srv := newScripted(t, func(int, string) (int, string) { return 200, answerLines("stop", `{"city":"Lima"}`) })
	a := newAdapter(t, srv.URL, nil)
	ids := map[string]bool{}
	for range 2 {
		req := userRun("m")
		req.Tools, req.Options.ToolChoice = []sdk.Tool{weather}, sdk.ToolChoiceFunction("get_weather")
		var out sink
		if _, err := a.Execute(ctxTimeout(t, 5*time.Second), req, &out); err != nil {
			t.Fatal(err)
		}
		ids[out.calls()[0].ID] = true
	}
	if len(ids) != 2 {
		t.Errorf("ids %v, want two", ids)
	}
}

// Issue 21: a server that answers a forced call with a tool call of its
// own (its parser took the constrained answer for one) has that call
// relayed as it came, once.
func TestForcedCallThatOllamaParsedIsRelayed(t *testing.T) {
	srv := newScripted(t, func(int, string) (int, string) {
		return 200, `{"message":{"role":"assistant","content":"","tool_calls":[{"id":"call_x","function":{"index":0,"name":"send_mail","arguments":{"to":"bo"}}}]},"done":false}` + "\n" +
			answerLines("stop")
	})
	req := userRun("m")
	req.Tools, req.Options.ToolChoice = []sdk.Tool{weather, mail}, sdk.ToolChoiceRequired
	var out sink
	res, err := newAdapter(t, srv.URL, nil).Execute(ctxTimeout(t, 5*time.Second), req, &out)
	if err != nil {
		t.Fatal(err)
	}
	calls := out.calls()
	if len(calls) != 1 || calls[0].ID != "call_x" || calls[0].Arguments != `{"to":"bo"}` || res.DoneReason != "tool_calls" ||
		out.text(sdk.TextDelta) != "" {
		t.Errorf("calls %+v, text %q, %+v", calls, out.text(sdk.TextDelta), res)
	}
}

// Issue 21: an answer that is not the forced call's JSON fails the run with
// ErrForcedCall (upstream), saying why without the answer's text, and no
// text reaches the host.
func TestForcedCallWithAMalformedAnswerFails(t *testing.T) {
	tests := []struct {
		name   string
		tools  []sdk.Tool
		choice sdk.ToolChoice
		answer string
		reason string
		why    string
	}{
		{"not JSON", []sdk.Tool{weather}, sdk.ToolChoiceFunction("get_weather"), "It is sunny in Paris.", "stop", "did not follow the schema"},
		{"empty", []sdk.Tool{weather}, sdk.ToolChoiceFunction("get_weather"), "  ", "stop", "did not follow the schema"},
		{"not an object", []sdk.Tool{weather}, sdk.ToolChoiceFunction("get_weather"), `["Paris"]`, "stop", "did not follow the schema"},
		{"cut short", []sdk.Tool{weather}, sdk.ToolChoiceFunction("get_weather"), `{"city":"Par`, "length", "cut short by the token limit"},
		{"a tool the run lacks", []sdk.Tool{weather, mail}, sdk.ToolChoiceRequired, `{"name":"rm_rf","parameters":{}}`, "stop", "naming one of the run's tools"},
		{"union arguments not an object", []sdk.Tool{weather, mail}, sdk.ToolChoiceRequired, `{"name":"send_mail","parameters":"bo"}`, "stop", "did not follow the schema"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := newScripted(t, func(int, string) (int, string) { return 200, answerLines(tt.reason, tt.answer) })
			req := userRun("m")
			req.Tools, req.Options.ToolChoice = tt.tools, tt.choice
			var out sink
			_, err := newAdapter(t, srv.URL, nil).Execute(ctxTimeout(t, 5*time.Second), req, &out)
			if !errors.Is(err, ErrForcedCall) || !errors.Is(err, sdk.ErrUpstream) || !strings.Contains(err.Error(), tt.why) {
				t.Fatalf("err %v, want ErrForcedCall saying %q", err, tt.why)
			}
			if strings.TrimSpace(tt.answer) != "" && strings.Contains(err.Error(), tt.answer) {
				t.Errorf("the error carries the answer: %v", err)
			}
			if len(out.all()) != 0 {
				t.Errorf("events sent: %+v", out.all())
			}
		})
	}
}

// Issue 21: a forced call sends the conversation's tool history as it is:
// the earlier calls and their results, without the tools.
func TestForcedCallKeepsTheToolHistory(t *testing.T) {
	srv := newScripted(t, func(int, string) (int, string) { return 200, answerLines("stop", `{"to":"bo"}`) })
	req := &sdk.Request{Target: "m", Tools: []sdk.Tool{weather, mail},
		Messages: []sdk.Message{
			{Role: "user", Content: "weather, then mail bo"},
			{Role: "assistant", ToolCalls: []sdk.ToolCall{{ID: "c1", Name: "get_weather", Arguments: `{"city":"Oslo"}`}}},
			{Role: "tool", ToolCallID: "c1", Content: "sunny"},
		},
		Options: sdk.Options{ToolChoice: sdk.ToolChoiceFunction("send_mail")}}
	var out sink
	if _, err := newAdapter(t, srv.URL, nil).Execute(ctxTimeout(t, 5*time.Second), req, &out); err != nil {
		t.Fatal(err)
	}
	const want = `{"model":"m","messages":[{"role":"user","content":"weather, then mail bo"},` +
		`{"role":"assistant","content":"","tool_calls":[{"id":"c1","function":{"index":0,"name":"get_weather","arguments":{"city":"Oslo"}}}]},` +
		`{"role":"tool","content":"sunny","tool_name":"get_weather","tool_call_id":"c1"}],"stream":true,` +
		`"format":{"type":"object","properties":{"to":{"type":"string"}}}}`
	if got := srv.sent()[0]; got != want {
		t.Errorf("body\n got %s\nwant %s", got, want)
	}
	if calls := out.calls(); len(calls) != 1 || calls[0].Name != "send_mail" {
		t.Errorf("calls %+v", calls)
	}
}
