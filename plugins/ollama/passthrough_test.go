package ollama

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/ollama/ollama/api"

	"github.com/iop-dev/iop/internal/fakes/fakeollama"
	"github.com/iop-dev/iop/sdk"
)

// sentBody runs req through an adapter configured with cfg against a fake
// Ollama and returns the /api/chat body the fake recorded, as compact
// JSON per top-level field.
func sentBody(t *testing.T, cfg map[string]any, req *sdk.Request) map[string]string {
	t.Helper()
	f := newFake(t, fakeollama.Model{Name: "m", Thinking: "hmm",
		ToolCalls: []fakeollama.ToolCall{{Name: "get_weather", Arguments: []byte(`{}`)}}})
	if _, err := newAdapter(t, f.URL(), cfg).Execute(ctxTimeout(t, 5*time.Second), req, &sink{}); err != nil {
		t.Fatal(err)
	}
	var fields map[string]json.RawMessage
	if err := lastRequest(t, f).Decode(&fields); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for k, v := range fields {
		b, _ := json.Marshal(v) // compact, keys sorted
		out[k] = string(b)
	}
	return out
}

// P2: the fields the Edge does not interpret reach Ollama where Ollama
// takes them: its options into options (OpenAI-compatible names mapped),
// an options object merged, keep_alive, think, truncate and shift at the
// top level; what Ollama has no use for is not sent; a normalized option
// wins.
func TestExtraFieldsGoWhereOllamaTakesThem(t *testing.T) {
	req := userRun("m")
	temp := 0.2
	req.Options.Temperature = &temp
	req.Options.Extra = json.RawMessage(`{
		"top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1, "presence_penalty": 0.5, "frequency_penalty": -0.5,
		"typical_p": 0.9, "num_ctx": 8192, "num_predict": 10, "temperature": 1.9, "seed": null,
		"options": {"num_ctx": 4096, "mirostat": 2},
		"keep_alive": "10m", "think": "high", "truncate": false, "shift": true,
		"logit_bias": {"50256": -100}, "user": "u-1", "parallel_tool_calls": false, "logprobs": true,
		"top_logprobs": 2, "chat_template_kwargs": {"enable_thinking": false}, "x_vendor": 1}`)
	body := sentBody(t, nil, req)
	want := map[string]string{
		"options": `{"frequency_penalty":-0.5,"min_p":0.05,"mirostat":2,"num_ctx":4096,"num_predict":10,` +
			`"presence_penalty":0.5,"repeat_penalty":1.1,"temperature":0.2,"top_k":20,"typical_p":0.9}`,
		"keep_alive": `"10m"`, "think": `"high"`, "truncate": `false`, "shift": `true`,
		"model": `"m"`, "stream": `true`,
	}
	for k, v := range want {
		if body[k] != v {
			t.Errorf("%s = %s, want %s", k, body[k], v)
		}
	}
	for k := range body {
		if _, ok := want[k]; !ok && k != "messages" {
			t.Errorf("%s = %s sent; Ollama has no use for it", k, body[k])
		}
	}
}

// P2: of two names for one option, Ollama's wins; the provider's
// configured keep_alive wins over the request's; Think wins over Extra's
// think.
func TestExtraFieldPrecedence(t *testing.T) {
	req := userRun("m")
	think := false
	req.Options.Think = &think
	req.Options.Extra = json.RawMessage(`{"repetition_penalty": 1.5, "repeat_penalty": 1.2, "keep_alive": -1, "think": "high"}`)
	body := sentBody(t, map[string]any{"keep_alive": "5m"}, req)
	if body["options"] != `{"repeat_penalty":1.2}` || body["keep_alive"] != `"5m"` || body["think"] != `false` {
		t.Errorf("options %s keep_alive %s think %s", body["options"], body["keep_alive"], body["think"])
	}
}

