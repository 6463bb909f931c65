package openaiapi

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	ft "github.com/iop-dev/iop/internal/edge/frontend/frontendtest"

	"github.com/iop-dev/iop/quicwire/wirepb"
)

// toolLine is a run's tool in one line, for comparing tool lists.
func toolLine(t *wirepb.Tool) string {
	return fmt.Sprintf("%s(%s) %q", t.GetName(), t.GetParametersJson(), t.GetDescription())
}

// P2: every kind of tool an agent declares is offered to the model as a
// function: a namespace's members under flat names, a custom tool as a
// function of one string (its grammar told in the description), the
// client-run built-ins with their actions' fields; hosted tools are set
// aside for the front end to drop or refuse.
func TestResponsesToolsBecomeFunctions(t *testing.T) {
	tests := []struct {
		name   string
		tools  string
		want   []string
		hosted []string
	}{
		{"a function, as before",
			`[{"type":"function","name":"exec_command","description":"run","strict":false,"parameters":{"type":"object"}}]`,
			[]string{`exec_command({"type":"object"}) "run"`}, nil},
		{"a namespace's functions, flat, with its description",
			`[{"type":"namespace","name":"multi_agent_v1","description":"Sub-agents.","tools":[` +
				`{"type":"function","name":"spawn_agent","description":"Start one.","strict":false,"parameters":{"type":"object"}},` +
				`{"type":"function","name":"wait","parameters":{"type":"object"}}]}]`,
			[]string{`multi_agent_v1__spawn_agent({"type":"object"}) "Start one.\n\n(multi_agent_v1: Sub-agents.)"`,
				`multi_agent_v1__wait({"type":"object"}) "(multi_agent_v1: Sub-agents.)"`}, nil},
		{"a custom tool in a namespace",
			`[{"type":"namespace","name":"ns","description":"","tools":[{"type":"custom","name":"note","description":"Jot."}]}]`,
			[]string{`ns__note(` + string(customParameters) + `) "Jot."`}, nil},
		{"a custom tool with a grammar",
			`[{"type":"custom","name":"apply_patch","description":"Patch files.","format":{"type":"grammar","syntax":"lark","definition":"start: begin_patch"}}]`,
			[]string{`apply_patch(` + string(customParameters) + `) "Patch files.\n\nThe input must follow lark grammar:\nstart: begin_patch"`}, nil},
		{"client-run built-ins",
			`[{"type":"local_shell"},{"type":"shell","environment":{"type":"local"}},{"type":"apply_patch"}]`,
			[]string{toolLine(&wirepb.Tool{Name: "local_shell", Description: builtinTools["local_shell"].description, ParametersJson: builtinTools["local_shell"].parameters}),
				toolLine(&wirepb.Tool{Name: "shell", Description: builtinTools["shell"].description, ParametersJson: builtinTools["shell"].parameters}),
				toolLine(&wirepb.Tool{Name: "apply_patch", Description: builtinTools["apply_patch"].description, ParametersJson: builtinTools["apply_patch"].parameters})},
			nil},
		{"a namespace without tools offers none", `[{"type":"namespace","name":"empty","description":"d"}]`, nil, nil},
		{"hosted tools are set aside",
			`[{"type":"web_search","external_web_access":false},{"type":"function","name":"f"},{"type":"file_search","vector_store_ids":["vs"]},` +
				`{"type":"code_interpreter","container":{"type":"auto"}},{"type":"mcp","server_label":"x"},{"type":"computer_use_preview"},` +
				`{"type":"image_generation"},{"type":"web_search_preview"},{"type":"shell","environment":{"type":"container_auto"}}]`,
			[]string{`f() ""`},
			[]string{"web_search", "file_search", "code_interpreter", "mcp", "computer_use_preview", "image_generation", "web_search_preview", "shell"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, e := parseResponses([]byte(`{"model":"m","input":"hi","tools":` + tt.tools + `}`))
			if e != nil {
				t.Fatalf("refused: %s (%s)", e.Message, e.Param)
			}
			var got []string
			for _, tool := range req.run.GetTools() {
				got = append(got, toolLine(tool))
			}
			if strings.Join(got, "\n") != strings.Join(tt.want, "\n") {
				t.Errorf("tools\n got %q\nwant %q", got, tt.want)
			}
			if strings.Join(req.hosted, ",") != strings.Join(tt.hosted, ",") {
				t.Errorf("hosted %q, want %q", req.hosted, tt.hosted)
			}
		})
	}
}

