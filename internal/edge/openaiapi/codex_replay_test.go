package openaiapi

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/iop-dev/iop/internal/edge/frontend"
	ft "github.com/iop-dev/iop/internal/edge/frontend/frontendtest"
)

// testdata/codex_responses_request.json is a request shaped as Codex CLI
// 0.17x sends POST /v1/responses mid-session (modelled on observed
// traffic, not a capture): a developer message, items with ids, reasoning
// with encrypted_content, function calls (one of a namespace's function),
// a custom tool's call and output, function tools with strict false, the
// multi_agent_v1 namespace, apply_patch as a custom tool with a lark
// grammar, a hosted web_search, and the fields around them (include,
// prompt_cache_key, client_metadata, reasoning.summary, text.verbosity,
// store false, stream). It must translate without error, and the model's
// calls must reach Codex as the tools it declared.

// P2: the replayed request runs: its history and tools reach the model as
// chat messages and functions, its hosted tool is dropped and said so, its
// session is its prompt_cache_key; the model's calls come back as a
// namespace's function_call and a custom_tool_call.
func TestCodexRequestReplays(t *testing.T) {
	body, err := os.ReadFile("testdata/codex_responses_request.json")
	if err != nil {
		t.Fatal(err)
	}
	patch := "*** Begin Patch\n*** Update File: README.md\n@@\n-# project\n+# project\n+\n+Run `go test ./...`.\n*** End Patch\n"
	patchArgs, _ := json.Marshal(map[string]string{"input": patch})
	rec := &sessionRecorder{Dispatcher: &ft.Dispatcher{Events: []ft.Step{
		ft.Reasoning("Tests are running; wait, then document."), ft.Text("Waiting for the tests."),
		ft.ToolCall(0, "call_wait", "multi_agent_v1__wait", `{"ids":["agent-1"],`), ft.ToolCall(0, "", "", `"timeout_ms":30000}`),
		ft.ToolCall(1, "call_doc", "apply_patch", string(patchArgs)),
		ft.Usage(1200, 80), ft.Completed("tool_calls"),
	}}}
	h := Handler(frontend.New(rec, testAuth(t), frontend.Options{}))
	r := respReq(string(body))
	r.Header.Set("session-id", "0199f1a2-5c3e-7d10-9b8a-3f2e1d0c9b8a")
	r.Header.Set("originator", "codex_exec")
	r.Header.Set("accept-encoding", "zstd,gzip")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != http.StatusOK {
		t.Fatalf("status %d: %s", w.Code, w.Body)
	}
	if got := w.Header().Get(frontend.DroppedToolsHeader); got != "web_search" {
		t.Errorf("%s: %q", frontend.DroppedToolsHeader, got)
	}

	run := rec.RunRequest(t)
	var tools []string
	for _, tool := range run.GetTools() {
		tools = append(tools, tool.GetName())
	}
	wantTools := []string{"exec_command", "write_stdin", "update_plan", "multi_agent_v1__spawn_agent", "multi_agent_v1__send_input",
		"multi_agent_v1__wait", "multi_agent_v1__close_agent", "apply_patch"}
	if strings.Join(tools, " ") != strings.Join(wantTools, " ") {
		t.Errorf("the run's tools\n got %q\nwant %q", tools, wantTools)
	}
	want := []string{
		"system:You are Codex, a coding agent running in a terminal. Be concise and precise. Use the tools to inspect and edit the workspace.",
		"system:<permissions instructions>\nFilesystem sandboxing: workspace-write. Approvals: on-request.\n</permissions instructions>",
		"user:<environment_context>\n  <cwd>/home/dev/project</cwd>\n  <shell>bash</shell>\n</environment_context>",
		"user:Add a README and run the tests.",
		`assistant: reasoning=**Looking around**` + "\n\nI'll list the files first." +
			` call[0]=call_ls:exec_command:{"cmd":"ls","workdir":"/home/dev/project"}`,
		"tool:Chunk ID: 1\nProcess exited with code 0\nOutput:\ngo.mod\nmain.go\nmain_test.go\n answers=call_ls",
		`assistant: call[0]=call_spawn:multi_agent_v1__spawn_agent:{"message":"Run go test ./... and report failures."}`,
		`tool:{"agent_id":"agent-1"} answers=call_spawn`,
		`assistant: call[0]=call_patch:apply_patch:{"input":"*** Begin Patch\n*** Add File: README.md\n+# project\n*** End Patch\n"}`,
		`tool:{"output":"Success. Updated the following files:\nA README.md\n","metadata":{"exit_code":0,"duration_seconds":0.0}} answers=call_patch`,
		"assistant:Added README.md; a sub-agent is running the tests.",
		"user:Wait for the tests, then summarize.",
	}
	if got := msgLines(run); strings.Join(got, "\n---\n") != strings.Join(want, "\n---\n") {
		t.Errorf("the run's messages\n got %q\nwant %q", got, want)
	}
	o := run.GetOptions()
	if o.GetReasoningEffort() != "medium" || !o.GetThink() || o.GetToolChoice() != "auto" ||
		string(o.GetExtraJson()) != `{"prompt_cache_key":"0199f1a2-5c3e-7d10-9b8a-3f2e1d0c9b8a","verbosity":"medium"}` {
		t.Errorf("options %v", o)
	}
	if len(rec.sessions) != 1 || rec.sessions[0] != "0199f1a2-5c3e-7d10-9b8a-3f2e1d0c9b8a" {
		t.Errorf("sessions %q", rec.sessions)
	}

	// The answer, as Codex reads it: the output items of
	// response.output_item.done, and the completed response.
	var done []map[string]any
	var completed struct {
		Response struct {
			Status string           `json:"status"`
			Output []map[string]any `json:"output"`
			Store  bool             `json:"store"`
		} `json:"response"`
	}
	for _, ev := range respEvents(t, w.Body.String()) {
		switch ev.name {
		case "response.output_item.done":
			var e struct {
				Item map[string]any `json:"item"`
			}
			if err := json.Unmarshal([]byte(ev.data), &e); err != nil {
				t.Fatal(err)
			}
			done = append(done, e.Item)
		case "response.completed":
			if err := json.Unmarshal([]byte(ev.data), &completed); err != nil {
				t.Fatal(err)
			}
		}
	}
	if completed.Response.Status != "completed" || completed.Response.Store || len(completed.Response.Output) != 4 || len(done) != 4 {
		t.Fatalf("completed %+v, %d items done", completed.Response, len(done))
	}
	for i, item := range done {
		if item["id"] != completed.Response.Output[i]["id"] {
			t.Errorf("item %d: done %v, in the response %v", i, item["id"], completed.Response.Output[i]["id"])
		}
	}
	if done[0]["type"] != "reasoning" || done[1]["type"] != "message" {
		t.Errorf("items %v %v", done[0]["type"], done[1]["type"])
	}
	if c := done[2]; c["type"] != "function_call" || c["name"] != "wait" || c["namespace"] != "multi_agent_v1" ||
		c["call_id"] != "call_wait" || c["arguments"] != `{"ids":["agent-1"],"timeout_ms":30000}` {
		t.Errorf("the namespace's call %v", c)
	}
	if c := done[3]; c["type"] != "custom_tool_call" || c["name"] != "apply_patch" || c["call_id"] != "call_doc" || c["input"] != patch {
		t.Errorf("the custom tool's call %v", c)
	}
}
