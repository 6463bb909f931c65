package anthropicapi

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/anthropics/anthropic-sdk-go/v2/shared"
	"google.golang.org/protobuf/proto"

	"github.com/iop-dev/iop/internal/edge/dispatch"
	"github.com/iop-dev/iop/internal/edge/edgeconfig"
	"github.com/iop-dev/iop/internal/edge/edgemetrics/metricstest"
	"github.com/iop-dev/iop/internal/edge/frontend"
	ft "github.com/iop-dev/iop/internal/edge/frontend/frontendtest"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// What coding agents send, through the official SDK unchanged (SPEC P2,
// issue 21).

var hi = anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))

// A system turn inside messages (the SDK's own SystemMessageParam, with
// cache_control on its blocks) is a system message where it stands.
func TestOfficialClientSendsASystemTurn(t *testing.T) {
	f := &ft.Dispatcher{Events: []ft.Step{ft.Text("ok"), ft.Completed("stop")}}
	c, _ := officialClient(t, f)
	cached := anthropic.NewCacheControlEphemeralParam()
	msg, err := c.Messages.New(t.Context(), anthropic.MessageNewParams{
		Model: "m1", MaxTokens: 16000,
		System: []anthropic.TextBlockParam{{Text: "You are an agent.", CacheControl: cached}},
		Messages: []anthropic.MessageParam{
			anthropic.NewUserMessage(anthropic.ContentBlockParamUnion{OfText: &anthropic.TextBlockParam{Text: "fix the build", CacheControl: cached}}),
			{OfSystem: &anthropic.SystemMessageParam{Content: []anthropic.TextBlockParam{{Text: "<env>cwd: /src</env>", CacheControl: cached}}}},
			anthropic.NewAssistantMessage(anthropic.NewTextBlock("On it.")),
			anthropic.NewUserMessage(anthropic.NewTextBlock("go")),
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if msg.Content[0].Text != "ok" {
		t.Errorf("answer %s", msg.RawJSON())
	}
	want := []*wirepb.ChatMessage{{Role: "system", Content: "You are an agent."}, {Role: "user", Content: "fix the build"},
		{Role: "system", Content: "<env>cwd: /src</env>"}, {Role: "assistant", Content: "On it."}, {Role: "user", Content: "go"}}
	got := f.RunRequest(t).GetMessages()
	if len(got) != len(want) {
		t.Fatalf("messages %v", got)
	}
	for i := range want {
		if !proto.Equal(got[i], want[i]) {
			t.Errorf("message %d = %v, want %v", i, got[i], want[i])
		}
	}
}

// Every form of thinking the SDK can send, and output_config.effort,
// reach the run as think and a reasoning effort level.
func TestOfficialClientThinkingForms(t *testing.T) {
	tests := []struct {
		name     string
		thinking anthropic.ThinkingConfigParamUnion
		effort   anthropic.OutputConfigEffort
		think    bool
		want     string
	}{
		{"enabled with a budget", anthropic.ThinkingConfigParamOfEnabled(10000), "", true, effortMedium},
		{"adaptive, omitted display, effort high (Claude Code)",
			anthropic.ThinkingConfigParamUnion{OfAdaptive: &anthropic.ThinkingConfigAdaptiveParam{Display: anthropic.ThinkingConfigAdaptiveDisplayOmitted}},
			anthropic.OutputConfigEffortHigh, true, effortHigh},
		{"adaptive alone", anthropic.ThinkingConfigParamUnion{OfAdaptive: &anthropic.ThinkingConfigAdaptiveParam{}}, "", true, ""},
		{"between tools, effort xhigh",
			anthropic.ThinkingConfigParamUnion{OfBetweenTools: &anthropic.ThinkingConfigBetweenToolsParam{}}, anthropic.OutputConfigEffortXhigh, true, effortMax},
		{"disabled", anthropic.ThinkingConfigParamUnion{OfDisabled: &anthropic.ThinkingConfigDisabledParam{}}, "", false, effortNone},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &ft.Dispatcher{Events: []ft.Step{ft.Reasoning("hmm"), ft.Text("ok"), ft.Completed("stop")}}
			c, _ := officialClient(t, f)
			_, err := c.Messages.New(t.Context(), anthropic.MessageNewParams{Model: "m1", MaxTokens: 16000,
				Thinking: tt.thinking, OutputConfig: anthropic.OutputConfigParam{Effort: tt.effort}, Messages: []anthropic.MessageParam{hi}})
			if err != nil {
				t.Fatal(err)
			}
			o := f.RunRequest(t).GetOptions()
			if show(o.Think) != show(&tt.think) || o.GetReasoningEffort() != tt.want {
				t.Errorf("think %s, effort %q; want %v, %q", show(o.Think), o.GetReasoningEffort(), tt.think, tt.want)
			}
		})
	}
}

// POST /v1/messages/count_tokens answers the SDK's CountTokens: exact
// where a candidate tokenizes (the run's prompt tokens), else the Edge's
// estimate; X-IOP-Token-Count says which.
func TestOfficialClientCountsTokens(t *testing.T) {
	params := anthropic.MessageCountTokensParams{
		Model:    "m1",
		System:   anthropic.MessageCountTokensParamsSystemUnion{OfTextBlockArray: []anthropic.TextBlockParam{{Text: "be brief"}}},
		Messages: []anthropic.MessageParam{hi},
		Tools:    []anthropic.MessageCountTokensToolUnionParam{{OfTool: weatherTool.OfTool}},
		Thinking: anthropic.ThinkingConfigParamUnion{OfAdaptive: &anthropic.ThinkingConfigAdaptiveParam{}},
	}
	f := &ft.Dispatcher{Events: []ft.Step{ft.Usage(42, 0), ft.Completed("stop")}}
	c, e := officialClient(t, f)
	var resp *http.Response
	n, err := c.Messages.CountTokens(t.Context(), params, option.WithResponseInto(&resp))
	if err != nil {
		t.Fatal(err)
	}
	if n.InputTokens != 42 || resp.Header.Get(frontend.TokenCountHeader) != "exact" {
		t.Errorf("count %d (%s), want 42 exact", n.InputTokens, resp.Header.Get(frontend.TokenCountHeader))
	}
	run := f.RunRequest(t)
	if !run.GetCountTokens() || len(run.GetMessages()) != 2 || len(run.GetTools()) != 1 || run.GetOptions().MaxTokens != nil {
		t.Errorf("the counted run %v", run)
	}
	if got := metricstest.Sum(t, e.metrics.Requests, "route", routeCount, "outcome", "ok"); got != 1 {
		t.Errorf("%s ok = %v, want 1", routeCount, got)
	}

	c, _ = officialClient(t, &ft.Dispatcher{StartErr: dispatch.ErrUnsupported})
	n, err = c.Messages.CountTokens(t.Context(), params, option.WithResponseInto(&resp))
	if err != nil {
		t.Fatal(err)
	}
	if n.InputTokens <= 0 || resp.Header.Get(frontend.TokenCountHeader) != "estimate" {
		t.Errorf("count %d (%s), want an estimate", n.InputTokens, resp.Header.Get(frontend.TokenCountHeader))
	}

	// A count is a Messages request without max_tokens: its errors are
	// the same.
	_, err = c.Messages.CountTokens(t.Context(), anthropic.MessageCountTokensParams{Model: "m1", Messages: []anthropic.MessageParam{hi},
		Thinking: anthropic.ThinkingConfigParamUnion{OfEnabled: &anthropic.ThinkingConfigEnabledParam{BudgetTokens: 2048}}},
		option.WithJSONSet("thinking.type", "deep"))
	var apiErr *anthropic.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || !strings.Contains(apiErr.Error(), "thinking.type") {
		t.Errorf("unknown thinking in a count: %v", err)
	}
}

// A server tool is dropped, and named in X-IOP-Dropped-Tools; a route
// whose profile refuses hosted tools answers 400 naming it.
func TestOfficialClientServerTools(t *testing.T) {
	params := anthropic.MessageNewParams{Model: "m1", MaxTokens: 64, Messages: []anthropic.MessageParam{hi},
		Tools: []anthropic.ToolUnionParam{weatherTool,
			{OfWebSearchTool20250305: &anthropic.WebSearchTool20250305Param{MaxUses: anthropic.Int(3)}},
			{OfWebFetchTool20250910: &anthropic.WebFetchTool20250910Param{}},
			{OfBashTool20250124: &anthropic.ToolBash20250124Param{}}}}
	f := &ft.Dispatcher{Events: []ft.Step{ft.ToolCall(0, "call_1", "bash", `{"command":"ls"}`), ft.Completed("tool_calls")}}
	c, _ := officialClient(t, f)
	var resp *http.Response
	msg, err := c.Messages.New(t.Context(), params, option.WithResponseInto(&resp))
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.Header.Get(frontend.DroppedToolsHeader); got != "web_search_20250305,web_fetch_20250910" {
		t.Errorf("%s = %q", frontend.DroppedToolsHeader, got)
	}
	if use := msg.Content[0].AsToolUse(); use.Name != "bash" || string(use.Input) != `{"command":"ls"}` {
		t.Errorf("the client tool's call: %s", msg.RawJSON())
	}
	tools := f.RunRequest(t).GetTools()
	if len(tools) != 2 || tools[0].GetName() != "get_weather" || tools[1].GetName() != "bash" || len(tools[1].GetParametersJson()) == 0 {
		t.Errorf("tools %v", tools)
	}

	refuse := &ft.Dispatcher{Profile: &edgeconfig.Profile{Name: "strict", HostedTools: edgeconfig.HostedToolsRefuse}}
	c, _ = officialClient(t, refuse)
	_, err = c.Messages.New(t.Context(), params)
	var apiErr *anthropic.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || apiErr.Type() != shared.ErrorTypeInvalidRequestError ||
		!strings.Contains(apiErr.Error(), "web_search_20250305") {
		t.Errorf("refused: %v", err)
	}
	if len(refuse.RunRequests()) != 0 {
		t.Error("a refused request ran")
	}
}

// The beta client, as Claude Code uses Anthropic's TypeScript one: POST
// /v1/messages?beta=true (the Go SDK leaves the query out; the TypeScript
// SDK, which Claude Code is built on, sends it: added here) with
// anthropic-beta, context_management, metadata naming the session, a
// system turn, adaptive thinking and effort, streamed; all accepted.
func TestOfficialBetaClientAsClaudeCode(t *testing.T) {
	rec := &sessionRecorder{Dispatcher: &ft.Dispatcher{Events: []ft.Step{ft.Reasoning("plan"), ft.Text("done"), ft.Usage(20, 2), ft.Completed("stop")}}}
	e := newEnvOver(t, rec, rec.Dispatcher)
	var paths []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		paths = append(paths, r.URL.RequestURI())
		e.handler.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	c := anthropic.NewClient(option.WithBaseURL(srv.URL), option.WithAPIKey(testKey), option.WithMaxRetries(0))

	stream := c.Beta.Messages.NewStreaming(t.Context(), anthropic.BetaMessageNewParams{
		Model: "m1", MaxTokens: 32000,
		Betas:  []anthropic.AnthropicBeta{"claude-code-20250219", anthropic.AnthropicBetaInterleavedThinking2025_05_14, "context-management-2025-06-27"},
		System: []anthropic.BetaTextBlockParam{{Text: "You are Claude Code.", CacheControl: anthropic.NewBetaCacheControlEphemeralParam()}},
		Messages: []anthropic.BetaMessageParam{
			anthropic.NewBetaUserMessage(anthropic.NewBetaTextBlock("hello")),
			{OfSystem: &anthropic.BetaSystemMessageParam{Content: []anthropic.BetaSystemMessageParamContentUnion{
				{OfText: &anthropic.BetaTextBlockParam{Text: "<env>linux</env>", CacheControl: anthropic.NewBetaCacheControlEphemeralParam()}}}}},
		},
		Thinking:     anthropic.BetaThinkingConfigParamUnion{OfAdaptive: &anthropic.BetaThinkingConfigAdaptiveParam{Display: "omitted"}},
		OutputConfig: anthropic.BetaOutputConfigParam{Effort: "high"},
		ContextManagement: anthropic.BetaContextManagementConfigParam{Edits: []anthropic.BetaContextManagementConfigEditUnionParam{
			{OfClearThinking20251015: &anthropic.BetaClearThinking20251015EditParam{}}}},
		Metadata: anthropic.BetaMetadataParam{UserID: anthropic.String(`{"device_id":"d1","session_id":"sess-7"}`)},
	}, option.WithQuery("beta", "true"))
	var msg anthropic.BetaMessage
	for stream.Next() {
		if err := msg.Accumulate(stream.Current()); err != nil {
			t.Fatal(err)
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if len(msg.Content) != 2 || msg.Content[1].Text != "done" {
		t.Errorf("answer %s", msg.RawJSON())
	}
	if len(paths) != 1 || paths[0] != "/v1/messages?beta=true" {
		t.Errorf("paths %v", paths)
	}
	if s := rec.sessions(); len(s) != 1 || s[0] != "sess-7" {
		t.Errorf("sessions %q", s)
	}
	run := e.runner.RunRequest(t)
	if ms := run.GetMessages(); len(ms) != 3 || ms[2].GetRole() != "system" || ms[2].GetContent() != "<env>linux</env>" {
		t.Errorf("messages %v", ms)
	}
	if o := run.GetOptions(); !o.GetThink() || o.GetReasoningEffort() != effortHigh {
		t.Errorf("options %v", o)
	}
}
