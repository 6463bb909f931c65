package integration

import (
	"encoding/json"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	aoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"

	"github.com/iop-dev/iop/internal/fakes/fakeollama"
	"github.com/iop-dev/iop/internal/fakes/fakeopenai"
)

// What coding agents send, through the official SDKs unchanged, against
// real edged and noded processes, their adapter plugins and a fake model
// server (issue 21; SPEC P2, P7): a system turn inside Anthropic messages,
// token counts, a namespace tool beside a hosted one on the Responses API.
// Forced tool calls and large requests are in sdk_agents_forced_test.go.

// Headers the Edge answers with (frontend.TokenCountHeader,
// frontend.DroppedToolsHeader), spelled out: these tests read the wire.
const (
	sdkTokenCountHeader   = "X-IOP-Token-Count"
	sdkDroppedToolsHeader = "X-IOP-Dropped-Tools"
)

// sdkBackend is an Edge in front of one fake model server, through one
// adapter, as the tests of this file see it.
type sdkBackend struct {
	base  string
	model string // as clients name it
	// chats are the bodies of the chat requests the model server got,
	// oldest first.
	chats func() [][]byte
	// paths are the paths of every request the model server got.
	paths func() []string
	// promptTokens is the prompt tokens the model server counted for its
	// last chat request.
	promptTokens func() int
}

// ollamaSDKBackend is the fake Ollama through the ollama adapter.
func ollamaSDKBackend(t *testing.T, m fakeollama.Model) sdkBackend {
	s := startStack(t, m)
	return sdkBackend{
		base: s.base, model: strings.TrimSuffix(m.Name, ":latest"),
		chats: func() [][]byte {
			var out [][]byte
			for _, r := range s.fake.Requests() {
				if r.Path == "/api/chat" {
					out = append(out, r.Body)
				}
			}
			return out
		},
		paths: func() []string {
			var out []string
			for _, r := range s.fake.Requests() {
				out = append(out, r.Path)
			}
			return out
		},
		promptTokens: func() int {
			n := 0
			for _, r := range s.fake.Requests() {
				if r.Path == "/api/chat" {
					n = r.PromptTokens
				}
			}
			return n
		},
	}
}

// openAISDKBackend is the fake OpenAI-compatible server (model
// qwen3-8b) through the openai adapter.
func openAISDKBackend(t *testing.T, cfg fakeopenai.Config) sdkBackend {
	fake := fakeopenai.Start(cfg)
	t.Cleanup(fake.Close)
	base := openAIStack(t, fake, "api: {allow_anonymous: true}\n")
	return sdkBackend{
		base: base, model: "qwen3-8b",
		chats: func() [][]byte {
			var out [][]byte
			for _, r := range fake.Requests() {
				if r.Path == "/v1/chat/completions" {
					out = append(out, r.Body)
				}
			}
			return out
		},
		paths: func() []string {
			var out []string
			for _, r := range fake.Requests() {
				out = append(out, r.Path)
			}
			return out
		},
		promptTokens: func() int {
			n := 0
			for _, r := range fake.Requests() {
				if r.Path == "/v1/chat/completions" {
					n = r.PromptTokens
				}
			}
			return n
		},
	}
}

// lastChat is the last chat request the model server got, decoded in the
// shape Ollama's and OpenAI's chat requests share.
func (b sdkBackend) lastChat(t *testing.T) sdkServerChat {
	t.Helper()
	chats := b.chats()
	if len(chats) == 0 {
		t.Fatal("the model server got no chat request")
	}
	var c sdkServerChat
	if err := json.Unmarshal(chats[len(chats)-1], &c); err != nil {
		t.Fatalf("decode the model server's chat request: %v", err)
	}
	return c
}

// sdkServerChat is a chat request as a model server got it: Ollama's
// /api/chat and OpenAI's /v1/chat/completions agree on these fields.
type sdkServerChat struct {
	Messages []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	} `json:"messages"`
	Tools []struct {
		Function struct {
			Name       string          `json:"name"`
			Parameters json.RawMessage `json:"parameters"`
		} `json:"function"`
	} `json:"tools"`
	Format     json.RawMessage `json:"format"`
	ToolChoice json.RawMessage `json:"tool_choice"`
}

