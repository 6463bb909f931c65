package openai

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/iop-dev/iop/sdk"
)

// Token counts (sdk.TokenCounter). OpenAI's API has no way to count a chat
// prompt's tokens, but the servers most run behind an Edge do, each its own
// way, beside the OpenAI API at the server's root (base_url without its
// "/v1"):
//
//   - vLLM: POST /tokenize with {"model", "messages", "tools",
//     "add_generation_prompt": true} applies the model's chat template and
//     answers {"count", "max_model_len", "tokens"}; with {"model",
//     "prompt"} it tokenizes raw text.
//   - llama.cpp's server: POST /apply-template with a chat request's
//     {"messages", "tools"} answers {"prompt"}, the templated text, which
//     POST /tokenize with {"content", "add_special": true,
//     "parse_special": true} turns into {"tokens": [...]} as a chat
//     completion's prompt is tokenized. Both carry "model", by which a
//     llama.cpp server in router mode (several models) routes them.
//
// Which one a server speaks is learnt from its answer to the first count,
// sent as vLLM's: vLLM answers with a count; llama.cpp's /tokenize, which
// reads only "content", answers {"tokens": []}, and the count is made again
// its way; a server that has no /tokenize (404 that is not about the model,
// 405, 501) cannot count. The dialect is kept until the adapter is
// configured again; a failure that says nothing about the server (it is
// down, refused the key, or refused the request) is not kept.
//
// The count is exact for the text: messages, tool calls, tool results and
// the tools, with the chat template and the chat_template_kwargs of
// Options.Extra, since templates read them (Qwen's enable_thinking). vLLM
// counts images as the model reads them; llama.cpp's template endpoint
// renders no images, so they are left out of its count (an Edge that needs
// them counted estimates them). A raw completion's prompt and suffix are
// tokenized each; the few tokens a server's fill-in-the-middle template
// adds between them are not counted.
//
// The adapter reports the count_tokens capability whatever its server:
// capabilities are described before the server is known (sdk.Capabilities
// reads the adapter's type). A server that cannot count fails the count
// with KindUnsupported, ErrNoTokenizer.

// ErrNoTokenizer is the cause (errors.Is, in the adapter's process) of a
// count that the server cannot make: it has neither vLLM's nor llama.cpp's
// tokenize endpoints.
var ErrNoTokenizer = errors.New("the server has no tokenize endpoint the adapter knows (vLLM's or llama.cpp's)")

// tokenizer is a server's way to count tokens, as learnt (config.tokenizer).
type tokenizer int32

const (
	tokenizerUnknown tokenizer = iota
	tokenizerVLLM
	tokenizerLlamaCpp
	tokenizerNone
)

// maxTokenizeBody bounds a tokenize answer: a token list of a few million
// ids.
const maxTokenizeBody = 32 << 20

// CountTokens counts the tokens of req's prompt with the server's own
// tokenizer (see above).
func (a *Adapter) CountTokens(ctx context.Context, req *sdk.Request) (int64, error) {
	c, err := a.config()
	if err != nil {
		return 0, err
	}
	if req.Target == "" {
		return 0, sdk.Errorf(sdk.KindInvalidRequest, "openai: the count names no target model")
	}
	switch tokenizer(c.tokenizer.Load()) {
	case tokenizerVLLM:
		n, _, err := a.countVLLM(ctx, c, req)
		return n, err
	case tokenizerLlamaCpp:
		return a.countLlamaCpp(ctx, c, req)
	case tokenizerNone:
		return 0, noTokenizer()
	}
	n, t, err := a.countVLLM(ctx, c, req)
	if t != tokenizerUnknown {
		c.tokenizer.Store(int32(t))
	}
	switch t {
	case tokenizerLlamaCpp:
		return a.countLlamaCpp(ctx, c, req)
	case tokenizerNone:
		return 0, noTokenizer()
	}
	return n, err
}

func noTokenizer() error {
	return &sdk.Error{Kind: sdk.KindUnsupported, Err: ErrNoTokenizer, Message: "openai: cannot count tokens: " + ErrNoTokenizer.Error()}
}

// countVLLM counts through vLLM's /tokenize, and says which tokenizer the
// answer shows: vLLM's (a count), llama.cpp's (a token list without a
// count: llama.cpp's /tokenize ignored vLLM's request), none (no such
// endpoint), or unknown (a failure that tells nothing).
func (a *Adapter) countVLLM(ctx context.Context, c *config, req *sdk.Request) (int64, tokenizer, error) {
	bodies, err := vllmBodies(req, c.systemTurns)
	if err != nil {
		return 0, tokenizerUnknown, err
	}
	var total int64
	for _, body := range bodies {
		var answer struct {
			Count  *int64          `json:"count"`
			Tokens json.RawMessage `json:"tokens"`
		}
		if err := a.tokenizeCall(ctx, c, "/tokenize", body, req.Credential, &answer); err != nil {
			if errors.Is(err, ErrNoTokenizer) {
				return 0, tokenizerNone, noTokenizer()
			}
			return 0, tokenizerUnknown, err
		}
		switch {
		case answer.Count != nil:
			total += *answer.Count
		case len(answer.Tokens) > 0:
			return 0, tokenizerLlamaCpp, nil
		default:
			return 0, tokenizerNone, noTokenizer()
		}
	}
	return total, tokenizerVLLM, nil
}

