package anthropicapi

import (
	"os"
	"testing"

	"github.com/iop-dev/iop/internal/edge/frontend"

	"google.golang.org/protobuf/proto"
)

// FuzzParseMessages feeds arbitrary bodies to the Messages and
// count_tokens request parsers (P3): they never panic, and either refuse
// with a 400 or 413 or return a run that marshals.
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
		// What coding agents send (issue 21).
		`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"x"},{"role":"system","clear_at":"next_user_message","content":[{"type":"text","text":"env","cache_control":{"type":"ephemeral"}}]},{"role":"system","content":""}]}`,
		`{"model":"m","max_tokens":1,"thinking":{"type":"adaptive","display":"omitted"},"output_config":{"effort":"xhigh"},"context_management":{"edits":[]},"metadata":{"user_id":"{"session_id":"s"}"},"messages":[{"role":"user","content":"x"}]}`,
		`{"model":"m","max_tokens":1,"thinking":{"type":"enabled","budget_tokens":31999},"messages":[{"role":"user","content":"x"}]}`,
		`{"model":"m","max_tokens":1,"thinking":{"type":"disabled"},"output_config":{"effort":"max"},"metadata":5,"messages":[{"role":"user","content":"x"}]}`,
		`{"model":"m","max_tokens":1,"mcp_servers":[{"type":"url"}],"tools":[{"type":"web_search_20250305","name":"web_search"},{"type":"bash_20250124","name":"bash"},` +
			`{"type":"text_editor_20241022"},{"type":"computer_20251124","display_width_px":1,"display_height_px":1},{"type":"memory_20250818"},` +
			`{"type":"mcp_toolset","mcp_server_name":"d"},{"name":"f","defer_loading":true,"input_schema":{}}],"tool_choice":{"type":"tool","name":"web_search"},"messages":[{"role":"user","content":"x"}]}`,
		`{"model":"m","messages":[{"role":"user","content":"count me"}],"tools":[{"type":"web_fetch_20250910","name":"web_fetch"}]}`,
		`{"model":`, `[]`, `null`, ``,
	} {
		f.Add([]byte(seed))
	}
	if claudeCode, err := os.ReadFile("testdata/claude_code_messages.json"); err == nil {
		f.Add(claudeCode)
	} else {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		if _, e := peekMessages(body); e != nil && e.Status != 400 {
			t.Fatalf("peek: status %d", e.Status)
		}
		for _, parse := range []func([]byte) (*parsedMessages, *frontend.Failure){parseMessages, parseCount} {
			req, e := parse(body)
			if e != nil {
				if e.Status != 400 && e.Status != 413 {
					t.Fatalf("parse: status %d: %s", e.Status, e.Message)
				}
				continue
			}
			if _, err := proto.Marshal(req.run); err != nil {
				t.Fatalf("the run does not marshal: %v", err)
			}
			if len(req.hosted) > 0 && req.hostedParam == "" {
				t.Fatalf("hosted tools %v declared in no field", req.hosted)
			}
		}
	})
}