// turns are the chat's messages as "role: text" (a content of parts
// gives its texts).
func (c sdkServerChat) turns(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, m := range c.Messages {
		var text string
		if err := json.Unmarshal(m.Content, &text); err != nil {
			var parts []struct{ Text string }
			if err := json.Unmarshal(m.Content, &parts); err != nil {
				t.Fatalf("message content %s", m.Content)
			}
			for _, p := range parts {
				text += p.Text
			}
		}
		out = append(out, m.Role+": "+text)
	}
	return out
}

func (c sdkServerChat) toolNames() []string {
	var out []string
	for _, tool := range c.Tools {
		out = append(out, tool.Function.Name)
	}
	return out
}

// sdkBackends are the adapters the tests of this file run over, each with
// a model that answers as mOllama and mOpenAI say.
func sdkBackends(mOllama fakeollama.Model, cfg fakeopenai.Config) map[string]func(*testing.T) sdkBackend {
	return map[string]func(*testing.T) sdkBackend{
		"ollama adapter": func(t *testing.T) sdkBackend { return ollamaSDKBackend(t, mOllama) },
		"openai adapter": func(t *testing.T) sdkBackend { return openAISDKBackend(t, cfg) },
	}
}

// Issue 21, P7: Claude Code's conversation shape through the official
// Anthropic SDK: a top-level system prompt with cache_control, and system
// turns inside messages (its environment block after the first user turn,
// a reminder before the last). The Edge answers 200, and the model server
// gets each system turn folded into a user turn where it stood (the
// adapters' default, system_turns: fold): the markup element as it is, at
// the end of the user turn before it (an assistant turn follows), the
// plain text wrapped in <system-reminder> at the start of the user turn
// after it; the leading system prompt stays first.
func TestAnthropicSDKSystemTurnInsideMessagesIsFoldedWhereItStood(t *testing.T) {
	for name, backend := range sdkBackends(
		fakeollama.Model{Name: "llama3.2:latest", Text: "Build fixed."},
		fakeopenai.Config{Models: []fakeopenai.Model{{Name: "qwen3-8b", Tokens: []string{"Build", " fixed."}}}},
	) {
		t.Run(name, func(t *testing.T) {
			b := backend(t)
			c := anthropicClient(b.base)
			cached := anthropic.NewCacheControlEphemeralParam()
			var resp *http.Response
			msg, err := c.Messages.New(t.Context(), anthropic.MessageNewParams{
				Model: anthropic.Model(b.model), MaxTokens: 1024,
				System: []anthropic.TextBlockParam{{Text: "You are a coding agent.", CacheControl: cached}},
				Messages: []anthropic.MessageParam{
					anthropic.NewUserMessage(anthropic.NewTextBlock("fix the build")),
					{OfSystem: &anthropic.SystemMessageParam{Content: []anthropic.TextBlockParam{
						{Text: "<env>cwd: /src</env>", CacheControl: cached}}}},
					anthropic.NewAssistantMessage(anthropic.NewTextBlock("On it.")),
					{OfSystem: &anthropic.SystemMessageParam{Content: []anthropic.TextBlockParam{{Text: "Answer briefly."}}}},
					anthropic.NewUserMessage(anthropic.NewTextBlock("go")),
				},
			}, aoption.WithResponseInto(&resp))
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != http.StatusOK || len(msg.Content) != 1 || msg.Content[0].Text != "Build fixed." ||
				msg.StopReason != anthropic.StopReasonEndTurn {
				t.Errorf("%d %s", resp.StatusCode, msg.RawJSON())
			}
			want := []string{
				"system: You are a coding agent.",
				"user: fix the build\n\n<env>cwd: /src</env>",
				"assistant: On it.",
				"user: <system-reminder>\nAnswer briefly.\n</system-reminder>\n\ngo",
			}
			if got := b.lastChat(t).turns(t); !reflect.DeepEqual(got, want) {
				t.Errorf("the model server got\n%q\nwant\n%q", got, want)
			}
		})
	}
}

