package openaiapi

import (
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/iop-dev/iop/quicwire"
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
			if e.status != 400 && e.status != 413 {
				t.Fatalf("parse: status %d: %s", e.status, e.message)
			}
			return
		}
		if len(req.run.GetMessages()) > MaxMessages+1 { // the input items, and instructions
			t.Fatalf("%d messages accepted", len(req.run.GetMessages()))
		}
		if n := proto.Size(req.run); n > quicwire.MaxStreamFrameSize {
			t.Fatalf("a run of %d bytes accepted", n)
		}
	})
}
