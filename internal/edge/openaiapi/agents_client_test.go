package openaiapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
	"github.com/openai/openai-go/v3/shared"

	"github.com/iop-dev/iop/internal/edge/dispatch"
	"github.com/iop-dev/iop/internal/edge/edgeconfig"
	"github.com/iop-dev/iop/internal/edge/frontend"
	ft "github.com/iop-dev/iop/internal/edge/frontend/frontendtest"
	"github.com/iop-dev/iop/internal/yamlconf"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// These tests put the official OpenAI Go client in front of the handler
// with what coding agents declare: namespaces, custom tools, hosted tools,
// reasoning effort levels, and the input token count (P2).

// multiAgent is Codex's namespace of sub-agent functions.
var multiAgent = responses.ToolUnionParam{OfNamespace: &responses.NamespaceToolParam{
	Name: "multi_agent_v1", Description: "Work with sub-agents.",
	Tools: []responses.NamespaceToolToolUnionParam{
		{OfFunction: &responses.NamespaceToolToolFunctionParam{Name: "spawn_agent", Description: openai.String("Start a sub-agent."),
			Parameters: map[string]any{"type": "object", "properties": map[string]any{"task": map[string]any{"type": "string"}}}}},
		{OfFunction: &responses.NamespaceToolToolFunctionParam{Name: "wait", Parameters: map[string]any{"type": "object"}}},
	},
}}

// patchTool is a custom tool with a grammar, as Codex declares apply_patch.
var patchTool = responses.ToolUnionParam{OfCustom: &responses.CustomToolParam{
	Name: "apply_patch", Description: openai.String("Edit files."),
	Format: shared.CustomToolInputFormatUnionParam{OfGrammar: &shared.CustomToolInputFormatGrammarParam{
		Syntax: "lark", Definition: `start: "*** Begin Patch" /(.|\n)*/ "*** End Patch"`}},
}}

// P2: a namespace's function, called by the model under its flat name,
// reaches the SDK as a function_call with its inner name and namespace,
// whole and streamed; sent back as input, it reaches the model under the
// flat name again.
func TestOfficialClientCallsANamespacesFunction(t *testing.T) {
	events := []ft.Step{ft.ToolCall(0, "call_1", "multi_agent_v1__spawn_agent", `{"task":`), ft.ToolCall(0, "", "", `"lint"}`),
		ft.Completed("tool_calls")}
	c, e := officialClient(t, &ft.Dispatcher{Events: events})
	params := responses.ResponseNewParams{Model: "m1", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("go")},
		Tools: []responses.ToolUnionParam{multiAgent}}
	resp, err := c.Responses.New(t.Context(), params)
	if err != nil {
		t.Fatal(err)
	}
	call := resp.Output[0].AsFunctionCall()
	if len(resp.Output) != 1 || call.Name != "spawn_agent" || call.Namespace != "multi_agent_v1" || call.CallID != "call_1" ||
		call.Arguments != `{"task":"lint"}` {
		t.Fatalf("output %s", resp.RawJSON())
	}
	run := e.runner.RunRequest(t)
	if got := []string{run.GetTools()[0].GetName(), run.GetTools()[1].GetName()}; got[0] != "multi_agent_v1__spawn_agent" || got[1] != "multi_agent_v1__wait" {
		t.Errorf("the run's tools %q", got)
	}
	if ns := resp.Tools[0].AsNamespace(); ns.Name != "multi_agent_v1" || len(ns.Tools) != 2 {
		t.Errorf("the echoed tools %s", resp.Tools[0].RawJSON())
	}

	// Streamed: the arguments' events and the item name it as the client does.
	c, _ = officialClient(t, &ft.Dispatcher{Events: events})
	stream := c.Responses.NewStreaming(t.Context(), params)
	var acc responses.ResponseAccumulator
	var done responses.ResponseFunctionCallArgumentsDoneEvent
	var item responses.ResponseFunctionToolCall
	for stream.Next() {
		addEvent(t, &acc, stream.Current().RawJSON())
		switch ev := stream.Current().AsAny().(type) {
		case responses.ResponseFunctionCallArgumentsDoneEvent:
			done = ev
		case responses.ResponseOutputItemDoneEvent:
			item = ev.Item.AsFunctionCall()
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	var doneName struct {
		Name string `json:"name"`
	}
	_ = json.Unmarshal([]byte(done.RawJSON()), &doneName) // OpenAI sends the name; the SDK's type has no field for it
	if doneName.Name != "spawn_agent" || done.Arguments != `{"task":"lint"}` || item.Name != "spawn_agent" || item.Namespace != "multi_agent_v1" {
		t.Errorf("done %s, item %s", done.RawJSON(), item.RawJSON())
	}
	if whole, err := acc.ReconstructedResponse(); err != nil || whole.Output[0].AsFunctionCall().Namespace != "multi_agent_v1" {
		t.Errorf("accumulated %v", err)
	}

	// The next turn: the call back, as the SDK makes it of the output.
	c, e = officialClient(t, &ft.Dispatcher{Events: []ft.Step{ft.Text("started"), ft.Completed("stop")}})
	back := call.ToParam()
	out := responses.ResponseInputItemParamOfFunctionCallOutput("agent 7")
	out.OfFunctionCallOutput.CallID = openai.String(call.CallID)
	params.Input = responses.ResponseNewParamsInputUnion{OfInputItemList: responses.ResponseInputParam{
		responses.ResponseInputItemParamOfMessage("go", responses.EasyInputMessageRoleUser),
		{OfFunctionCall: &back}, out}}
	if _, err := c.Responses.New(t.Context(), params); err != nil {
		t.Fatal(err)
	}
	want := []string{"user:go", `assistant: call[0]=call_1:multi_agent_v1__spawn_agent:{"task":"lint"}`, "tool:agent 7 answers=call_1"}
	if got := msgLines(e.runner.RunRequest(t)); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("the next run's messages\n got %q\nwant %q", got, want)
	}
}

