package anthropicapi

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	ft "github.com/iop-dev/iop/internal/edge/frontend/frontendtest"
)

// messageID reads the message id of message_start, checking its form.
func messageID(t *testing.T, start sse) string {
	t.Helper()
	var m struct{ Message struct{ ID string } }
	if err := json.Unmarshal([]byte(start.data), &m); err != nil || !strings.HasPrefix(m.Message.ID, "msg_") {
		t.Fatalf("message_start without a msg_ id: %s", start.data)
	}
	return m.Message.ID
}

// P2: a run's events become Anthropic's stream, event by event: the
// message, then each block in order (thinking, text, tool_use), the stop
// reason with the usage, and message_stop.
func TestStreamIsAnthropicsEventSequence(t *testing.T) {
	e := newEnv(t, &ft.Dispatcher{Events: []ft.Step{
		ft.Reasoning("Hmm"), ft.Reasoning("."), ft.Text("Let me"), ft.Text(" check."),
		ft.ToolCall(0, "call_1", "get_weather", ""), ft.ToolCall(0, "", "", `{"city":`), ft.ToolCall(0, "", "", `"Seoul"}`),
		ft.ToolCall(1, "", "get_time", `{}`),
		ft.Usage(12, 7), ft.Completed("stop"),
	}})
	w := e.post(streamBody)
	if w.Code != http.StatusOK || w.Header().Get("Content-Type") != "text/event-stream" {
		t.Fatalf("status %d, content type %q: %s", w.Code, w.Header().Get("Content-Type"), w.Body)
	}
	evs := events(t, w.Body.String())
	id := messageID(t, evs[0])
	want := []string{
		`{"type":"message_start","message":{"id":"` + id + `","type":"message","role":"assistant","model":"m1","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":0,"output_tokens":0,"cache_creation_input_tokens":0,"cache_read_input_tokens":0}}}`,
		`{"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":"","signature":""}}`,
		`{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"Hmm"}}`,
		`{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"."}}`,
		`{"type":"content_block_stop","index":0}`,
		`{"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}`,
		`{"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"Let me"}}`,
		`{"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":" check."}}`,
		`{"type":"content_block_stop","index":1}`,
		`{"type":"content_block_start","index":2,"content_block":{"type":"tool_use","id":"call_1","name":"get_weather","input":{}}}`,
		`{"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"{\"city\":"}}`,
		`{"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"\"Seoul\"}"}}`,
		`{"type":"content_block_stop","index":2}`,
		`{"type":"content_block_start","index":3,"content_block":{"type":"tool_use","id":"toolu_` + strings.TrimPrefix(id, "msg_") + `_1","name":"get_time","input":{}}}`,
		`{"type":"content_block_delta","index":3,"delta":{"type":"input_json_delta","partial_json":"{}"}}`,
		`{"type":"content_block_stop","index":3}`,
		`{"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"input_tokens":12,"output_tokens":7}}`,
		`{"type":"message_stop"}`,
	}
	if len(evs) != len(want) {
		t.Fatalf("%d events, want %d: %s", len(evs), len(want), names(evs))
	}
	for i := range want {
		if evs[i].data != want[i] {
			t.Errorf("event %d\n got %s\nwant %s", i, evs[i].data, want[i])
		}
	}
	if e.requests(t, "ok") != 1 {
		t.Error("the request was not counted ok on the anthropic_messages route")
	}
}

// The stop reason: the Node's done reason in Anthropic's words, tool_use
// whenever a tool was called (Ollama says "stop" then).
func TestStopReasons(t *testing.T) {
	tests := []struct {
		done  string
		calls bool
		want  string
	}{
		{"stop", false, "end_turn"},
		{"", false, "end_turn"},
		{"length", false, "max_tokens"},
		{"length", true, "max_tokens"},
		{"tool_calls", true, "tool_use"},
		{"stop", true, "tool_use"},
		{"content_filter", false, "refusal"},
	}
	for _, tt := range tests {
		script := []ft.Step{ft.Text("a")}
		if tt.calls {
			script = append(script, ft.ToolCall(0, "c", "f", "{}"))
		}
		script = append(script, ft.Completed(tt.done))
		for _, body := range []string{plainBody, streamBody} {
			w := newEnv(t, &ft.Dispatcher{Events: script}).post(body)
			if !strings.Contains(w.Body.String(), `"stop_reason":"`+tt.want+`"`) {
				t.Errorf("done %q, calls %v, stream %v: %s; want stop_reason %s", tt.done, tt.calls, body == streamBody, w.Body, tt.want)
			}
		}
	}
}