// sdkCountTexts are the texts of sdkCountConversation, in order.
var sdkCountTexts = []string{
	"Why does the build fail on the second run of make?",
	"<env>cwd: /src os: linux</env>",
	"A generated header is stale.",
	"Then regenerate it before the build starts, please.",
}

// sdkCountConversation is one conversation asked of the Anthropic API and
// counted, with a system turn inside it (counted as it is folded).
var sdkCountConversation = []anthropic.MessageParam{
	anthropic.NewUserMessage(anthropic.NewTextBlock(sdkCountTexts[0])),
	{OfSystem: &anthropic.SystemMessageParam{Content: []anthropic.TextBlockParam{{Text: sdkCountTexts[1]}}}},
	anthropic.NewAssistantMessage(anthropic.NewTextBlock(sdkCountTexts[2])),
	anthropic.NewUserMessage(anthropic.NewTextBlock(sdkCountTexts[3])),
}

const sdkCountSystem = "You are a careful coding agent working in a terminal."

// Issue 21, P2: POST /v1/messages/count_tokens through the SDK's
// CountTokens, and POST /v1/responses/input_tokens through openai-go's
// Responses.InputTokens.Count. Through the openai adapter in front of a
// server with vLLM's /tokenize the count is exact (X-IOP-Token-Count:
// exact) and equals the prompt tokens the server counts when the same
// conversation runs; through the ollama adapter (Ollama has no tokenize
// API) it is the Edge's estimate, said so, and no model runs for it.
func TestSDKTokenCountsExactOrEstimated(t *testing.T) {
	countParams := func(model string) anthropic.MessageCountTokensParams {
		return anthropic.MessageCountTokensParams{Model: anthropic.Model(model),
			System:   anthropic.MessageCountTokensParamsSystemUnion{OfTextBlockArray: []anthropic.TextBlockParam{{Text: sdkCountSystem}}},
			Messages: sdkCountConversation}
	}
	respInput := responses.ResponseInputParam{
		responses.ResponseInputItemParamOfMessage("List the files changed by the last commit.", responses.EasyInputMessageRoleUser),
		responses.ResponseInputItemParamOfMessage("Three files: a.go, b.go and c.go.", responses.EasyInputMessageRoleAssistant),
		responses.ResponseInputItemParamOfMessage("Which of them has tests?", responses.EasyInputMessageRoleUser),
	}
	const respInstructions = "Answer from the repository only."

	t.Run("openai adapter, vLLM tokenize: exact", func(t *testing.T) {
		b := openAISDKBackend(t, fakeopenai.Config{Tokenize: fakeopenai.TokenizeVLLM,
			Models: []fakeopenai.Model{{Name: "qwen3-8b", Tokens: []string{"Regenerated."}}}})
		ac := anthropicClient(b.base)
		var resp *http.Response
		n, err := ac.Messages.CountTokens(t.Context(), countParams(b.model), aoption.WithResponseInto(&resp))
		if err != nil {
			t.Fatal(err)
		}
		if h := resp.Header.Get(sdkTokenCountHeader); h != "exact" || n.InputTokens <= 0 {
			t.Fatalf("count %d, %s %q; want an exact count", n.InputTokens, sdkTokenCountHeader, h)
		}
		if !slices.Contains(b.paths(), "/tokenize") || len(b.chats()) != 0 {
			t.Errorf("the server got %q: want a /tokenize and no chat", b.paths())
		}
		msg, err := ac.Messages.New(t.Context(), anthropic.MessageNewParams{Model: anthropic.Model(b.model), MaxTokens: 64,
			System: []anthropic.TextBlockParam{{Text: sdkCountSystem}}, Messages: sdkCountConversation})
		if err != nil {
			t.Fatal(err)
		}
		if served := b.promptTokens(); n.InputTokens != int64(served) || msg.Usage.InputTokens != int64(served) {
			t.Errorf("counted %d; the server counted %d prompt tokens running it, usage says %d", n.InputTokens, served, msg.Usage.InputTokens)
		}

		oc := responsesClient(b.base)
		count, err := oc.Responses.InputTokens.Count(t.Context(), responses.InputTokenCountParams{
			Model: openai.String(b.model), Instructions: openai.String(respInstructions),
			Input: responses.InputTokenCountParamsInputUnion{OfResponseInputItemArray: respInput},
		}, option.WithResponseInto(&resp))
		if err != nil {
			t.Fatal(err)
		}
		if h := resp.Header.Get(sdkTokenCountHeader); h != "exact" || count.InputTokens <= 0 || count.Object != "response.input_tokens" {
			t.Fatalf("input_tokens %s, %s %q; want an exact count", count.RawJSON(), sdkTokenCountHeader, h)
		}
		r, err := oc.Responses.New(t.Context(), responses.ResponseNewParams{Model: b.model, Instructions: openai.String(respInstructions),
			Input: responses.ResponseNewParamsInputUnion{OfInputItemList: respInput}})
		if err != nil {
			t.Fatal(err)
		}
		if served := b.promptTokens(); count.InputTokens != int64(served) || r.Usage.InputTokens != int64(served) {
			t.Errorf("counted %d; the server counted %d prompt tokens running it, usage says %d", count.InputTokens, served, r.Usage.InputTokens)
		}
	})

	t.Run("ollama adapter: estimate", func(t *testing.T) {
		b := ollamaSDKBackend(t, fakeollama.Model{Name: "llama3.2:latest", Text: "Regenerated."})
		chars := len(sdkCountSystem)
		for _, text := range sdkCountTexts {
			chars += len(text)
		}
		var resp *http.Response
		ac := anthropicClient(b.base)
		n, err := ac.Messages.CountTokens(t.Context(), countParams(b.model), aoption.WithResponseInto(&resp))
		if err != nil {
			t.Fatal(err)
		}
		// About four characters a token: a plausible count of this text
		// lies between one token in eight characters and one in two, with
		// a few tokens of framing for each message.
		if h := resp.Header.Get(sdkTokenCountHeader); h != "estimate" || n.InputTokens < int64(chars/8) || n.InputTokens > int64(chars/2+10*5) {
			t.Errorf("count %d of %d characters, %s %q; want a plausible estimate", n.InputTokens, chars, sdkTokenCountHeader, h)
		}

		oc := responsesClient(b.base)
		count, err := oc.Responses.InputTokens.Count(t.Context(), responses.InputTokenCountParams{
			Model: openai.String(b.model), Instructions: openai.String(respInstructions),
			Input: responses.InputTokenCountParamsInputUnion{OfResponseInputItemArray: respInput},
		}, option.WithResponseInto(&resp))
		if err != nil {
			t.Fatal(err)
		}
		if h := resp.Header.Get(sdkTokenCountHeader); h != "estimate" || count.InputTokens <= 0 {
			t.Errorf("input_tokens %s, %s %q; want an estimate", count.RawJSON(), sdkTokenCountHeader, h)
		}
		if len(b.chats()) != 0 {
			t.Errorf("a count ran the model: %q", b.paths())
		}
	})
}