// addEvent adds a streamed event to the SDK's accumulator, which checks
// what it collects.
func addEvent(t *testing.T, acc *responses.ResponseAccumulator, raw string) {
	t.Helper()
	var ev responses.ResponsesServerEventUnion
	if err := json.Unmarshal([]byte(raw), &ev); err != nil {
		t.Fatal(err)
	}
	if err := acc.AddEvent(ev); err != nil {
		t.Fatalf("the accumulator refused %s: %v", raw, err)
	}
}

// P2: a custom tool is a function of one string to the model; its call
// reaches the SDK as a custom_tool_call whose input is the string, whole
// and streamed (custom_tool_call_input events), and comes back as the
// model's call with its output.
func TestOfficialClientRoundTripsACustomTool(t *testing.T) {
	const patch = "*** Begin Patch\n*** Add File: a.txt\n+hi\n*** End Patch"
	args, _ := json.Marshal(map[string]string{"input": patch})
	events := []ft.Step{ft.Text("Patching."), ft.ToolCall(0, "call_p", "apply_patch", string(args[:20])),
		ft.ToolCall(0, "", "", string(args[20:])), ft.Completed("stop")}
	c, e := officialClient(t, &ft.Dispatcher{Events: events})
	params := responses.ResponseNewParams{Model: "m1", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("add a.txt")},
		Tools: []responses.ToolUnionParam{patchTool}}
	resp, err := c.Responses.New(t.Context(), params)
	if err != nil {
		t.Fatal(err)
	}
	call := resp.Output[1].AsCustomToolCall()
	if resp.Output[1].Type != "custom_tool_call" || call.Name != "apply_patch" || call.Input != patch || call.CallID != "call_p" {
		t.Fatalf("output %s", resp.RawJSON())
	}
	tool := e.runner.RunRequest(t).GetTools()[0]
	if tool.GetName() != "apply_patch" || string(tool.GetParametersJson()) != string(customParameters) ||
		!strings.Contains(tool.GetDescription(), "lark grammar") {
		t.Errorf("the run's tool %v", tool)
	}

	c, _ = officialClient(t, &ft.Dispatcher{Events: events})
	stream := c.Responses.NewStreaming(t.Context(), params)
	var acc responses.ResponseAccumulator
	var input string
	for stream.Next() {
		addEvent(t, &acc, stream.Current().RawJSON())
		if ev, ok := stream.Current().AsAny().(responses.ResponseCustomToolCallInputDoneEvent); ok {
			input = ev.Input
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	whole, err := acc.ReconstructedResponse()
	if input != patch || err != nil || whole.Output[1].AsCustomToolCall().Input != patch {
		t.Errorf("streamed input %q, accumulated %v", input, err)
	}

	c, e = officialClient(t, &ft.Dispatcher{Events: []ft.Step{ft.Text("Done."), ft.Completed("stop")}})
	back := call.ToParam()
	params.Input = responses.ResponseNewParamsInputUnion{OfInputItemList: responses.ResponseInputParam{
		{OfCustomToolCall: &back},
		responses.ResponseInputItemParamOfCustomToolCallOutput[string]("call_p", "Success."),
	}}
	if _, err := c.Responses.New(t.Context(), params); err != nil {
		t.Fatal(err)
	}
	want := []string{`assistant: call[0]=call_p:apply_patch:` + string(args), "tool:Success. answers=call_p"}
	if got := msgLines(e.runner.RunRequest(t)); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("the next run's messages\n got %q\nwant %q", got, want)
	}
}

