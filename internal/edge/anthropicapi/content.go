package anthropicapi

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/iop-dev/iop/internal/edge/frontend"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// Content blocks beyond text, thinking and tool calls (Anthropic's
// content block reference), as the model behind the Edge can have them:
// every one a chat message can carry is mapped to its nearest meaning,
// and the rest become a short placeholder that says what was left out and
// why, so that the model knows, and the request is not refused for it.
//
//   - image (in a user turn or a tool result): a base64 image is the
//     message's image. One at a URL or in Anthropic's Files API is a
//     placeholder: the Node that runs the request may not reach the
//     client's network, and the Edge keeps no files.
//   - document (the same places): a text document (source "text", or
//     source "content", its text blocks and images) is text in the
//     message, between <document> tags with its title and context;
//     citations, which only Anthropic's models make, are not asked for. A
//     PDF (base64 or at a URL) or a file of the Files API is a
//     placeholder: the models behind the Edge take text and images.
//   - search_result (the same places: a tool's results, or the user's):
//     its text blocks between <search_result> tags with its title and
//     source.
//   - tool_reference (in a tool result: a client's own tool search
//     answering with the tools it found): a line saying the tool is
//     available, which it is (a deferred tool is offered as any other).
//   - tool_addition and tool_removal (in a system turn: Anthropic's
//     mid-conversation tool changes) change the run's tools: see
//     toolChange.
//
// The kinds of content left out ("document:pdf", "document:url",
// "document:file", "image:url", "image:file") are the request's dropped
// list, in order, each once (parsedMessages.dropped).

// source is an image's or a document's source.
type source struct {
	Type      string          `json:"type"` // base64, text, content, url, file
	MediaType string          `json:"media_type"`
	Data      string          `json:"data"`
	URL       string          `json:"url"`
	FileID    string          `json:"file_id"`
	Content   json.RawMessage `json:"content"` // source "content": a string or text and image blocks
}

// conversion is what converting a request's messages gathers on the way.
type conversion struct {
	// toolNames maps the tool_use ids seen so far to their tool's name,
	// for the tool results that answer them.
	toolNames map[string]string
	// dropped are the kinds of content left out, in order, each once.
	dropped []string
	// changes are the system turns' tool changes, in order.
	changes []toolChange
}

func newConversion() *conversion { return &conversion{toolNames: map[string]string{}} }

// drop notes that content of kind was left out.
func (c *conversion) drop(kind string) {
	if !slices.Contains(c.dropped, kind) {
		c.dropped = append(c.dropped, kind)
	}
}

// userContent converts one block of a user turn or of a tool's result
// that the model reads: text, image, document, search_result or
// tool_reference, as its text and images. handled is false for any other
// type, which the caller refuses or handles.
func (c *conversion) userContent(b *block, field string) (text string, imgs [][]byte, handled bool, f *frontend.Failure) {
	switch b.Type {
	case "text":
		return b.Text, nil, true, nil
	case "image":
		img, omitted, f := c.image(b, field)
		if img != nil {
			imgs = [][]byte{img}
		}
		return omitted, imgs, true, f
	case "document":
		text, imgs, f := c.document(b, field)
		return text, imgs, true, f
	case "search_result":
		text, f := searchResult(b, field)
		return text, nil, true, f
	case "tool_reference":
		if b.ToolName == "" {
			return "", nil, true, invalid(field+".tool_name", "Field required")
		}
		return "Tool available: " + b.ToolName, nil, true, nil
	}
	return "", nil, false, nil
}

