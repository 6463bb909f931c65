package openaiapi

import (
	"testing"

	"google.golang.org/protobuf/proto"
)

// FuzzParseResponses feeds arbitrary bodies to the Responses request
// parser (P3), as FuzzParseChat does to chat's: it never panics, refuses
// with a 400 or 413 or returns a run that fits a stream frame, and never
// holds more messages than the input items allow.
func FuzzParseResponses(f *testing.F) {
	for _, seed := range []string{
		respPlainBody, respStreamBody,
		`{"model":"m","input":[{},{},{}]}`,
		`{"model":"m","input":null}`,
		`{"model":"m","input":{"role":"user"}}`,
		`{"model":"m","instructions":"s","input":[{"role":"user","content":[{"type":"input_text","text":"a"},{"type":"input_image","image_url":"data:image/png;base64,aGk="}]}]}`,
		`{"model":"m","input":[{"type":"reasoning","summary":[{"type":"summary_text","text":"r"}]},{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":"1"}],"tools":[{"type":"function","name":"f","parameters":{"type":"object"}}],"tool_choice":{"type":"function","name":"f"}}`,
		`{"model":"m","input":"x","text":{"format":{"type":"json_schema","schema":{}}},"reasoning":{"effort":"none"},"metadata":{"a":"b"}}`,
		`{"model":"m","input":[{"role":"user","content":7}]}`,
		`{"model":`, `[]`, `null`, ``,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, e := parseResponses(body)
		if e != nil {
			if e.Status != 400 && e.Status != 413 {
				t.Fatalf("parse: status %d: %s", e.Status, e.Message)
			}
			return
		}
		if len(req.run.GetMessages()) > MaxMessages+1 { // the input items, and instructions
			t.Fatalf("%d messages accepted", len(req.run.GetMessages()))
		}
		if _, err := proto.Marshal(req.run); err != nil {
			t.Fatalf("the run does not marshal: %v", err)
		}
	})
}
