package anthropicapi

import (
	"testing"

	"google.golang.org/protobuf/proto"
)

// FuzzParseMessages feeds arbitrary bodies to the Messages request parser
// (P3): it never panics, and either refuses with a 400 or 413 or returns a
// run that fits a stream frame.
func FuzzParseMessages(f *testing.F) {
	for _, seed := range []string{
		plainBody, streamBody,
		`{"model":"m","max_tokens":1,"messages":[{},null,{"role":"user","content":[null]}]}`,
		`{"model":"m","max_tokens":1,"system":[{"type":"text","text":"s"}],"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","data":"aGk="}}]}]}`,
		`{"model":"m","max_tokens":1,"tools":[{"name":"f","input_schema":{}}],"tool_choice":{"type":"tool","name":"f"},"messages":[` +
			`{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"f","input":{}}]},` +
			`{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","is_error":true,"content":[{"type":"text","text":"x"},{"type":"image","source":{"type":"url"}}]}]}]}`,
		`{"model":"m","max_tokens":1,"thinking":{"type":"enabled"},"top_k":3,"output_config":{"format":{"type":"json_schema","schema":{}}},"messages":[{"role":"user","content":"x"}]}`,
		`{"model":"m","max_tokens":1e40,"messages":[]}`,
		`{"model":`, `[]`, `null`, ``,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		if _, e := peekMessages(body); e != nil && e.Status != 400 {
			t.Fatalf("peek: status %d", e.Status)
		}
		req, e := parseMessages(body)
		if e != nil {
			if e.Status != 400 && e.Status != 413 {
				t.Fatalf("parse: status %d: %s", e.Status, e.Message)
			}
			return
		}
		if _, err := proto.Marshal(req.run); err != nil {
			t.Fatalf("the run does not marshal: %v", err)
		}
	})
}