// sdkTerminalNamespace is a namespace of functions, as Codex groups its shell tools.
var sdkTerminalNamespace = responses.ToolUnionParam{OfNamespace: &responses.NamespaceToolParam{
	Name: "terminal", Description: "Run commands in the user's terminal.",
	Tools: []responses.NamespaceToolToolUnionParam{
		{OfFunction: &responses.NamespaceToolToolFunctionParam{Name: "exec_command", Description: openai.String("Run a command."),
			Parameters: map[string]any{"type": "object", "required": []string{"cmd"},
				"properties": map[string]any{"cmd": map[string]any{"type": "string"}, "workdir": map[string]any{"type": "string"}}}}},
		{OfFunction: &responses.NamespaceToolToolFunctionParam{Name: "write_stdin", Description: openai.String("Type into a session."),
			Parameters: map[string]any{"type": "object", "required": []string{"session_id", "chars"},
				"properties": map[string]any{"session_id": map[string]any{"type": "integer"}, "chars": map[string]any{"type": "string"}}}}},
	},
}}

// sdkWebSearch is OpenAI's hosted web search tool, which Codex declares.
var sdkWebSearch = responses.ToolUnionParam{OfWebSearch: &responses.WebSearchToolParam{Type: responses.WebSearchToolTypeWebSearch}}