// P2: a client-run built-in (local_shell) is a function to the model, and
// its call reaches the SDK as a local_shell_call with its action.
func TestOfficialClientGetsALocalShellCall(t *testing.T) {
	c, e := officialClient(t, &ft.Dispatcher{Events: []ft.Step{
		ft.ToolCall(0, "call_s", "local_shell", `{"command":["ls","-la"],"working_directory":"/src"}`), ft.Completed("stop")}})
	resp, err := c.Responses.New(t.Context(), responses.ResponseNewParams{Model: "m1",
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("list")},
		Tools: []responses.ToolUnionParam{{OfLocalShell: &responses.ToolLocalShellParam{}}}})
	if err != nil {
		t.Fatal(err)
	}
	call := resp.Output[0].AsLocalShellCall()
	if call.Type != "local_shell_call" || call.CallID != "call_s" || strings.Join(call.Action.Command, " ") != "ls -la" ||
		call.Action.WorkingDirectory != "/src" || call.Action.Type != "exec" || call.Status != "completed" {
		t.Errorf("output %s", resp.RawJSON())
	}
	if tools := e.runner.RunRequest(t).GetTools(); len(tools) != 1 || tools[0].GetName() != "local_shell" {
		t.Errorf("the run's tools %v", tools)
	}
}

// P2: a hosted tool (Codex's web_search) is dropped, and the response
// says so in X-IOP-Dropped-Tools; a route whose profile refuses hosted
// tools answers 400 naming it.
func TestOfficialClientHostedToolIsDroppedOrRefused(t *testing.T) {
	params := responses.ResponseNewParams{Model: "m1", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("news?")},
		Tools: []responses.ToolUnionParam{
			{OfWebSearch: &responses.WebSearchToolParam{Type: responses.WebSearchToolTypeWebSearch, ExternalWebAccess: openai.Bool(false)}},
			weatherFunction}}
	c, e := officialClient(t, &ft.Dispatcher{Events: []ft.Step{ft.Text("No news."), ft.Completed("stop")}})
	var httpResp *http.Response
	resp, err := c.Responses.New(t.Context(), params, option.WithResponseInto(&httpResp))
	if err != nil {
		t.Fatal(err)
	}
	if got := httpResp.Header.Get(frontend.DroppedToolsHeader); got != "web_search" {
		t.Errorf("%s: %q", frontend.DroppedToolsHeader, got)
	}
	if tools := e.runner.RunRequest(t).GetTools(); len(tools) != 1 || tools[0].GetName() != "get_weather" {
		t.Errorf("the run's tools %v", tools)
	}
	if len(resp.Tools) != 1 || resp.Tools[0].Type != "function" {
		t.Errorf("the echoed tools %s", resp.RawJSON())
	}

	refuse := &edgeconfig.Profile{Name: "strict", IdleTimeout: yamlconf.Duration(time.Hour), HostedTools: edgeconfig.HostedToolsRefuse}
	c, e = officialClient(t, &ft.Dispatcher{Profile: refuse, Events: []ft.Step{ft.Completed("stop")}})
	_, err = c.Responses.New(t.Context(), params)
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadRequest || apiErr.Param != "tools" ||
		!strings.Contains(apiErr.Message, "web_search") || !strings.Contains(apiErr.Message, "hosted_tools") {
		t.Errorf("refused: %v", err)
	}
	if len(e.runner.RunRequests()) != 0 {
		t.Error("a refused request ran")
	}
}

