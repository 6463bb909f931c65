package openaiapi

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/iop-dev/iop/internal/edge/frontend"
	ft "github.com/iop-dev/iop/internal/edge/frontend/frontendtest"

	"github.com/iop-dev/iop/quicwire/wirepb"
)

// createdOf reads the created timestamp of the first chunk, checking it is
// the request's arrival.
func createdOf(t *testing.T, data string) int64 {
	t.Helper()
	var c struct{ Created int64 }
	if err := json.Unmarshal([]byte(data), &c); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(time.Unix(c.Created, 0)); d < 0 || d > time.Minute {
		t.Fatalf("created = %d, not now", c.Created)
	}
	return c.Created
}

func TestStreamWireFormatIsOpenAIs(t *testing.T) {
	script := []ft.Step{ft.Reasoning("Think"), ft.Text("Hel"), ft.Text("lo"), ft.Usage(3, 2), ft.Completed("stop")}
	const head = `{"id":"chatcmpl-run-1","object":"chat.completion.chunk","created":%d,"model":"m1",`
	tests := []struct {
		name  string
		body  string
		usage string // what every chunk but the usage chunk ends with
		want  []string
	}{
		{"without usage", streamBody, "", []string{
			head + `"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]%s}`,
			head + `"choices":[{"index":0,"delta":{"reasoning_content":"Think"},"logprobs":null,"finish_reason":null}]%s}`,
			head + `"choices":[{"index":0,"delta":{"content":"Hel"},"logprobs":null,"finish_reason":null}]%s}`,
			head + `"choices":[{"index":0,"delta":{"content":"lo"},"logprobs":null,"finish_reason":null}]%s}`,
			head + `"choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}]%s}`,
			`[DONE]`,
		}},
		{"with include_usage", streamUsageBody, `,"usage":null`, []string{
			head + `"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]%s}`,
			head + `"choices":[{"index":0,"delta":{"reasoning_content":"Think"},"logprobs":null,"finish_reason":null}]%s}`,
			head + `"choices":[{"index":0,"delta":{"content":"Hel"},"logprobs":null,"finish_reason":null}]%s}`,
			head + `"choices":[{"index":0,"delta":{"content":"lo"},"logprobs":null,"finish_reason":null}]%s}`,
			head + `"choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}]%s}`,
			head + `"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}`,
			`[DONE]`,
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, &ft.Dispatcher{Events: script})
			w := e.do(chatReq(tt.body))
			if w.Code != http.StatusOK || w.Header().Get("Content-Type") != "text/event-stream" {
				t.Fatalf("status %d, content type %q: %s", w.Code, w.Header().Get("Content-Type"), w.Body)
			}
			got := events(t, w.Body.String())
			created := createdOf(t, got[0])
			if len(got) != len(tt.want) {
				t.Fatalf("%d events, want %d:\n%s", len(got), len(tt.want), strings.Join(got, "\n"))
			}
			for i, want := range tt.want {
				if strings.Contains(want, "%d") {
					if strings.Contains(want, "%s") {
						want = fmt.Sprintf(want, created, tt.usage)
					} else {
						want = fmt.Sprintf(want, created)
					}
				}
				if got[i] != want {
					t.Errorf("event %d\n got %s\nwant %s", i, got[i], want)
				}
			}
			if e.requests(t, "ok") != 1 || e.ttftCount(t) != 1 {
				t.Errorf("requests ok = %v, ttft observations = %v", e.requests(t, "ok"), e.ttftCount(t))
			}
			if v := e.activeRuns(t); v != 0 {
				t.Errorf("active runs after the request = %v", v)
			}
		})
	}
}

