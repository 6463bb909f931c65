package openai_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// OpenAI-compatible servers differ in small ways; each must come out as
// the same normalized events.
func TestServerDialectsNormalize(t *testing.T) {
	const c = `data: {"choices":[{"index":0,"delta":%s,"finish_reason":%s}]}` + "\n\n"
	tests := []struct {
		name        string
		contentType string
		body        string
		want        string
		wantReason  string
	}{
		{"reasoning named reasoning (newer vLLM)", "text/event-stream",
			fmt.Sprintf(c, `{"reasoning":"hm"}`, "null") + fmt.Sprintf(c, `{"content":"ok"}`, `"stop"`) + "data: [DONE]\n\n",
			"r:hm t:ok", "stop"},
		{"both reasoning names in one delta count once", "text/event-stream",
			fmt.Sprintf(c, `{"reasoning_content":"hm","reasoning":"hm"}`, "null") + "data: [DONE]\n\n",
			"r:hm", "stop"},
		{"id and name repeated on every fragment", "text/event-stream",
			fmt.Sprintf(c, `{"tool_calls":[{"index":0,"id":"c1","type":"function","function":{"name":"f","arguments":"{\"a\""}}]}`, "null") +
				fmt.Sprintf(c, `{"tool_calls":[{"index":0,"id":"c1","type":"function","function":{"name":"f","arguments":":1}"}}]}`, `"tool_calls"`) +
				"data: [DONE]\n\n",
			`c0:c1/f/{"a" c0://:1}`, "tool_calls"},
		{"tool calls without index", "text/event-stream",
			fmt.Sprintf(c, `{"tool_calls":[{"id":"x","function":{"name":"f","arguments":"{}"}},{"id":"y","function":{"name":"g","arguments":"{}"}}]}`, `"tool_calls"`) +
				"data: [DONE]\n\n",
			"c0:x/f/{} c1:y/g/{}", "tool_calls"},
		{"usage on the finishing chunk (llama.cpp)", "text/event-stream",
			`data: {"choices":[{"index":0,"delta":{},"finish_reason":"length"}],"usage":{"prompt_tokens":3,"completion_tokens":4}}` + "\n\ndata: [DONE]\n\n",
			"u:3/4", "length"},
		{"comments, CRLF and role-only chunks", "text/event-stream",
			": keep-alive\r\n\r\n" + strings.ReplaceAll(fmt.Sprintf(c, `{"role":"assistant","content":""}`, "null")+fmt.Sprintf(c, `{"content":"a"}`, "null")+
				fmt.Sprintf(c, `{}`, `"stop"`)+"data: [DONE]\n\n", "\n", "\r\n"),
			"t:a", "stop"},
		{"finish without [DONE]", "text/event-stream",
			fmt.Sprintf(c, `{"content":"a"}`, `"stop"`),
			"t:a", "stop"},
		{"refusal is text", "text/event-stream",
			fmt.Sprintf(c, `{"refusal":"I can't"}`, `"stop"`) + "data: [DONE]\n\n",
			"t:I can't", "stop"},
		{"extra choices are ignored", "text/event-stream",
			`data: {"choices":[{"index":1,"delta":{"content":"b"}},{"index":0,"delta":{"content":"a"}}]}` + "\n\ndata: [DONE]\n\n",
			"t:a", "stop"},
		{"a server that ignores stream answers whole", "application/json",
			`{"object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]},"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":1,"completion_tokens":2}}`,
			"t:hi c0:c/f/{} u:1/2", "tool_calls"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", tt.contentType)
				fmt.Fprint(w, tt.body)
			}))
			defer srv.Close()
			var out sink
			res, err := configured(t, srv.URL+"/v1").Execute(t.Context(), userRun("m", "hi"), &out)
			if err != nil {
				t.Fatal(err)
			}
			if got := summary(out.all()); got != tt.want {
				t.Errorf("events\n got %s\nwant %s", got, tt.want)
			}
			if res.DoneReason != tt.wantReason {
				t.Errorf("done reason %q, want %q", res.DoneReason, tt.wantReason)
			}
		})
	}
}
