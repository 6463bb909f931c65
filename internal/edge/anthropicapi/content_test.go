package anthropicapi

import (
	"encoding/base64"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"google.golang.org/protobuf/proto"

	"github.com/iop-dev/iop/internal/edge/frontend"
	ft "github.com/iop-dev/iop/internal/edge/frontend/frontendtest"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// P7, issue 21: the content blocks an agent sends that a chat model
// cannot take as they are (documents, search results, content at a URL or
// in Anthropic's Files API) are mapped to their nearest meaning or to a
// placeholder the model reads, never refused; what was left out is the
// request's dropped list.
func TestContentBlocksBecomeWhatTheModelReads(t *testing.T) {
	png := []byte("\x89PNG fake")
	img := base64.StdEncoding.EncodeToString(png)
	user := func(blocks string) string {
		return `{"model":"m1","max_tokens":5,"messages":[{"role":"user","content":[` + blocks + `]}]}`
	}
	call := `{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"search","input":{}}]}`
	tests := []struct {
		name    string
		body    string
		want    []*wirepb.ChatMessage
		dropped []string
	}{
		{"a text document with its title and context, then the question",
			user(`{"type":"document","source":{"type":"text","media_type":"text/plain","data":"Line one.\nLine two."},"title":"notes.txt","context":"from the wiki",` +
				`"citations":{"enabled":true},"cache_control":{"type":"ephemeral"}},{"type":"text","text":"Summarize it."}`),
			[]*wirepb.ChatMessage{{Role: "user", Content: "<document title=\"notes.txt\" context=\"from the wiki\">\nLine one.\nLine two.\n</document>\n\nSummarize it."}},
			nil},
		{"a content document: its text blocks and images; no title, no attributes",
			user(`{"type":"document","source":{"type":"content","content":[{"type":"text","text":"a"},{"type":"image","source":{"type":"base64","media_type":"image/png","data":"` + img + `"}},{"type":"text","text":"b"}]}}`),
			[]*wirepb.ChatMessage{{Role: "user", Content: "<document>\na\n\nb\n</document>", Images: [][]byte{png}}},
			nil},
		{"a content document of one string",
			user(`{"type":"document","source":{"type":"content","content":"plain"},"title":"t"}`),
			[]*wirepb.ChatMessage{{Role: "user", Content: "<document title=\"t\">\nplain\n</document>"}},
			nil},
		{"a base64 text document is its text",
			user(`{"type":"document","source":{"type":"base64","media_type":"text/markdown","data":"` + base64.StdEncoding.EncodeToString([]byte("# Title")) + `"}}`),
			[]*wirepb.ChatMessage{{Role: "user", Content: "<document>\n# Title\n</document>"}},
			nil},
		{"a title that would end its tag is escaped, on one line",
			user(`{"type":"document","source":{"type":"text","data":"x"},"title":"a \"b\" <c>\nd & e"}`),
			[]*wirepb.ChatMessage{{Role: "user", Content: "<document title=\"a &quot;b&quot; &lt;c&gt; d &amp; e\">\nx\n</document>"}},
			nil},
		{"a PDF, a PDF at a URL, a file: placeholders, each kind named once",
			user(`{"type":"document","source":{"type":"base64","media_type":"application/pdf","data":"JVBERi0="},"title":"Q3 report"},` +
				`{"type":"document","source":{"type":"url","url":"https://example.com/a.pdf"}},` +
				`{"type":"document","source":{"type":"base64","media_type":"application/pdf","data":"JVBERi0="}},` +
				`{"type":"document","source":{"type":"file","file_id":"file_011"}},{"type":"text","text":"compare them"}`),
			[]*wirepb.ChatMessage{{Role: "user", Content: `[A PDF document ("Q3 report") was omitted: the model here reads text and images, not PDFs.]` + "\n\n" +
				"[The document at https://example.com/a.pdf was omitted: the model server does not fetch URLs.]\n\n" +
				"[A PDF document was omitted: the model here reads text and images, not PDFs.]\n\n" +
				"[A document from Anthropic's Files API (file_011) was omitted: its files are not available here.]\n\ncompare them"}},
			[]string{"document:pdf", "document:url", "document:file"}},
		{"images at a URL and in the Files API: placeholders beside a base64 one",
			user(`{"type":"image","source":{"type":"url","url":"https://example.com/cat.png"}},{"type":"image","source":{"type":"file","file_id":"file_9"}},` +
				`{"type":"image","source":{"type":"base64","media_type":"image/png","data":"` + img + `"}},{"type":"text","text":"which is a cat?"}`),
			[]*wirepb.ChatMessage{{Role: "user", Content: "[An image at https://example.com/cat.png was omitted: the model server does not fetch URLs.]\n\n" +
				"[An image from Anthropic's Files API (file_9) was omitted: its files are not available here.]\n\nwhich is a cat?", Images: [][]byte{png}}},
			[]string{"image:url", "image:file"}},
		{"search results in a tool's result, and a tool reference",
			`{"model":"m1","max_tokens":5,"messages":[{"role":"user","content":"find it"},` + call + `,{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":[` +
				`{"type":"search_result","source":"https://docs/x","title":"X","content":[{"type":"text","text":"x is 1"},{"type":"text","text":"x is odd"}],"citations":{"enabled":true}},` +
				`{"type":"search_result","source":"https://docs/y","title":"","content":[{"type":"text","text":"y"}]},` +
				`{"type":"tool_reference","tool_name":"deploy"}]}]}]}`,
			[]*wirepb.ChatMessage{{Role: "user", Content: "find it"},
				{Role: "assistant", ToolCalls: []*wirepb.ToolCall{{Id: "t1", Name: "search", ArgumentsJson: []byte("{}")}}},
				{Role: "tool", ToolCallId: "t1", Name: "search", Content: "<search_result title=\"X\" source=\"https://docs/x\">\nx is 1\n\nx is odd\n</search_result>\n\n" +
					"<search_result source=\"https://docs/y\">\ny\n</search_result>\n\nTool available: deploy"}},
			nil},
		{"a search result and a PDF in a user turn, a document in a tool's result",
			`{"model":"m1","max_tokens":5,"messages":[{"role":"user","content":"go"},` + call + `,{"role":"user","content":[` +
				`{"type":"tool_result","tool_use_id":"t1","content":[{"type":"document","source":{"type":"url","url":"https://x/y.pdf"}}]},` +
				`{"type":"search_result","source":"kb","title":"T","content":[{"type":"text","text":"t"}]}]}]}`,
			[]*wirepb.ChatMessage{{Role: "user", Content: "go"},
				{Role: "assistant", ToolCalls: []*wirepb.ToolCall{{Id: "t1", Name: "search", ArgumentsJson: []byte("{}")}}},
				{Role: "tool", ToolCallId: "t1", Name: "search", Content: "[The document at https://x/y.pdf was omitted: the model server does not fetch URLs.]"},
				{Role: "user", Content: "<search_result title=\"T\" source=\"kb\">\nt\n</search_result>"}},
			[]string{"document:url"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, f := parseMessages([]byte(tt.body))
			if f != nil {
				t.Fatalf("refused: %s", f.Message)
			}
			got := p.run.GetMessages()
			if len(got) != len(tt.want) {
				t.Fatalf("messages %v, want %v", got, tt.want)
			}
			for i := range tt.want {
				if !proto.Equal(got[i], tt.want[i]) {
					t.Errorf("message %d\n got %v\nwant %v", i, got[i], tt.want[i])
				}
			}
			if !slices.Equal(p.dropped, tt.dropped) {
				t.Errorf("dropped %q, want %q", p.dropped, tt.dropped)
			}
		})
	}
}

// Malformed blocks are still 400, naming the field.
func TestMalformedContentBlocks(t *testing.T) {
	user := func(blocks string) string {
		return `{"model":"m1","max_tokens":5,"messages":[{"role":"user","content":[` + blocks + `]}]}`
	}
	system := func(blocks string) string {
		return `{"model":"m1","max_tokens":5,"messages":[{"role":"user","content":"hi"},{"role":"system","content":[` + blocks + `]}]}`
	}
	tests := []struct{ name, body, field string }{
		{"a document without a source", user(`{"type":"document"}`), "messages.0.content.0.source"},
		{"a document source of no known type", user(`{"type":"document","source":{"type":"s3"}}`), "messages.0.content.0.source.type"},
		{"a content document without content", user(`{"type":"document","source":{"type":"content"}}`), "messages.0.content.0.source.content"},
		{"a content document holding a tool_use", user(`{"type":"document","source":{"type":"content","content":[{"type":"tool_use"}]}}`),
			"messages.0.content.0.source.content.0.type"},
		{"a base64 text document that is not base64", user(`{"type":"document","source":{"type":"base64","media_type":"text/plain","data":"@@"}}`),
			"messages.0.content.0.source.data"},
		{"a search result without content", user(`{"type":"search_result","source":"s","title":"t"}`), "messages.0.content.0.content"},
		{"a search result holding an image", user(`{"type":"search_result","source":"s","title":"t","content":[{"type":"image"}]}`), "messages.0.content.0.content.0.type"},
		{"a search result's source that is not a string", user(`{"type":"search_result","source":{"type":"url"},"content":[]}`), "messages.0.content.0.source"},
		{"a tool reference without its name", user(`{"type":"tool_reference"}`), "messages.0.content.0.tool_name"},
		{"a tool_addition without its tool", system(`{"type":"tool_addition"}`), "messages.1.content.0.tool"},
		{"a tool_removal that defines a tool", system(`{"type":"tool_removal","tool":{"type":"tool_definition","definition":{"name":"f"}}}`), "messages.1.content.0.tool.type"},
		{"a tool reference without a name", system(`{"type":"tool_addition","tool":{"type":"tool_reference"}}`), "messages.1.content.0.tool.name"},
		{"a definition without a tool", system(`{"type":"tool_addition","tool":{"type":"tool_definition"}}`), "messages.1.content.0.tool.definition"},
		{"a custom tool defined without a name", system(`{"type":"tool_addition","tool":{"type":"tool_definition","definition":{"input_schema":{}}}}`),
			"messages.1.content.0.tool.definition.name"},
		{"a document in a system turn", system(`{"type":"document","source":{"type":"text","data":"x"}}`), "messages.1.content.0.type"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, f := parseMessages([]byte(tt.body))
			if f == nil {
				t.Fatal("accepted")
			}
			if !strings.HasPrefix(f.Message, tt.field+":") {
				t.Errorf("error %q, want one about %s", f.Message, tt.field)
			}
		})
	}
}

