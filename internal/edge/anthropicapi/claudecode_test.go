package anthropicapi

import (
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/iop-dev/iop/internal/edge/edgeconfig"
	"github.com/iop-dev/iop/internal/edge/frontend"
	ft "github.com/iop-dev/iop/internal/edge/frontend/frontendtest"
)

// claudeCodeHeaders are the headers Claude Code 2.1 sends besides the
// key and the version.
func claudeCodeHeaders() http.Header {
	return http.Header{
		"Anthropic-Beta": {"claude-code-20250219,interleaved-thinking-2025-05-14,context-management-2025-06-27,fine-grained-tool-streaming-2025-05-14"},
		"Anthropic-Dangerous-Direct-Browser-Access": {"true"},
		SessionHeader: {"0b6e2c1a-7d3f-4e8a-9c51-2f4d6a8b0c13"},
		"X-App":       {"cli"},
		"User-Agent":  {"claude-cli/2.1.0 (external, sdk-cli)"},
	}
}

// Issue 21: the first request of a Claude Code session (the shape of
// testdata/claude_code_messages.json: written for this test after what
// Claude Code 2.1 sends, not a capture) is answered, not refused: its
// system turn stands where it was sent, thinking and effort are the run's,
// the server tool is dropped and named, the session reaches the plan.
func TestClaudeCodeRequestIsServed(t *testing.T) {
	body, err := os.ReadFile("testdata/claude_code_messages.json")
	if err != nil {
		t.Fatal(err)
	}
	rec := &sessionRecorder{Dispatcher: &ft.Dispatcher{Events: []ft.Step{ft.Text("Fixed."), ft.Usage(900, 3), ft.Completed("stop")}}}
	e := newEnvOver(t, rec, rec.Dispatcher)
	w := e.postTo("/v1/messages?beta=true", string(body), claudeCodeHeaders())
	if w.Code != http.StatusOK {
		t.Fatalf("status %d: %s", w.Code, w.Body)
	}
	if got := names(events(t, w.Body.String())); got != "message_start content_block_start content_block_delta content_block_stop message_delta message_stop" {
		t.Errorf("events %s", got)
	}
	if got := w.Header().Get(frontend.DroppedToolsHeader); got != "web_search_20250305" {
		t.Errorf("%s = %q, want the server tool", frontend.DroppedToolsHeader, got)
	}
	if got := rec.sessions(); !slices.Equal(got, []string{"0b6e2c1a-7d3f-4e8a-9c51-2f4d6a8b0c13"}) {
		t.Errorf("sessions %q", got)
	}

	run := e.runner.RunRequest(t)
	var roles []string
	for _, m := range run.GetMessages() {
		roles = append(roles, m.GetRole())
	}
	if want := []string{"system", "user", "system", "assistant", "tool", "assistant", "tool", "tool", "user"}; !slices.Equal(roles, want) {
		t.Errorf("roles %v, want %v", roles, want)
	}
	if m := run.GetMessages()[2]; !strings.HasPrefix(m.GetContent(), "<env>") {
		t.Errorf("the system turn: %q", m.GetContent())
	}
	if m := run.GetMessages()[7]; m.GetToolCallId() != "toolu_01C" || m.GetName() != "Bash" || m.GetContent() != "Error: exit status 1" {
		t.Errorf("the failed tool's result: %v", m)
	}
	var tools []string
	for _, tl := range run.GetTools() {
		tools = append(tools, tl.GetName())
	}
	if want := []string{"Bash", "Read", "Edit", "TodoWrite", "mcp__docs__search", "WebFetch"}; !slices.Equal(tools, want) {
		t.Errorf("tools %v, want %v", tools, want)
	}
	o := run.GetOptions()
	if !o.GetThink() || o.GetReasoningEffort() != effortHigh || o.GetMaxTokens() != 32000 || o.GetToolChoice() != "auto" {
		t.Errorf("options %v", o)
	}

	// The same request where the route refuses hosted tools: 400 naming
	// the field and the tool, before any run.
	refuse := &ft.Dispatcher{Profile: &edgeconfig.Profile{Name: "strict", HostedTools: edgeconfig.HostedToolsRefuse}}
	w = newEnv(t, refuse).postTo("/v1/messages?beta=true", string(body), claudeCodeHeaders())
	if b := errorBodyOf(t, w.Body.String()); w.Code != http.StatusBadRequest || b.Error.Type != typeInvalidRequest {
		t.Errorf("refused: %d %s", w.Code, w.Body)
	} else if msg := b.Error.Message; !containsAll(msg, "tools", "web_search_20250305") {
		t.Errorf("refusal %q does not name the field and the tool", msg)
	}
	if len(refuse.RunRequests()) != 0 {
		t.Error("a refused request ran")
	}
}

func containsAll(s string, parts ...string) bool {
	for _, p := range parts {
		if !strings.Contains(s, p) {
			return false
		}
	}
	return true
}