// toolDeltas returns the tool_calls of every chunk that has some, as JSON.
func toolDeltas(t *testing.T, evs []string) (deltas []string, finish string) {
	t.Helper()
	for _, data := range evs {
		if data == "[DONE]" {
			continue
		}
		var c struct {
			Choices []struct {
				Delta struct {
					ToolCalls json.RawMessage `json:"tool_calls"`
				} `json:"delta"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(data), &c); err != nil {
			t.Fatal(err)
		}
		for _, ch := range c.Choices {
			if ch.Delta.ToolCalls != nil {
				deltas = append(deltas, string(ch.Delta.ToolCalls))
			}
			if ch.FinishReason != nil {
				finish = *ch.FinishReason
			}
		}
	}
	return deltas, finish
}

func TestStreamPassesToolCallDeltasThrough(t *testing.T) {
	e := newEnv(t, &ft.Dispatcher{Events: []ft.Step{
		ft.ToolCall(0, "call_a", "get_weather", ""),
		ft.ToolCall(0, "", "", `{"city":`),
		ft.ToolCall(0, "", "", `"Seoul"}`),
		ft.ToolCall(1, "call_b", "get_time", `{"tz":"KST"}`), // a complete call in one event
		ft.ToolCall(2, "", "noid", `{}`),                     // a call without an id gets one
		ft.Completed("stop"),                                 // Ollama says stop after tool calls
	}})
	w := e.do(chatReq(streamBody))
	deltas, finish := toolDeltas(t, events(t, w.Body.String()))
	want := []string{
		`[{"index":0,"id":"call_a","type":"function","function":{"name":"get_weather","arguments":""}}]`,
		`[{"index":0,"function":{"arguments":"{\"city\":"}}]`,
		`[{"index":0,"function":{"arguments":"\"Seoul\"}"}}]`,
		`[{"index":1,"id":"call_b","type":"function","function":{"name":"get_time","arguments":"{\"tz\":\"KST\"}"}}]`,
		`[{"index":2,"id":"call_run-1_2","type":"function","function":{"name":"noid","arguments":"{}"}}]`,
	}
	if strings.Join(deltas, "\n") != strings.Join(want, "\n") {
		t.Errorf("tool call deltas\n got %s\nwant %s", strings.Join(deltas, "\n"), strings.Join(want, "\n"))
	}
	if finish != "tool_calls" {
		t.Errorf("finish_reason = %q, want tool_calls", finish)
	}
}

func TestFinishReasonMapsDoneReason(t *testing.T) {
	tests := []struct {
		done  string
		tools bool
		want  string
	}{
		{"stop", false, "stop"},
		{"", false, "stop"},
		{"length", false, "length"},
		{"tool_calls", true, "tool_calls"},
		{"stop", true, "tool_calls"},
		{"length", true, "length"},
		{"unload", false, "stop"}, // unknown reasons are stop
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s tools=%v", tt.done, tt.tools), func(t *testing.T) {
			script := []ft.Step{ft.Text("x")}
			if tt.tools {
				script = append(script, ft.ToolCall(0, "c", "f", "{}"))
			}
			script = append(script, ft.Completed(tt.done))
			for _, body := range []string{streamBody, plainBody} {
				w := newEnv(t, &ft.Dispatcher{Events: script}).do(chatReq(body))
				var got string
				if strings.Contains(body, `"stream":true`) {
					_, got = toolDeltas(t, events(t, w.Body.String()))
				} else {
					var c completion
					if err := json.Unmarshal(w.Body.Bytes(), &c); err != nil {
						t.Fatal(err)
					}
					got = c.Choices[0].FinishReason
				}
				if got != tt.want {
					t.Errorf("finish_reason = %q, want %q (%s)", got, tt.want, body)
				}
			}
		})
	}
}

func TestNonStreamingAggregatesIntoOneCompletion(t *testing.T) {
	tests := []struct {
		name   string
		script []ft.Step
		want   string
	}{
		{"content reasoning and usage", []ft.Step{ft.Reasoning("Hm"), ft.Reasoning("m."), ft.Text("Hel"), ft.Text("lo"), ft.Usage(4, 2), ft.Completed("stop")},
			`{"id":"chatcmpl-run-1","object":"chat.completion","created":%d,"model":"m1","choices":[{"index":0,"message":` +
				`{"role":"assistant","content":"Hello","refusal":null,"reasoning_content":"Hmm."},"logprobs":null,"finish_reason":"stop"}],` +
				`"usage":{"prompt_tokens":4,"completion_tokens":2,"total_tokens":6}}`},
		{"fragmented tool calls assembled by index", []ft.Step{
			ft.ToolCall(1, "call_b", "second", `{"n":`),
			ft.ToolCall(0, "call_a", "first", ""),
			ft.ToolCall(0, "", "", `{"city":`),
			ft.ToolCall(1, "", "", `2}`),
			ft.ToolCall(0, "", "", `"Seoul"}`),
			ft.Completed("tool_calls"),
		}, `{"id":"chatcmpl-run-1","object":"chat.completion","created":%d,"model":"m1","choices":[{"index":0,"message":` +
			`{"role":"assistant","content":null,"refusal":null,"tool_calls":[` +
			`{"id":"call_a","type":"function","function":{"name":"first","arguments":"{\"city\":\"Seoul\"}"}},` +
			`{"id":"call_b","type":"function","function":{"name":"second","arguments":"{\"n\":2}"}}]},` +
			`"logprobs":null,"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":0,"completion_tokens":0,"total_tokens":0}}`},
		{"nothing but the terminal", []ft.Step{ft.Completed("stop")},
			`{"id":"chatcmpl-run-1","object":"chat.completion","created":%d,"model":"m1","choices":[{"index":0,"message":` +
				`{"role":"assistant","content":"","refusal":null},"logprobs":null,"finish_reason":"stop"}],` +
				`"usage":{"prompt_tokens":0,"completion_tokens":0,"total_tokens":0}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := newEnv(t, &ft.Dispatcher{Events: tt.script}).do(chatReq(plainBody))
			if w.Code != http.StatusOK || w.Header().Get("Content-Type") != "application/json" {
				t.Fatalf("status %d %q: %s", w.Code, w.Header().Get("Content-Type"), w.Body)
			}
			got := strings.TrimSpace(w.Body.String())
			if want := fmt.Sprintf(tt.want, createdOf(t, got)); got != want {
				t.Errorf("\n got %s\nwant %s", got, want)
			}
		})
	}
}

// TestErrorEventAfterOutputStarted: once a byte of the answer is out, a
// terminal other than completed becomes an error event and [DONE], never a
// silent end (issue 4).
func TestErrorEventAfterOutputStarted(t *testing.T) {
	tests := []struct {
		name     string
		terminal ft.Step
		code     string
	}{
		{"failed", ft.Ended(wirepb.RunEventType_RUN_EVENT_TYPE_FAILED, wirepb.FailureKind_FAILURE_KIND_UPSTREAM, "boom"), "upstream"},
		{"failed rate limited", ft.Ended(wirepb.RunEventType_RUN_EVENT_TYPE_FAILED, wirepb.FailureKind_FAILURE_KIND_RATE_LIMITED, ""), "rate_limited"},
		{"cancelled", ft.Ended(wirepb.RunEventType_RUN_EVENT_TYPE_CANCELLED, 0, ""), "cancelled"},
		{"deadline exceeded", ft.Ended(wirepb.RunEventType_RUN_EVENT_TYPE_DEADLINE_EXCEEDED, 0, ""), "deadline_exceeded"},
		{"disconnected", ft.Ended(wirepb.RunEventType_RUN_EVENT_TYPE_DISCONNECTED, wirepb.FailureKind_FAILURE_KIND_PROVIDER_UNAVAILABLE, "lost"), "node_disconnected"},
		{"response stalled", ft.Ended(wirepb.RunEventType_RUN_EVENT_TYPE_RESPONSE_STALLED, 0, ""), "response_stalled"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, &ft.Dispatcher{Events: []ft.Step{ft.Text("partial"), tt.terminal}})
			w := e.do(chatReq(streamUsageBody))
			if w.Code != http.StatusOK {
				t.Fatalf("status %d", w.Code)
			}
			evs := events(t, w.Body.String())
			if len(evs) != 4 || evs[3] != "[DONE]" {
				t.Fatalf("events: %s", strings.Join(evs, "\n"))
			}
			if b := apiErrorOf(t, evs[2]); codeOf(b) != tt.code || b.Error.Type == "" {
				t.Errorf("error event %s, want code %s", evs[2], tt.code)
			}
			if strings.Contains(evs[2], `"choices"`) || strings.Contains(w.Body.String(), `"finish_reason":"`) {
				t.Errorf("an ended run must not look finished: %s", w.Body)
			}
			if e.requests(t, tt.code) != 1 {
				t.Errorf("requests{outcome=%s} = %v", tt.code, e.requests(t, tt.code))
			}
		})
	}
}