// resultContent is a tool_result's content: a string, or blocks the model
// reads (userContent), their texts joined by blank lines.
func (c *conversion) resultContent(raw json.RawMessage, field string) (string, [][]byte, *frontend.Failure) {
	if raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", nil, invalid(field, "not a valid string")
		}
		return s, nil, nil
	}
	blocks, f := decodeBlocks(raw, field)
	if f != nil {
		return "", nil, f
	}
	var texts []string
	var imgs [][]byte
	for j := range blocks {
		bf := fmt.Sprintf("%s.%d", field, j)
		text, bi, handled, f := c.userContent(&blocks[j], bf)
		switch {
		case f != nil:
			return "", nil, f
		case !handled:
			return "", nil, invalid(bf+".type", "unsupported block type %q in a tool result: expected text, image, document, search_result or tool_reference", blocks[j].Type)
		}
		if text != "" || blocks[j].Type == "text" {
			texts = append(texts, text)
		}
		imgs = append(imgs, bi...)
	}
	return strings.Join(texts, "\n\n"), imgs, nil
}

// decodeSource decodes a block's source object.
func decodeSource(raw json.RawMessage, field string) (*source, *frontend.Failure) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, invalid(field, "Field required")
	}
	var s source
	if err := json.Unmarshal(raw, &s); err != nil {
		return nil, invalid(field, "expected a source object")
	}
	return &s, nil
}

// image is an image block's image (base64), or the placeholder of one the
// model cannot have (at a URL, or a file of the Files API).
func (c *conversion) image(b *block, field string) (img []byte, omitted string, f *frontend.Failure) {
	src, f := decodeSource(b.Source, field+".source")
	if f != nil {
		return nil, "", f
	}
	switch src.Type {
	case "base64":
	case "url":
		c.drop("image:url")
		return nil, omission("An image at "+src.URL, "the model server does not fetch URLs"), nil
	case "file":
		c.drop("image:file")
		return nil, omission(fmt.Sprintf("An image from Anthropic's Files API (%s)", src.FileID), "its files are not available here"), nil
	default:
		return nil, "", invalid(field+".source.type", "unsupported image source %q: expected base64, url or file", src.Type)
	}
	img, err := decodeBase64(src.Data)
	if err != nil {
		return nil, "", invalid(field+".source.data", "not valid base64")
	}
	return img, "", nil
}

// document is a document block as the model reads it: a text document's
// text (and a content document's images) between <document> tags, or the
// placeholder of a document the model cannot read.
func (c *conversion) document(b *block, field string) (string, [][]byte, *frontend.Failure) {
	src, f := decodeSource(b.Source, field+".source")
	if f != nil {
		return "", nil, f
	}
	var text string
	var imgs [][]byte
	switch src.Type {
	case "text":
		text = src.Data
	case "content":
		content := bytes.TrimSpace(src.Content)
		if len(content) == 0 || bytes.Equal(content, []byte("null")) {
			return "", nil, invalid(field+".source.content", "Field required")
		}
		if text, imgs, f = c.resultContent(content, field+".source.content"); f != nil {
			return "", nil, f
		}
	case "base64":
		if strings.HasPrefix(src.MediaType, "text/") {
			data, err := decodeBase64(src.Data)
			if err != nil {
				return "", nil, invalid(field+".source.data", "not valid base64")
			}
			text = string(data)
			break
		}
		c.drop("document:pdf")
		return omission("A PDF document"+titled(b.Title), "the model here reads text and images, not PDFs"), nil, nil
	case "url":
		c.drop("document:url")
		return omission("The document at "+src.URL+titled(b.Title), "the model server does not fetch URLs"), nil, nil
	case "file":
		c.drop("document:file")
		return omission(fmt.Sprintf("A document from Anthropic's Files API (%s)%s", src.FileID, titled(b.Title)), "its files are not available here"), nil, nil
	default:
		return "", nil, invalid(field+".source.type", "unsupported document source %q: expected text, content, base64, url or file", src.Type)
	}
	return element("document", text, "title", b.Title, "context", b.Context), imgs, nil
}

