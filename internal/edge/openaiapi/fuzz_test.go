package openaiapi

import (
	"testing"

	"google.golang.org/protobuf/proto"
)

// FuzzParseChat feeds arbitrary bodies to the chat request parser (P3): it
// never panics, refuses with a 400 or 413 or returns a run that fits a
// stream frame, and never holds more messages than MaxMessages.
func FuzzParseChat(f *testing.F) {
	for _, seed := range []string{
		plainBody, streamBody, streamUsageBody,
		`{"model":"m","messages":[{},{},{}]}`,
		`{"model":"m","messages":null}`,
		`{"model":"m","messages":{"role":"user"}}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"data:image/png;base64,aGk="}}]}]}`,
		`{"model":"m","messages":[{"role":"assistant","tool_calls":[{"id":"c","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c","content":"1"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}]}`,
		`{"model":"m","messages":[{"role":"user","content":7}]}`,
		`{"model":"m","messages":[{"role":"assistant","tool_calls":[{"id":"c","type":"custom","custom":{"name":"apply_patch","input":"x"}}]},{"role":"tool","tool_call_id":"c","content":"ok"}],"tools":[{"type":"custom","custom":{"name":"apply_patch","format":{"type":"grammar","grammar":{"syntax":"lark","definition":"start: /.+/"}}}},{"type":"function","function":{"name":"apply_patch"}}],"tool_choice":{"type":"custom","custom":{"name":"apply_patch"}}}`,
		`{"model":"m","messages":[{"role":"user","content":"x"}],"web_search_options":{},"reasoning_effort":"xhigh","max_completion_tokens":5,"prompt_cache_key":"k","safety_identifier":"s","verbosity":"low","response_format":{"type":"json_schema","json_schema":{"name":"n","strict":true,"schema":{}}}}`,
		`{"model":`, `[]`, `null`, ``,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		if _, e := peekChat(body); e != nil && e.Status != 400 {
			t.Fatalf("peek: status %d", e.Status)
		}
		req, e := parseChat(body)
		if e != nil {
			if e.Status != 400 && e.Status != 413 {
				t.Fatalf("parse: status %d: %s", e.Status, e.Message)
			}
			return
		}
		if len(req.run.GetMessages()) > MaxMessages {
			t.Fatalf("%d messages accepted", len(req.run.GetMessages()))
		}
		if _, err := proto.Marshal(req.run); err != nil {
			t.Fatalf("the run does not marshal: %v", err)
		}
	})
}