// vllmBodies are the /tokenize requests that count req on vLLM: the chat,
// or a raw completion's prompt and its suffix (tokenized without the
// special tokens a prompt starts with).
func vllmBodies(req *sdk.Request, turns systemTurns) ([]map[string]any, error) {
	if len(req.Messages) == 0 {
		bodies := []map[string]any{{"model": req.Target, "prompt": req.Prompt}}
		if req.Suffix != "" {
			bodies = append(bodies, map[string]any{"model": req.Target, "prompt": req.Suffix, "add_special_tokens": false})
		}
		return bodies, nil
	}
	body, err := chatTemplateBody(req, turns, true)
	if err != nil {
		return nil, err
	}
	body["model"] = req.Target
	body["add_generation_prompt"] = true
	return []map[string]any{body}, nil
}

// countLlamaCpp counts through llama.cpp's /apply-template and /tokenize.
func (a *Adapter) countLlamaCpp(ctx context.Context, c *config, req *sdk.Request) (int64, error) {
	texts := []string{req.Prompt, req.Suffix}
	if len(req.Messages) > 0 {
		body, err := chatTemplateBody(req, c.systemTurns, false)
		if err != nil {
			return 0, err
		}
		body["model"] = req.Target // llama.cpp's router mode routes by it
		var templated struct {
			Prompt *string `json:"prompt"`
		}
		if err := a.tokenizeCall(ctx, c, "/apply-template", body, req.Credential, &templated); err != nil {
			return 0, err
		}
		if templated.Prompt == nil {
			return 0, sdk.Errorf(sdk.KindUpstream, "openai: llama.cpp's /apply-template answered without a prompt")
		}
		texts = []string{*templated.Prompt}
	}
	var total int64
	for i, text := range texts {
		if i > 0 && text == "" {
			continue
		}
		// As llama.cpp tokenizes a prompt: its special tokens (BOS) added
		// once, at the start, and special tokens in the text read as such.
		body := map[string]any{"model": req.Target, "content": text, "add_special": i == 0, "parse_special": true}
		var answer struct {
			Tokens []json.RawMessage `json:"tokens"`
		}
		if err := a.tokenizeCall(ctx, c, "/tokenize", body, req.Credential, &answer); err != nil {
			return 0, err
		}
		total += int64(len(answer.Tokens))
	}
	return total, nil
}

// chatTemplateBody is the part of a chat request that a chat template
// reads: the messages as the run sends them (their system turns as turns
// says, with their images when withImages), the tools, and Extra's
// chat_template_kwargs.
func chatTemplateBody(req *sdk.Request, turns systemTurns, withImages bool) (map[string]any, error) {
	msgs, err := wireMessages(req.Messages, turns, withImages)
	if err != nil {
		return nil, err
	}
	body := map[string]any{"messages": msgs}
	if len(req.Tools) > 0 {
		tools, err := wireTools(req.Tools)
		if err != nil {
			return nil, err
		}
		body["tools"] = tools
	}
	var extra struct {
		ChatTemplateKwargs json.RawMessage `json:"chat_template_kwargs"`
	}
	if len(req.Options.Extra) > 0 && json.Unmarshal(req.Options.Extra, &extra) == nil && !isNullJSON(extra.ChatTemplateKwargs) {
		body["chat_template_kwargs"] = extra.ChatTemplateKwargs
	}
	return body, nil
}

// tokenizeCall posts body as JSON to path at the server's root and decodes
// its answer into v. A server without the endpoint fails with
// ErrNoTokenizer.
func (a *Adapter) tokenizeCall(ctx context.Context, c *config, path string, body map[string]any, cred *sdk.Credential, v any) error {
	b, err := json.Marshal(body)
	if err != nil {
		return sdk.Errorf(sdk.KindInvalidRequest, "openai: encode %s request: %w", path, err)
	}
	resp, err := a.postTo(ctx, c, c.rootEndpoint(path), b, cred, "application/json")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return tokenizeError(resp, path)
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxTokenizeBody)).Decode(v); err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("openai: %w", ctx.Err())
		}
		return sdk.Errorf(sdk.KindUpstream, "openai: malformed %s answer: %v", path, err)
	}
	return nil
}

// tokenizeError maps an error answer of a tokenize endpoint as httpError
// does, except that a server without it (405, 501, or a 404 that is not
// about the model) fails with ErrNoTokenizer.
func tokenizeError(resp *http.Response, path string) error {
	err := httpError(resp)
	var e *sdk.Error
	if !errors.As(err, &e) {
		return err
	}
	switch {
	case resp.StatusCode == http.StatusMethodNotAllowed, resp.StatusCode == http.StatusNotImplemented,
		resp.StatusCode == http.StatusNotFound && !strings.Contains(strings.ToLower(e.Message), "model"):
		return fmt.Errorf("openai: %s: %w", path, ErrNoTokenizer)
	}
	return e
}

func isNullJSON(v json.RawMessage) bool {
	s := strings.TrimSpace(string(v))
	return s == "" || s == "null"
}