// searchResult is a search_result block as the model reads it: its text
// blocks between <search_result> tags with its title and source.
func searchResult(b *block, field string) (string, *frontend.Failure) {
	var src string
	if s := bytes.TrimSpace(b.Source); len(s) > 0 && !bytes.Equal(s, []byte("null")) {
		if err := json.Unmarshal(s, &src); err != nil {
			return "", invalid(field+".source", "expected a string")
		}
	}
	content := bytes.TrimSpace(b.Content)
	if len(content) == 0 || bytes.Equal(content, []byte("null")) {
		return "", invalid(field+".content", "Field required")
	}
	blocks, f := decodeBlocks(content, field+".content")
	if f != nil {
		return "", f
	}
	texts := make([]string, 0, len(blocks))
	for j, tb := range blocks {
		if tb.Type != "text" {
			return "", invalid(fmt.Sprintf("%s.content.%d.type", field, j), "unsupported block type %q in a search result: expected text", tb.Type)
		}
		texts = append(texts, tb.Text)
	}
	return element("search_result", strings.Join(texts, "\n\n"), "title", b.Title, "source", src), nil
}

// element is text between tags of name, the opening one with the
// attributes (name, value pairs) whose values are not empty.
func element(name, text string, attrs ...string) string {
	var sb strings.Builder
	sb.WriteString("<" + name)
	for i := 0; i+1 < len(attrs); i += 2 {
		if attrs[i+1] != "" {
			sb.WriteString(" " + attrs[i] + `="` + attrEscaper.Replace(attrs[i+1]) + `"`)
		}
	}
	sb.WriteString(">\n" + text + "\n</" + name + ">")
	return sb.String()
}

// attrEscaper escapes an attribute value so that it cannot end its tag,
// and keeps it on one line.
var attrEscaper = strings.NewReplacer(`&`, "&amp;", `"`, "&quot;", `<`, "&lt;", `>`, "&gt;", "\r\n", " ", "\n", " ", "\r", " ")

// omission is the placeholder of content left out: what it was, and why.
func omission(what, why string) string {
	return "[" + what + " was omitted: " + why + ".]"
}

// titled is a title for an omission: ` ("title")`, or nothing.
func titled(title string) string {
	if title == "" {
		return ""
	}
	return fmt.Sprintf(" (%q)", title)
}

// decodeBase64 decodes padded or unpadded standard base64.
func decodeBase64(s string) ([]byte, error) {
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		b, err = base64.RawStdEncoding.DecodeString(s)
	}
	return b, err
}

// systemTurn converts a system turn's content (a string or blocks): its
// text, the blocks' texts joined by blank lines, and its tool changes,
// gathered in c.
func (c *conversion) systemTurn(raw json.RawMessage, field string) (string, *frontend.Failure) {
	if raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", invalid(field, "not a valid string")
		}
		return s, nil
	}
	blocks, f := decodeBlocks(raw, field)
	if f != nil {
		return "", f
	}
	var texts []string
	for j := range blocks {
		b, bf := &blocks[j], fmt.Sprintf("%s.%d", field, j)
		switch b.Type {
		case "text":
			texts = append(texts, b.Text)
		case "tool_addition", "tool_removal":
			ch, f := parseToolChange(b, bf)
			if f != nil {
				return "", f
			}
			if ch != nil {
				c.changes = append(c.changes, *ch)
			}
		default:
			return "", invalid(bf+".type", "unsupported block type %q in a system turn: expected text, tool_addition or tool_removal", b.Type)
		}
	}
	return strings.Join(texts, "\n\n"), nil
}

// toolChange is one of a system turn's tool changes (Anthropic's
// mid-conversation tool changes, the mid-conversation-tool-changes and
// inline-tools betas): from where it stands, a tool_addition offers a
// tool (one of the request's tools, by name, or one defined by value) and
// a tool_removal withdraws one. The model behind the Edge has one tool
// list for the whole prompt, and answers at the conversation's end, so
// the run's tools are the set in effect there: the request's tools with
// the changes applied in order (applyToolChanges). MCP tools and toolsets
// named by reference are run only by Anthropic's API, whose mcp_servers
// the Edge drops: their changes change nothing here.
type toolChange struct {
	remove bool
	// name is the tool a tool_reference names ("" for an MCP reference
	// or a definition).
	name string
	// def is a tool_definition's tool, and defField where it is.
	def      *tool
	defField string
}