// Anthropic's mid-conversation tool changes: the run's tools are the set
// in effect at the conversation's end, where the model answers.
func TestToolChangesMakeTheToolsAtTheEnd(t *testing.T) {
	body := func(tools, system, choice string) string {
		return `{"model":"m1","max_tokens":5,"tools":[` + tools + `]` + choice + `,"messages":[{"role":"user","content":"hi"},` +
			`{"role":"system","content":[` + system + `]},{"role":"assistant","content":"ok"},{"role":"user","content":"go"}]}`
	}
	const (
		f = `{"name":"f","description":"old","input_schema":{"type":"object"}}`
		g = `{"name":"g","input_schema":{"type":"object"},"defer_loading":true}`
	)
	add := func(tool string) string { return `{"type":"tool_addition","tool":` + tool + `}` }
	remove := func(name string) string {
		return `{"type":"tool_removal","tool":{"type":"tool_reference","name":"` + name + `"}}`
	}
	ref := func(name string) string { return `{"type":"tool_reference","name":"` + name + `"}` }
	def := func(tool string) string { return `{"type":"tool_definition","definition":` + tool + `}` }
	tests := []struct {
		name   string
		body   string
		tools  string // "name:description" of the run's tools
		hosted []string
	}{
		{"a tool defined by value is offered", body(f, add(def(`{"name":"h","description":"new","input_schema":{"type":"object"}}`)), ""), "f:old h:new", nil},
		{"a definition of a tool's name replaces it", body(f+","+g, add(def(`{"name":"f","description":"new"}`)), ""), "f:new g:", nil},
		{"a removal withdraws a tool", body(f+","+g, remove("f"), ""), "g:", nil},
		{"a removed tool added again by name", body(f+","+g, remove("f")+","+add(ref("f")), ""), "g: f:old", nil},
		{"a deferred tool added by name is offered already", body(f+","+g, add(ref("g")), ""), "f:old g:", nil},
		{"a name the request never declared changes nothing", body(f, add(ref("nope"))+","+remove("nope"), ""), "f:old", nil},
		{"MCP references change nothing here",
			body(f, add(`{"type":"mcp_tool_reference","server_name":"docs","name":"search"}`)+","+`{"type":"tool_removal","tool":{"type":"mcp_toolset_reference","server_name":"docs"}}`, ""),
			"f:old", nil},
		{"a server tool defined by value is a hosted tool", body(f, add(def(`{"type":"web_search_20250305","name":"web_search"}`)), ""), "f:old", []string{"web_search_20250305"}},
		{"a client tool defined by value is its function", body(f, add(def(`{"type":"bash_20250124","name":"bash"}`)), ""), "f:old bash:" + bashDescription, nil},
		{"tool_choice may name an added tool", body(f, add(def(`{"name":"h"}`)), `,"tool_choice":{"type":"tool","name":"h"}`), "f:old h:", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, fl := parseMessages([]byte(tt.body))
			if fl != nil {
				t.Fatalf("refused: %s", fl.Message)
			}
			var got []string
			for _, tl := range p.run.GetTools() {
				got = append(got, tl.GetName()+":"+tl.GetDescription())
			}
			if strings.Join(got, " ") != tt.tools {
				t.Errorf("tools %q, want %q", strings.Join(got, " "), tt.tools)
			}
			if !slices.Equal(p.hosted, tt.hosted) {
				t.Errorf("hosted %q, want %q", p.hosted, tt.hosted)
			}
			// A system turn of tool changes alone says nothing the model reads.
			for _, m := range p.run.GetMessages() {
				if m.GetRole() == "system" {
					t.Errorf("a system message: %v", m)
				}
			}
		})
	}

	// tool_choice may not force a withdrawn tool: 400, as for any tool the
	// run does not have.
	_, fl := parseMessages([]byte(body(f+","+g, remove("f"), `,"tool_choice":{"type":"tool","name":"f"}`)))
	if fl == nil || !strings.HasPrefix(fl.Message, "tool_choice.name:") {
		t.Errorf("forcing a removed tool: %v", fl)
	}
	// A system turn whose turn has passed (clear_at) keeps its tool changes.
	p, fl := parseMessages([]byte(`{"model":"m1","max_tokens":5,"tools":[` + f + `],"messages":[{"role":"user","content":"hi"},` +
		`{"role":"system","clear_at":"next_user_message","content":[{"type":"text","text":"for now"},` + remove("f") + `]},{"role":"user","content":"go"}]}`))
	if fl != nil || len(p.run.GetTools()) != 0 || len(p.run.GetMessages()) != 2 {
		t.Errorf("a cleared turn's removal: %v, tools %v, messages %v", fl, p.run.GetTools(), p.run.GetMessages())
	}
}