// TestTerminalBeforeOutputIsHTTPError: before any byte, a terminal is an
// HTTP status with an OpenAI error body, streaming or not.
func TestTerminalBeforeOutputIsHTTPError(t *testing.T) {
	failed := func(k wirepb.FailureKind) ft.Step {
		return ft.Ended(wirepb.RunEventType_RUN_EVENT_TYPE_FAILED, k, "provider says no")
	}
	tests := []struct {
		name     string
		terminal ft.Step
		status   int
		code     string
	}{
		{"deadline exceeded", ft.Ended(wirepb.RunEventType_RUN_EVENT_TYPE_DEADLINE_EXCEEDED, 0, ""), 504, "deadline_exceeded"},
		{"response stalled", ft.Ended(wirepb.RunEventType_RUN_EVENT_TYPE_RESPONSE_STALLED, 0, ""), 504, "response_stalled"},
		{"rate limited", failed(wirepb.FailureKind_FAILURE_KIND_RATE_LIMITED), 429, "rate_limited"},
		{"model not found", failed(wirepb.FailureKind_FAILURE_KIND_MODEL_NOT_FOUND), 404, "model_not_found"},
		{"invalid request", failed(wirepb.FailureKind_FAILURE_KIND_INVALID_REQUEST), 400, "invalid_request"},
		{"unsupported", failed(wirepb.FailureKind_FAILURE_KIND_UNSUPPORTED), 400, "unsupported"},
		{"upstream unauthenticated", failed(wirepb.FailureKind_FAILURE_KIND_UNAUTHENTICATED), 502, "upstream_unauthenticated"},
		{"upstream", failed(wirepb.FailureKind_FAILURE_KIND_UPSTREAM), 502, "upstream"},
		{"internal", failed(wirepb.FailureKind_FAILURE_KIND_INTERNAL), 502, "internal"},
		{"disconnected", ft.Ended(wirepb.RunEventType_RUN_EVENT_TYPE_DISCONNECTED, 0, ""), 502, "node_disconnected"},
	}
	for _, tt := range tests {
		for _, body := range []string{streamBody, plainBody} {
			t.Run(fmt.Sprintf("%s stream=%v", tt.name, body == streamBody), func(t *testing.T) {
				// A usage event produces no byte: output has not started.
				e := newEnv(t, &ft.Dispatcher{Events: []ft.Step{ft.Usage(1, 0), tt.terminal}})
				w := e.do(chatReq(body))
				if w.Code != tt.status || w.Header().Get("Content-Type") != "application/json" {
					t.Fatalf("status %d %q, want %d: %s", w.Code, w.Header().Get("Content-Type"), tt.status, w.Body)
				}
				b := apiErrorOf(t, w.Body.String())
				if codeOf(b) != tt.code {
					t.Errorf("code %q, want %q", codeOf(b), tt.code)
				}
				if tt.status == 429 && w.Header().Get("Retry-After") == "" {
					t.Error("429 without Retry-After")
				}
				if w.Header().Get(frontend.RefusalHeader) != "" {
					t.Error("a provider's failure is not a refusal of the Edge")
				}
			})
		}
	}
}