// P2: calls of an earlier turn come back in input as the client's items;
// they reach the model under the names it was offered, and their outputs
// as tool answers.
func TestResponsesToolItemsBecomeTheRunsMessages(t *testing.T) {
	const tools = `"tools":[{"type":"namespace","name":"multi_agent_v1","description":"d","tools":[{"type":"function","name":"wait"}]},` +
		`{"type":"custom","name":"apply_patch"},{"type":"local_shell"},{"type":"shell"},{"type":"apply_patch"}]`
	tests := []struct {
		name  string
		input string
		want  []string
	}{
		{"a namespace's function call, and its output",
			`[{"type":"function_call","call_id":"c1","namespace":"multi_agent_v1","name":"wait","arguments":"{}"},` +
				`{"type":"function_call_output","call_id":"c1","output":"done"}]`,
			[]string{`assistant: call[0]=c1:multi_agent_v1__wait:{}`, "tool:done answers=c1"}},
		{"a custom tool call: its input as the one argument",
			`[{"type":"custom_tool_call","call_id":"c2","name":"apply_patch","input":"*** Begin Patch\n*** End Patch"},` +
				`{"type":"custom_tool_call_output","call_id":"c2","output":[{"type":"input_text","text":"ok"}]}]`,
			[]string{`assistant: call[0]=c2:apply_patch:{"input":"*** Begin Patch\n*** End Patch"}`, "tool:ok answers=c2"}},
		{"a local shell call: its action without its type; its output by id",
			`[{"type":"local_shell_call","id":"ls1","call_id":"c3","status":"completed","action":{"type":"exec","command":["ls"],"env":{},"working_directory":"/w"}},` +
				`{"type":"local_shell_call_output","id":"c3","output":"a.go"}]`,
			[]string{`assistant: call[0]=c3:local_shell:{"command":["ls"],"env":{},"working_directory":"/w"}`, "tool:a.go answers=c3"}},
		{"a shell call and its outputs as text",
			`[{"type":"shell_call","call_id":"c4","action":{"commands":["ls","false"],"timeout_ms":1000}},` +
				`{"type":"shell_call_output","call_id":"c4","output":[{"stdout":"a.go\n","stderr":"","outcome":{"type":"exit","exit_code":0}},` +
				`{"stdout":"","stderr":"boom","outcome":{"type":"exit","exit_code":1}},{"stdout":"x","stderr":"","outcome":{"type":"timeout"}}]}]`,
			[]string{`assistant: call[0]=c4:shell:{"commands":["ls","false"],"timeout_ms":1000}`,
				"tool:a.go\n\n(exit code 0)\n\nstderr:\nboom\n(exit code 1)\n\nx\n(timed out) answers=c4"}},
		{"an apply_patch call; a failed output says so",
			`[{"type":"apply_patch_call","call_id":"c5","status":"completed","operation":{"type":"update_file","path":"a.go","diff":"@@"}},` +
				`{"type":"apply_patch_call_output","call_id":"c5","status":"failed","output":"no such file"}]`,
			[]string{`assistant: call[0]=c5:BUILTIN:{"diff":"@@","path":"a.go","type":"update_file"}`,
				"tool:The patch failed.\nno such file answers=c5"}},
		{"a call of a namespace this request does not declare reads as it would be offered",
			`[{"type":"function_call","call_id":"c6","namespace":"gone","name":"f","arguments":"{}"}]`,
			[]string{`assistant: call[0]=c6:gone__f:{}`}},
		{"reasoning with encrypted content and a summary: the summary is the reasoning",
			`[{"type":"reasoning","id":"rs","encrypted_content":"gAAAA","summary":[{"type":"summary_text","text":"plan"}]},` +
				`{"type":"function_call","call_id":"c7","name":"multi_agent_v1__wait","arguments":"{}"}]`,
			[]string{`assistant: reasoning=plan call[0]=c7:multi_agent_v1__wait:{}`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, e := parseResponses([]byte(`{"model":"m",` + tools + `,"input":` + tt.input + `}`))
			if e != nil {
				t.Fatalf("refused: %s (%s)", e.Message, e.Param)
			}
			got := msgLines(req.run)
			// The apply_patch built-in yields its name to the custom
			// tool declared as apply_patch: its call reads as the
			// function it was offered as, whatever that is named.
			builtin := req.tools.flatName(toolBuiltin, "", "apply_patch")
			if builtin == "apply_patch" || req.tools.declared(builtin).kind != toolBuiltin {
				t.Fatalf("the apply_patch built-in is offered as %q", builtin)
			}
			var want []string
			for _, w := range tt.want {
				want = append(want, strings.Replace(w, "BUILTIN", builtin, 1))
			}
			if strings.Join(got, "\n---\n") != strings.Join(want, "\n---\n") {
				t.Errorf("messages\n got %q\nwant %q", got, want)
			}
		})
	}
}