// The official SDK's document and search_result blocks, and the beta's
// system turn with tool changes, are served, not refused.
func TestOfficialClientSendsDocumentsAndSearchResults(t *testing.T) {
	f := &ft.Dispatcher{Events: []ft.Step{ft.Text("ok"), ft.Completed("stop")}}
	c, _ := officialClient(t, f)
	doc := anthropic.NewDocumentBlock(anthropic.PlainTextSourceParam{Data: "The sky is blue."})
	doc.OfDocument.Title = anthropic.String("facts")
	pdf := anthropic.NewDocumentBlock(anthropic.Base64PDFSourceParam{Data: "JVBERi0xLjQK"})
	url := anthropic.NewDocumentBlock(anthropic.URLPDFSourceParam{URL: "https://example.com/paper.pdf"})
	search := anthropic.SearchResultBlockParam{Source: "https://kb/sky", Title: "Sky", Content: []anthropic.TextBlockParam{{Text: "Rayleigh scattering."}}}
	msg, err := c.Messages.New(t.Context(), anthropic.MessageNewParams{
		Model: "m1", MaxTokens: 64, Tools: []anthropic.ToolUnionParam{weatherTool},
		Messages: []anthropic.MessageParam{
			anthropic.NewUserMessage(doc, pdf, url, anthropic.NewTextBlock("why?")),
			anthropic.NewAssistantMessage(anthropic.NewToolUseBlock("toolu_1", map[string]any{"city": "x"}, "get_weather")),
			anthropic.NewUserMessage(anthropic.ContentBlockParamUnion{OfToolResult: &anthropic.ToolResultBlockParam{
				ToolUseID: "toolu_1", Content: []anthropic.ToolResultBlockParamContentUnion{{OfSearchResult: &search}}}}),
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if msg.Content[0].Text != "ok" {
		t.Errorf("answer %s", msg.RawJSON())
	}
	got := f.RunRequest(t).GetMessages()
	want := []*wirepb.ChatMessage{
		{Role: "user", Content: "<document title=\"facts\">\nThe sky is blue.\n</document>\n\n" +
			"[A PDF document was omitted: the model here reads text and images, not PDFs.]\n\n" +
			"[The document at https://example.com/paper.pdf was omitted: the model server does not fetch URLs.]\n\nwhy?"},
		{Role: "assistant", ToolCalls: []*wirepb.ToolCall{{Id: "toolu_1", Name: "get_weather", ArgumentsJson: []byte(`{"city":"x"}`)}}},
		{Role: "tool", ToolCallId: "toolu_1", Name: "get_weather", Content: "<search_result title=\"Sky\" source=\"https://kb/sky\">\nRayleigh scattering.\n</search_result>"},
	}
	if len(got) != len(want) {
		t.Fatalf("messages %v", got)
	}
	for i := range want {
		if !proto.Equal(got[i], want[i]) {
			t.Errorf("message %d\n got %v\nwant %v", i, got[i], want[i])
		}
	}
}

func TestOfficialBetaClientSendsToolChanges(t *testing.T) {
	f := &ft.Dispatcher{Events: []ft.Step{ft.Text("ok"), ft.Completed("stop")}}
	c, e := officialClient(t, f)
	deploy := anthropic.BetaToolChangeToolDefinitionParam{Definition: anthropic.BetaToolUnionParam{OfTool: &anthropic.BetaToolParam{
		Name: "deploy", Description: anthropic.String("ships it"), InputSchema: anthropic.BetaToolInputSchemaParam{Properties: map[string]any{}}}}}
	weather := anthropic.BetaToolUnionParam{OfTool: &anthropic.BetaToolParam{Name: "get_weather", InputSchema: anthropic.BetaToolInputSchemaParam{}}}
	add := anthropic.NewBetaToolAdditionBlock(deploy)
	remove := anthropic.NewBetaToolRemovalBlock(anthropic.BetaToolChangeToolReferenceParam{Name: "get_weather"})
	_, err := c.Beta.Messages.New(t.Context(), anthropic.BetaMessageNewParams{
		Model: "m1", MaxTokens: 64, Tools: []anthropic.BetaToolUnionParam{weather},
		Betas: []anthropic.AnthropicBeta{anthropic.AnthropicBetaMidConversationToolChanges2026_07_01, anthropic.AnthropicBetaInlineTools2026_09_15},
		Messages: []anthropic.BetaMessageParam{
			anthropic.NewBetaUserMessage(anthropic.NewBetaTextBlock("hi")),
			anthropic.NewBetaSystemMessage(anthropic.BetaSystemMessageOutputConfigParam{},
				anthropic.BetaSystemMessageParamContentUnion{OfText: &anthropic.BetaTextBlockParam{Text: "<env>prod</env>"}},
				anthropic.BetaSystemMessageParamContentUnion{OfToolAddition: add.OfToolAddition},
				anthropic.BetaSystemMessageParamContentUnion{OfToolRemoval: remove.OfToolRemoval}),
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	run := f.RunRequest(t)
	if tools := run.GetTools(); len(tools) != 1 || tools[0].GetName() != "deploy" || tools[0].GetDescription() != "ships it" {
		t.Errorf("tools %v, want deploy alone", tools)
	}
	msgs := run.GetMessages()
	if len(msgs) != 2 || msgs[1].GetRole() != "system" || msgs[1].GetContent() != "<env>prod</env>" {
		t.Errorf("messages %v", msgs)
	}
	if n := e.requests(t, "ok"); n != 1 {
		t.Errorf("%v requests served", n)
	}
}

// P7: content the model cannot read is replaced, not refused, and the
// answer says what was left out (X-IOP-Dropped-Content), for a run and for
// a count alike.
func TestDroppedContentIsNamedInTheAnswer(t *testing.T) {
	e := newEnv(t, &ft.Dispatcher{Events: []ft.Step{ft.Text("ok"), ft.Completed("stop")}})
	body := `{"model":"m1","max_tokens":5,"messages":[{"role":"user","content":[` +
		`{"type":"document","source":{"type":"base64","media_type":"application/pdf","data":"JVBERi0="}},` +
		`{"type":"image","source":{"type":"url","url":"https://example.com/a.png"}},` +
		`{"type":"document","source":{"type":"base64","media_type":"application/pdf","data":"JVBERi0="}},` +
		`{"type":"text","text":"summarise"}]}]}`
	for _, path := range []string{"/v1/messages", "/v1/messages/count_tokens"} {
		w := e.postTo(path, body, nil)
		if w.Code != http.StatusOK {
			t.Fatalf("%s: %d %s", path, w.Code, w.Body)
		}
		if got := w.Header().Get(frontend.DroppedContentHeader); got != "document:pdf,image:url" {
			t.Errorf("%s: %s = %q, want %q", path, frontend.DroppedContentHeader, got, "document:pdf,image:url")
		}
	}
	if w := e.post(`{"model":"m1","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`); w.Header().Get(frontend.DroppedContentHeader) != "" {
		t.Errorf("a request with nothing dropped has %s %q", frontend.DroppedContentHeader, w.Header().Get(frontend.DroppedContentHeader))
	}
}