// P2: a known option of the wrong type is refused before the call, naming
// it, as Ollama would refuse the request.
func TestMistypedOptionsAreRefusedBeforeTheCall(t *testing.T) {
	f := newFake(t, fakeollama.Model{Name: "m"})
	a := newAdapter(t, f.URL(), nil)
	for _, extra := range []string{
		`{"top_k": "20"}`, `{"min_p": true}`, `{"use_mmap": 1}`, `{"stop": [1]}`,
		`{"options": {"num_ctx": "big"}}`, `{"options": [1]}`, `[1]`,
	} {
		req := userRun("m")
		req.Options.Extra = json.RawMessage(extra)
		_, err := a.Execute(ctxTimeout(t, time.Second), req, &sink{})
		if !errors.Is(err, sdk.ErrInvalidRequest) {
			t.Errorf("%s: err %v, want invalid_request", extra, err)
		}
	}
	if n := len(f.Requests()); n != 0 {
		t.Errorf("Ollama received %d requests", n)
	}
}

// P2: tool_choice none withholds the tools; auto sends them; required and
// a named function fail unsupported before the call (Ollama cannot force
// a tool call), which the Edge answers with 400.
func TestToolChoiceOnOllama(t *testing.T) {
	tools := []sdk.Tool{{Name: "get_weather", Parameters: json.RawMessage(`{"type":"object"}`)}}
	for _, tt := range []struct {
		choice    sdk.ToolChoice
		sendTools bool
	}{{"", true}, {sdk.ToolChoiceAuto, true}, {sdk.ToolChoiceNone, false}} {
		req := userRun("m")
		req.Tools, req.Options.ToolChoice = tools, tt.choice
		_, sent := sentBody(t, nil, req)["tools"]
		if sent != tt.sendTools {
			t.Errorf("tool_choice %q: tools sent %v, want %v", tt.choice, sent, tt.sendTools)
		}
	}

	f := newFake(t, fakeollama.Model{Name: "m"})
	a := newAdapter(t, f.URL(), nil)
	for _, tt := range []struct {
		choice sdk.ToolChoice
		kind   sdk.Kind
	}{
		{sdk.ToolChoiceRequired, sdk.KindUnsupported},
		{sdk.ToolChoiceFunction("get_weather"), sdk.KindUnsupported},
		{sdk.ToolChoiceFunction("send_mail"), sdk.KindInvalidRequest},
		{"any", sdk.KindInvalidRequest},
	} {
		req := userRun("m")
		req.Tools, req.Options.ToolChoice = tools, tt.choice
		_, err := a.Execute(ctxTimeout(t, time.Second), req, &sink{})
		if sdk.KindOf(err) != tt.kind {
			t.Errorf("tool_choice %q: err %v, want %s", tt.choice, err, tt.kind)
		}
		if tt.kind == sdk.KindUnsupported && !strings.Contains(err.Error(), "cannot force a tool call") {
			t.Errorf("tool_choice %q: %v does not say why", tt.choice, err)
		}
	}
	if n := len(f.Requests()); n != 0 {
		t.Errorf("Ollama received %d requests", n)
	}
}

// optionKinds is Ollama's own list of options with their types: an option
// Ollama adds, renames or retypes fails this test at the next upgrade of
// github.com/ollama/ollama.
func TestOptionKindsAreOllamas(t *testing.T) {
	theirs := map[string]optionKind{}
	for _, f := range reflect.VisibleFields(reflect.TypeFor[api.Options]()) {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "" || f.Anonymous {
			continue
		}
		switch f.Type.Kind() {
		case reflect.Int:
			theirs[name] = kindInt
		case reflect.Float32, reflect.Float64:
			theirs[name] = kindFloat
		case reflect.Bool, reflect.Pointer: // *bool
			theirs[name] = kindBool
		case reflect.Slice:
			theirs[name] = kindStrings
		default:
			t.Errorf("option %s has a type the adapter does not check: %v", name, f.Type)
		}
	}
	if !reflect.DeepEqual(theirs, optionKinds) {
		t.Errorf("Ollama's options %v\nthe adapter's %v", theirs, optionKinds)
	}
}