// P2: OpenAI's reasoning effort levels are the run's (xhigh is the wire's
// max), thinking on for all but none; an unknown level is a 400 naming
// the param, on both APIs.
func TestReasoningEffortLevels(t *testing.T) {
	for effort, want := range map[string]string{
		"none": "none", "minimal": "minimal", "low": "low", "medium": "medium", "high": "high", "xhigh": "max", "max": "max",
	} {
		resp, e := parseResponses([]byte(`{"model":"m","input":"hi","reasoning":{"effort":"` + effort + `","summary":"auto"}}`))
		chat, e2 := parseChat([]byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"reasoning_effort":"` + effort + `"}`))
		if e != nil || e2 != nil {
			t.Fatalf("%s refused: %v %v", effort, e, e2)
		}
		for api, o := range map[string]*wirepb.RunOptions{"responses": resp.run.GetOptions(), "chat": chat.run.GetOptions()} {
			if o.GetReasoningEffort() != want || o.Think == nil || o.GetThink() != (want != "none") {
				t.Errorf("%s %s: effort %q think %v, want %q", api, effort, o.GetReasoningEffort(), o.Think, want)
			}
		}
	}
	for body, param := range map[string]string{
		`{"model":"m","input":"hi","reasoning":{"effort":"extreme"}}`:                              "reasoning.effort",
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"reasoning_effort":"turbo"}`:     "reasoning_effort",
		`{"model":"m","input":"hi","reasoning":{"effort":"HIGH"}}`:                                 "reasoning.effort",
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"reasoning_effort":"very high"}`: "reasoning_effort",
	} {
		r := respReq(body)
		if strings.Contains(body, "messages") {
			r = chatReq(body)
		}
		e := newEnv(t, &ft.Dispatcher{Events: []ft.Step{ft.Completed("stop")}})
		w := e.do(r)
		b := apiErrorOf(t, w.Body.String())
		if w.Code != http.StatusBadRequest || paramOf(b) != param || !strings.Contains(b.Error.Message, "xhigh") {
			t.Errorf("%s: %d %s", body, w.Code, w.Body)
		}
	}
	// No effort, or null: the model's default.
	for _, body := range []string{`{"model":"m","input":"hi","reasoning":{"summary":"auto"}}`, `{"model":"m","input":"hi","reasoning":{"effort":null}}`} {
		req, e := parseResponses([]byte(body))
		if e != nil || req.run.GetOptions().GetReasoningEffort() != "" || req.run.GetOptions().Think != nil {
			t.Errorf("%s: %v %v", body, e, req.run.GetOptions())
		}
	}
}

// P2: the fields agents and the SDKs send are accepted, each acted on or
// ignored on purpose, never a 400 for the request as a whole.
func TestResponsesAcceptsWhatAgentsSend(t *testing.T) {
	for _, field := range []string{
		`"include":["reasoning.encrypted_content"]`, `"prompt_cache_key":"019a-session"`, `"client_metadata":{"x":"y"}`,
		`"metadata":{"k":"v"}`, `"reasoning":{"summary":"auto"}`, `"reasoning":{"generate_summary":"concise"}`,
		`"parallel_tool_calls":true`, `"store":false`, `"store":true`, `"service_tier":"auto"`, `"truncation":"auto"`,
		`"text":{"verbosity":"low"}`, `"safety_identifier":"h"`, `"user":"u"`, `"prompt_cache_retention":"24h"`,
		`"stream_options":{"include_obfuscation":false}`, `"background":false`, `"max_output_tokens":100`,
		`"context_management":[{"type":"compaction","compact_threshold":1000}]`, `"tool_choice":"auto"`,
		`"top_logprobs":0`, `"max_tool_calls":5`, `"previous_response_id":null`,
	} {
		e := newEnv(t, &ft.Dispatcher{Events: []ft.Step{ft.Text("ok"), ft.Completed("stop")}})
		w := e.do(respReq(`{"model":"m1","input":"hi",` + field + `}`))
		if w.Code != http.StatusOK || !strings.Contains(w.Body.String(), `"store":false`) {
			t.Errorf("%s: %d %s", field, w.Code, w.Body)
		}
	}
}

// P2: what reaches the provider: text.verbosity as chat's verbosity (a
// top-level one the client sent wins); the Responses API's own fields do
// not; text.format's schema, name and strict are the run's format, and
// echoed.
func TestResponsesFieldsReachTheProvider(t *testing.T) {
	req, e := parseResponses([]byte(`{"model":"m","input":"hi","text":{"verbosity":"low","format":{"type":"json_schema","name":"w",` +
		`"schema":{"type":"object"},"strict":true}},"client_metadata":{"a":"b"},"context_management":[],"service_tier":"flex",` +
		`"max_output_tokens":9,"prompt_cache_key":"k"}`))
	if e != nil {
		t.Fatal(e.Message)
	}
	o := req.run.GetOptions()
	if got, want := string(o.GetExtraJson()), `{"prompt_cache_key":"k","service_tier":"flex","verbosity":"low"}`; got != want {
		t.Errorf("extra_json %s, want %s", got, want)
	}
	if string(o.GetFormat()) != `{"type":"object"}` || o.GetFormatName() != "w" || !o.GetFormatStrict() || o.GetMaxTokens() != 9 {
		t.Errorf("options %v", o)
	}
	if f := req.echo.Text.Format; f.Name != "w" || f.Strict == nil || !*f.Strict {
		t.Errorf("echoed format %+v", f)
	}
	req, e = parseResponses([]byte(`{"model":"m","input":"hi","text":{"verbosity":"low"},"verbosity":"high"}`))
	if e != nil || string(req.run.GetOptions().GetExtraJson()) != `{"verbosity":"high"}` {
		t.Errorf("a top-level verbosity: %v %s", e, req.run.GetOptions().GetExtraJson())
	}
}

// P2: a tool_choice names a tool as the client declared it: a namespace's
// member by its inner name (with or without its namespace), a custom tool,
// a client-run built-in; the run's choice names the function the model
// sees.
func TestResponsesToolChoiceNamesTheFunctionTheModelSees(t *testing.T) {
	const tools = `"tools":[{"type":"namespace","name":"ns","description":"","tools":[{"type":"function","name":"wait"}]},` +
		`{"type":"custom","name":"patch"},{"type":"shell"},{"type":"function","name":"f"}]`
	for choice, want := range map[string]string{
		`{"type":"function","name":"wait"}`:                  "function:ns__wait",
		`{"type":"function","name":"wait","namespace":"ns"}`: "function:ns__wait",
		`{"type":"function","name":"ns__wait"}`:              "function:ns__wait",
		`{"type":"function","name":"f"}`:                     "function:f",
		`{"type":"custom","name":"patch"}`:                   "function:patch",
		`{"type":"shell"}`:                                   "function:shell",
		`"required"`:                                         "required",
	} {
		req, e := parseResponses([]byte(`{"model":"m","input":"hi",` + tools + `,"tool_choice":` + choice + `}`))
		if e != nil {
			t.Errorf("%s: %s", choice, e.Message)
			continue
		}
		if got := req.run.GetOptions().GetToolChoice(); got != want {
			t.Errorf("%s: %q, want %q", choice, got, want)
		}
		if b, _ := json.Marshal(req.echo.ToolChoice); compact(t, string(b)) != compact(t, choice) {
			t.Errorf("%s echoed as %s", choice, b)
		}
	}
	for choice, says := range map[string]string{
		`{"type":"function","name":"nope"}`: `"nope"`,
		`{"type":"custom","name":"nope"}`:   `"nope"`,
		`{"type":"apply_patch"}`:            "apply_patch",
		`{"type":"web_search_preview"}`:     "web_search_preview",
	} {
		_, e := parseResponses([]byte(`{"model":"m","input":"hi",` + tools + `,"tool_choice":` + choice + `}`))
		if e == nil || e.Param != "tool_choice" || !strings.Contains(e.Message, says) {
			t.Errorf("%s: %v", choice, e)
		}
	}
}

// P2, P3: tools the Edge cannot offer are refused with a 400 naming the
// tool; a namespace's tools count toward the request's bound.
func TestResponsesRefusesToolsItCannotOffer(t *testing.T) {
	many := strings.TrimSuffix(strings.Repeat(`{"type":"function","name":"f"},`, MaxTools), ",")
	tests := []struct {
		name, tools, param, says string
	}{
		{"a type of nobody's", `[{"type":"teleport"}]`, "tools[0].type", "teleport"},
		{"no type", `[{"name":"f"}]`, "tools[0].type", "type"},
		{"a nameless namespace", `[{"type":"namespace","tools":[]}]`, "tools[0].name", "name"},
		{"a namespace in a namespace", `[{"type":"namespace","name":"a","tools":[{"type":"namespace","name":"b","tools":[]}]}]`,
			"tools[0].tools[0].type", "namespace"},
		{"a nameless member", `[{"type":"namespace","name":"a","tools":[{"type":"function"}]}]`, "tools[0].tools[0].name", "name"},
		{"a nameless custom tool", `[{"type":"custom"}]`, "tools[0].name", "name"},
		{"a namespace's tools past the bound", `[{"type":"function","name":"g"},{"type":"namespace","name":"a","tools":[` + many + `]}]`,
			"tools[1].tools", "at most 1000"},
		{"a namespace's tools of the wrong type", `[{"type":"namespace","name":"a","tools":7}]`, "tools[0].tools", "tools"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, e := parseResponses([]byte(`{"model":"m","input":"hi","tools":` + tt.tools + `}`))
			if e == nil || e.Status != http.StatusBadRequest || e.Param != tt.param || !strings.Contains(e.Message, tt.says) {
				t.Errorf("%+v", e)
			}
		})
	}
	// Exactly at the bound, a namespace's tools included: accepted.
	exact := strings.TrimSuffix(strings.Repeat(`{"type":"function","name":"f"},`, MaxTools-1), ",")
	if req, e := parseResponses([]byte(`{"model":"m","input":"hi","tools":[{"type":"function","name":"g"},{"type":"namespace","name":"a","tools":[` +
		exact + `]}]}`)); e != nil || len(req.run.GetTools()) != MaxTools {
		t.Errorf("%d tools at the bound: %v", MaxTools, e)
	}
}