// P2: the SDK's reasoning effort levels reach the run as its levels.
func TestOfficialClientReasoningEffortLevels(t *testing.T) {
	for effort, want := range map[shared.ReasoningEffort]string{
		shared.ReasoningEffortNone: "none", shared.ReasoningEffortMinimal: "minimal", shared.ReasoningEffortLow: "low",
		shared.ReasoningEffortMedium: "medium", shared.ReasoningEffortHigh: "high", shared.ReasoningEffortXhigh: "max",
	} {
		c, e := officialClient(t, &ft.Dispatcher{Events: []ft.Step{ft.Completed("stop")}})
		if _, err := c.Responses.New(t.Context(), responses.ResponseNewParams{Model: "m1",
			Input:     responses.ResponseNewParamsInputUnion{OfString: openai.String("hi")},
			Reasoning: shared.ReasoningParam{Effort: effort, Summary: shared.ReasoningSummaryAuto}}); err != nil {
			t.Fatalf("%s: %v", effort, err)
		}
		c2, e2 := officialClient(t, &ft.Dispatcher{Events: []ft.Step{ft.Completed("stop")}})
		if _, err := c2.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{Model: "m1",
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}, ReasoningEffort: effort}); err != nil {
			t.Fatalf("chat %s: %v", effort, err)
		}
		for api, o := range map[string]*wirepb.RunOptions{"responses": e.runner.RunRequest(t).GetOptions(), "chat": e2.runner.RunRequest(t).GetOptions()} {
			if o.GetReasoningEffort() != want || o.GetThink() != (want != "none") {
				t.Errorf("%s %s: %q think %v", api, effort, o.GetReasoningEffort(), o.GetThink())
			}
		}
	}
}

// P2: the SDK's input token count is answered: by the provider's
// tokenizer when a candidate has one (exact), else by the Edge's estimate,
// as X-IOP-Token-Count says.
func TestOfficialClientCountsInputTokens(t *testing.T) {
	params := responses.InputTokenCountParams{Model: openai.String("m1"), Instructions: openai.String("be brief"),
		Input: responses.InputTokenCountParamsInputUnion{OfString: openai.String("what is the weather in Seoul?")},
		Tools: []responses.ToolUnionParam{weatherFunction, multiAgent,
			{OfWebSearch: &responses.WebSearchToolParam{Type: responses.WebSearchToolTypeWebSearch}}}}

	c, e := officialClient(t, &ft.Dispatcher{Events: []ft.Step{ft.Usage(42, 0), ft.Completed("stop")}})
	var httpResp *http.Response
	n, err := c.Responses.InputTokens.Count(t.Context(), params, option.WithResponseInto(&httpResp))
	if err != nil {
		t.Fatal(err)
	}
	if n.InputTokens != 42 || n.Object != "response.input_tokens" || httpResp.Header.Get(frontend.TokenCountHeader) != "exact" ||
		httpResp.Header.Get(frontend.DroppedToolsHeader) != "web_search" {
		t.Errorf("count %s, headers %v", n.RawJSON(), httpResp.Header)
	}
	run := e.runner.RunRequest(t)
	if !run.GetCountTokens() || len(run.GetTools()) != 3 || len(run.GetMessages()) != 2 {
		t.Errorf("the count's run %v", run)
	}

	c, _ = officialClient(t, &ft.Dispatcher{StartErr: fmt.Errorf("%w: no tokenizer", dispatch.ErrUnsupported)})
	n, err = c.Responses.InputTokens.Count(t.Context(), params, option.WithResponseInto(&httpResp))
	if err != nil {
		t.Fatal(err)
	}
	if want := frontend.EstimateTokens(run); n.InputTokens != want || httpResp.Header.Get(frontend.TokenCountHeader) != "estimate" {
		t.Errorf("estimate %d (want %d), %s", n.InputTokens, want, httpResp.Header.Get(frontend.TokenCountHeader))
	}
}