// parseToolChange reads a tool_addition or tool_removal block; nil when
// it changes nothing here (an MCP reference, or a kind of reference this
// package does not know: Anthropic adds them, and one should cost the
// client that change, not the request).
func parseToolChange(b *block, field string) (*toolChange, *frontend.Failure) {
	ref := bytes.TrimSpace(b.Tool)
	if len(ref) == 0 || bytes.Equal(ref, []byte("null")) {
		return nil, invalid(field+".tool", "Field required")
	}
	var r struct {
		Type       string `json:"type"`
		Name       string `json:"name"`
		Definition *tool  `json:"definition"`
	}
	if err := json.Unmarshal(ref, &r); err != nil {
		return nil, invalid(field+".tool", "expected a tool reference or definition object")
	}
	ch := &toolChange{remove: b.Type == "tool_removal"}
	switch r.Type {
	case "tool_reference":
		if r.Name == "" {
			return nil, invalid(field+".tool.name", "Field required")
		}
		ch.name = r.Name
	case "tool_definition":
		if ch.remove {
			return nil, invalid(field+".tool.type", "a tool_removal names a tool; it cannot define one")
		}
		if r.Definition == nil {
			return nil, invalid(field+".tool.definition", "Field required")
		}
		ch.def, ch.defField = r.Definition, field+".tool.definition"
	default: // mcp_tool_reference, mcp_toolset_reference, and what comes next
		return nil, nil
	}
	return ch, nil
}

// applyToolChanges applies changes, in order, to the request's tools as
// toolsOf converted them (run, and the hosted ones the run goes without):
// an addition by name offers again a tool the request declared (already
// offered, it changes nothing; one the request never declared is
// ignored); an addition by definition offers the tool, in place of the
// one of the same name if any (or, a hosted tool, adds it to hosted); a
// removal withdraws the tool of its name from the run.
func applyToolChanges(run []*wirepb.Tool, hosted []string, hostedNames map[string]string, changes []toolChange) (
	[]*wirepb.Tool, []string, map[string]string, *frontend.Failure) {
	if len(changes) == 0 {
		return run, hosted, hostedNames, nil
	}
	known := make(map[string]*wirepb.Tool, len(run)) // every tool declared, by name
	for _, t := range run {
		known[t.Name] = t
	}
	run = slices.Clone(run)
	index := func(name string) int {
		return slices.IndexFunc(run, func(t *wirepb.Tool) bool { return t.Name == name })
	}
	for _, ch := range changes {
		switch {
		case ch.remove:
			if i := index(ch.name); i >= 0 {
				run = slices.Delete(run, i, i+1)
			}
		case ch.def != nil:
			if f := definitionNamed(ch.def, ch.defField); f != nil {
				return nil, nil, nil, f
			}
			tools, h, hn, f := toolsOf(toolList{*ch.def})
			if f != nil {
				return nil, nil, nil, f
			}
			for _, t := range tools {
				known[t.Name] = t
				if i := index(t.Name); i >= 0 {
					run[i] = t
				} else {
					run = append(run, t)
				}
			}
			hosted = append(hosted, h...)
			for name, typ := range hn {
				if hostedNames == nil {
					hostedNames = map[string]string{}
				}
				hostedNames[name] = typ
			}
		default:
			if t, ok := known[ch.name]; ok && index(ch.name) < 0 {
				run = append(run, t)
			}
		}
	}
	return run, hosted, hostedNames, nil
}

// definitionNamed refuses a custom tool definition without a name, named
// where it is (toolsOf would name the request's tools list).
func definitionNamed(t *tool, field string) *frontend.Failure {
	if family, _ := toolFamily(t.Type); (family == "" || family == "custom") && t.Name == "" {
		return invalid(field+".name", "Field required")
	}
	return nil
}
