package openaiapi

import (
	"os"
	"testing"

	"google.golang.org/protobuf/proto"
)

// FuzzParseResponses feeds arbitrary bodies to the Responses request
// parser (P3), as FuzzParseChat does to chat's: it never panics, refuses
// with a 400 or 413 or returns a run that fits a stream frame, and never
// holds more messages than the input items allow, nor more tools than
// MaxTools (a namespace's included), and every tool the model is offered
// maps back to one the client declared.
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
		// What coding agents declare: namespaces, custom tools, client-run
		// built-ins, hosted tools, and their calls in input.
		`{"model":"m","input":"x","tools":[{"type":"namespace","name":"multi_agent_v1","description":"d","tools":[{"type":"function","name":"wait","parameters":{"type":"object"}},{"type":"custom","name":"note"}]},{"type":"function","name":"multi_agent_v1__wait"}],"tool_choice":{"type":"function","name":"wait"}}`,
		`{"model":"m","input":[{"type":"function_call","call_id":"c","namespace":"ns","name":"f","arguments":"{}"},{"type":"custom_tool_call","call_id":"d","name":"apply_patch","input":"*** Begin Patch"},{"type":"custom_tool_call_output","call_id":"d","output":"ok"}],"tools":[{"type":"custom","name":"apply_patch","format":{"type":"grammar","syntax":"lark","definition":"start: /.+/"}}]}`,
		`{"model":"m","input":[{"type":"local_shell_call","id":"l","call_id":"c","action":{"type":"exec","command":["ls"],"env":{}}},{"type":"local_shell_call_output","id":"c","output":"a"},{"type":"shell_call","call_id":"s","action":{"commands":["ls"]}},{"type":"shell_call_output","call_id":"s","output":[{"stdout":"a","stderr":"","outcome":{"type":"exit","exit_code":0}}]},{"type":"apply_patch_call","call_id":"p","operation":{"type":"delete_file","path":"a"}},{"type":"apply_patch_call_output","call_id":"p","status":"failed"}],"tools":[{"type":"local_shell"},{"type":"shell"},{"type":"apply_patch"}],"tool_choice":{"type":"shell"}}`,
		`{"model":"m","input":"x","tools":[{"type":"web_search","external_web_access":false},{"type":"shell","environment":{"type":"container_auto"}},{"type":"mcp","server_label":"s"}],"store":true,"include":["reasoning.encrypted_content"],"prompt_cache_key":"k","client_metadata":{"a":"b"},"reasoning":{"effort":"xhigh","summary":"auto"},"text":{"verbosity":"low"}}`,
		`{"model":"m","input":[{"type":"reasoning","summary":[],"encrypted_content":"gAAAA"}],"tools":[{"type":"namespace","name":"n","tools":null},{"type":"namespace","name":"n","tools":[{"type":"namespace"}]}]}`,
		`{"model":`, `[]`, `null`, ``,
	} {
		f.Add([]byte(seed))
	}
	if codex, err := os.ReadFile("testdata/codex_responses_request.json"); err == nil {
		f.Add(codex)
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
		if len(req.run.GetTools()) > MaxTools {
			t.Fatalf("%d tools accepted", len(req.run.GetTools()))
		}
		for _, tool := range req.run.GetTools() {
			if req.tools.declared(tool.GetName()) == nil {
				t.Fatalf("the run's tool %q maps back to nothing", tool.GetName())
			}
		}
	})
}