// An answer that is not streamed is one message object with the same
// blocks, a tool call's fragments gathered into its input object.
func TestWholeAnswerIsOneMessageObject(t *testing.T) {
	e := newEnv(t, &ft.Dispatcher{Events: []ft.Step{
		ft.Reasoning("Hmm."), ft.Text("Let me"), ft.Text(" check."),
		ft.ToolCall(0, "call_1", "get_weather", `{"city":`), ft.ToolCall(0, "", "", `"Seoul"}`),
		ft.ToolCall(1, "call_2", "cut_off", `{"a":`),
		ft.Usage(12, 7), ft.Completed("length"),
	}})
	w := e.post(plainBody)
	if w.Code != http.StatusOK || w.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("status %d: %s", w.Code, w.Body)
	}
	var m struct{ ID string }
	_ = json.Unmarshal(w.Body.Bytes(), &m)
	want := `{"id":"` + m.ID + `","type":"message","role":"assistant","model":"m1","content":[` +
		`{"type":"thinking","thinking":"Hmm.","signature":""},` +
		`{"type":"text","text":"Let me check."},` +
		`{"type":"tool_use","id":"call_1","name":"get_weather","input":{"city":"Seoul"}},` +
		`{"type":"tool_use","id":"call_2","name":"cut_off","input":{}}],` +
		`"stop_reason":"max_tokens","stop_sequence":null,` +
		`"usage":{"input_tokens":12,"output_tokens":7,"cache_creation_input_tokens":0,"cache_read_input_tokens":0}}` + "\n"
	if !strings.HasPrefix(m.ID, "msg_") || w.Body.String() != want {
		t.Errorf("got  %s\nwant %s", w.Body, want)
	}
}

// Text after a tool call, and an empty answer: blocks follow the output,
// and a message may have none.
func TestBlocksFollowTheOutput(t *testing.T) {
	w := newEnv(t, &ft.Dispatcher{Events: []ft.Step{ft.Text("a"), ft.ToolCall(0, "c", "f", "{}"), ft.Text("b"), ft.Completed("stop")}}).post(streamBody)
	got := names(events(t, w.Body.String()))
	want := "message_start content_block_start content_block_delta content_block_stop " +
		"content_block_start content_block_delta content_block_stop " +
		"content_block_start content_block_delta content_block_stop message_delta message_stop"
	if got != want {
		t.Errorf("events\n got %s\nwant %s", got, want)
	}
	w = newEnv(t, &ft.Dispatcher{Events: []ft.Step{ft.Completed("stop")}}).post(streamBody)
	if got := names(events(t, w.Body.String())); got != "message_start message_delta message_stop" {
		t.Errorf("empty answer: %s", got)
	}
	w = newEnv(t, &ft.Dispatcher{Events: []ft.Step{ft.Completed("stop")}}).post(plainBody)
	if !strings.Contains(w.Body.String(), `"content":[]`) {
		t.Errorf("empty answer, whole: %s", w.Body)
	}
}

// A fragment of a tool call whose block has stopped (a provider that
// interleaves parallel calls) still reaches its block's index.
func TestALateToolFragmentGoesToItsBlock(t *testing.T) {
	w := newEnv(t, &ft.Dispatcher{Events: []ft.Step{
		ft.ToolCall(0, "a", "f", `{"x":`), ft.ToolCall(1, "b", "g", `{}`), ft.ToolCall(0, "", "", `1}`), ft.Completed("tool_calls"),
	}}).post(streamBody)
	evs := events(t, w.Body.String())
	late := `{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"1}"}}`
	if evs[len(evs)-4].data != late {
		t.Errorf("events: %v", evs)
	}
	w = newEnv(t, &ft.Dispatcher{Events: []ft.Step{
		ft.ToolCall(0, "a", "f", `{"x":`), ft.ToolCall(1, "b", "g", `{}`), ft.ToolCall(0, "", "", `1}`), ft.Completed("tool_calls"),
	}}).post(plainBody)
	if !strings.Contains(w.Body.String(), `"input":{"x":1}`) {
		t.Errorf("whole: %s", w.Body)
	}
}

// Reasoning events with no text are not blocks; usage that arrives early
// is in message_start.
func TestEmptyDeltasMakeNoBlocks(t *testing.T) {
	w := newEnv(t, &ft.Dispatcher{Events: []ft.Step{ft.Usage(5, 0), ft.Reasoning(""), ft.Text(""), ft.Text("x"), ft.Completed("stop")}}).post(streamBody)
	evs := events(t, w.Body.String())
	if got := names(evs); got != "message_start content_block_start content_block_delta content_block_stop message_delta message_stop" {
		t.Errorf("events %s", got)
	}
	if !strings.Contains(evs[0].data, `"input_tokens":5`) {
		t.Errorf("message_start %s", evs[0].data)
	}
}