// Issue 21, P2, P7: Codex's tools through openai-go's Responses API: a
// namespace of functions and the hosted web_search. The model (the fakes'
// agent, which calls the first shell tool offered) sees the namespace's
// functions under flat names and no web_search; the response's
// function_call carries the inner name and the namespace; web_search is
// named in X-IOP-Dropped-Tools. The call sent back with its output (the
// next turn, streamed) reaches the model as a tool result, and the model
// answers.
func TestResponsesSDKNamespaceToolAndHostedWebSearch(t *testing.T) {
	for name, backend := range sdkBackends(
		fakeollama.Model{Name: "llama3.2:latest", Agent: &fakeollama.Agent{}},
		fakeopenai.Config{Models: []fakeopenai.Model{{Name: "qwen3-8b", Agent: &fakeopenai.Agent{}}}},
	) {
		t.Run(name, func(t *testing.T) {
			b := backend(t)
			c := responsesClient(b.base)
			question := responses.ResponseInputItemParamOfMessage("Is the build green?", responses.EasyInputMessageRoleUser)
			params := responses.ResponseNewParams{Model: b.model, Instructions: openai.String("You are Codex."),
				Input: responses.ResponseNewParamsInputUnion{OfInputItemList: responses.ResponseInputParam{question}},
				Tools: []responses.ToolUnionParam{sdkTerminalNamespace, sdkWebSearch}, Store: openai.Bool(false),
				PromptCacheKey: openai.String("session-21"), ParallelToolCalls: openai.Bool(false),
				Include: []responses.ResponseIncludable{responses.ResponseIncludableReasoningEncryptedContent}}
			var resp *http.Response
			first, err := c.Responses.New(t.Context(), params, option.WithResponseInto(&resp))
			if err != nil {
				t.Fatal(err)
			}
			if h := resp.Header.Get(sdkDroppedToolsHeader); h != "web_search" {
				t.Errorf("%s = %q, want web_search", sdkDroppedToolsHeader, h)
			}
			var call responses.ResponseFunctionToolCall
			for _, item := range first.Output {
				if item.Type == "function_call" {
					call = item.AsFunctionCall()
				}
			}
			var args struct {
				Cmd string `json:"cmd"`
			}
			if call.Name != "exec_command" || call.Namespace != "terminal" || call.CallID == "" ||
				json.Unmarshal([]byte(call.Arguments), &args) != nil || args.Cmd != "echo iop-agent-ok" {
				t.Fatalf("want a call of terminal's exec_command: %s", first.RawJSON())
			}
			chat := b.lastChat(t)
			if got := chat.toolNames(); !reflect.DeepEqual(got, []string{"terminal__exec_command", "terminal__write_stdin"}) {
				t.Errorf("the model was offered %q", got)
			}

			back := call.ToParam()
			out := responses.ResponseInputItemParamOfFunctionCallOutput("iop-agent-ok")
			out.OfFunctionCallOutput.CallID = openai.String(call.CallID)
			params.Input.OfInputItemList = append(params.Input.OfInputItemList, responses.ResponseInputItemUnionParam{OfFunctionCall: &back}, out)
			stream := c.Responses.NewStreaming(t.Context(), params, option.WithResponseInto(&resp))
			var final responses.Response
			for stream.Next() {
				if v, ok := stream.Current().AsAny().(responses.ResponseCompletedEvent); ok {
					final = v.Response
				}
			}
			if err := stream.Err(); err != nil {
				t.Fatal(err)
			}
			if final.Status != responses.ResponseStatusCompleted || final.OutputText() != "The command printed: iop-agent-ok" {
				t.Errorf("the answer to the call's output: %s", final.RawJSON())
			}
			if h := resp.Header.Get(sdkDroppedToolsHeader); h != "web_search" {
				t.Errorf("streamed: %s = %q, want web_search", sdkDroppedToolsHeader, h)
			}
			turns := b.lastChat(t).turns(t)
			if len(turns) != 4 || turns[3] != "tool: iop-agent-ok" {
				t.Errorf("the model server got %q", turns)
			}
		})
	}
}
