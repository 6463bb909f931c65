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
// top level, and every field that is not Ollama's at the top level as the
// client sent it (issue 21); Ollama's logprobs, which the adapter does not
// relay, are not asked for; a normalized option wins.
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
		"logit_bias": `{"50256":-100}`, "user": `"u-1"`, "parallel_tool_calls": `false`,
		"chat_template_kwargs": `{"enable_thinking":false}`, "x_vendor": `1`,
	}
	for k, v := range want {
		if body[k] != v {
			t.Errorf("%s = %s, want %s", k, body[k], v)
		}
	}
	for k := range body {
		if _, ok := want[k]; !ok && k != "messages" {
			t.Errorf("%s = %s sent; the adapter does not ask Ollama for it", k, body[k])
		}
	}
}

// P2, issue 21: Extra's fields reach /api/chat, /api/generate and
// /api/embed at the top level, after the adapter's own, in name order;
// a field named as one of Ollama's own (model, messages, stream, tools,
// format, images, template, system...) never replaces or joins the
// adapter's. The bodies are asserted byte for byte.
func TestExtraFieldsPassAtTheTopLevelWithoutReplacingTheAdapters(t *testing.T) {
	const extra = `{"user":"u-1","model":"other","messages":[],"stream":false,"tools":[{"type":"function"}],` +
		`"format":"json","images":["eA=="],"template":"{{.Prompt}}","system":"obey","context":[1],"prompt":"p",` +
		`"suffix":"s","input":["i"],"dimensions":2,"_debug_render_only":true,"logprobs":true,"top_logprobs":3,` +
		`"x_vendor":{"b":[1, 2],"a":null},"chat_template_kwargs":{"enable_thinking":false}}`
	const rest = `,"chat_template_kwargs":{"enable_thinking":false},"user":"u-1","x_vendor":{"b":[1,2],"a":null}}`
	srv := newScripted(t, func(_ int, body string) (int, string) {
		if strings.Contains(body, `"input"`) {
			return 200, `{"embeddings":[[1,0]]}`
		}
		return 200, answerLines("stop", "ok")
	})
	a := newAdapter(t, srv.URL, nil)
	ctx := ctxTimeout(t, 5*time.Second)

	chat := userRun("m")
	chat.Options.Extra = json.RawMessage(extra)
	if _, err := a.Execute(ctx, chat, &sink{}); err != nil {
		t.Fatal(err)
	}
	gen := &sdk.Request{Target: "m", Prompt: "def f():", Options: sdk.Options{Extra: json.RawMessage(extra)}}
	if _, err := a.Complete(ctx, gen, &sink{}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Embed(ctx, &sdk.EmbedRequest{Target: "m", Inputs: []string{"x"}, Extra: json.RawMessage(extra)}); err != nil {
		t.Fatal(err)
	}
	want := []string{
		`{"model":"m","messages":[{"role":"user","content":"hello"}],"stream":true` + rest,
		`{"model":"m","prompt":"def f():","stream":true` + rest,
		`{"model":"m","input":["x"]` + rest,
	}
	got := srv.sent()
	for i := range want {
		if i >= len(got) || got[i] != want[i] {
			t.Errorf("body %d\n got %s\nwant %s", i, got[min(i, len(got)-1)], want[i])
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

// P2: tool_choice none withholds the tools; auto sends them; a choice
// that is not one, or names a tool the run lacks, is refused before the
// call. (Forced calls: forced_test.go.)
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
	for _, choice := range []sdk.ToolChoice{sdk.ToolChoiceFunction("send_mail"), "any"} {
		req := userRun("m")
		req.Tools, req.Options.ToolChoice = tools, choice
		if _, err := a.Execute(ctxTimeout(t, time.Second), req, &sink{}); !errors.Is(err, sdk.ErrInvalidRequest) {
			t.Errorf("tool_choice %q: err %v, want invalid_request", choice, err)
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

// ollamaFields holds every top-level field of Ollama's chat, generate and
// embed requests: a field Ollama adds fails this test at the next upgrade
// of github.com/ollama/ollama, before Extra could set it unchecked.
func TestOllamaFieldsAreReserved(t *testing.T) {
	for _, typ := range []reflect.Type{reflect.TypeFor[api.ChatRequest](), reflect.TypeFor[api.GenerateRequest](), reflect.TypeFor[api.EmbedRequest]()} {
		for _, f := range reflect.VisibleFields(typ) {
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name != "" && name != "-" && !ollamaFields[name] {
				t.Errorf("%s.%s (%q) is not in ollamaFields", typ.Name(), f.Name, name)
			}
		}
	}
}
