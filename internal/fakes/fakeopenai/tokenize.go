package fakeopenai

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	"github.com/iop-dev/iop/internal/fakes/fakemodel"
)

// TokenizeAPI is the tokenize API the fake serves, so that a test chooses
// the server it pretends to be. Both count with the fake's one tokenizer
// (fakemodel.Words), so a count of a chat's messages equals the
// prompt_tokens the fake reports for them.
type TokenizeAPI int

const (
	// TokenizeNone serves no tokenize endpoint (404), as OpenAI's API.
	TokenizeNone TokenizeAPI = iota
	// TokenizeVLLM serves vLLM's POST /tokenize: {"model", "messages"} or
	// {"model", "prompt"} → {"count", "max_model_len", "tokens",
	// "token_strs"}; token_strs is null unless return_token_strs. The
	// fake's tokenizer has no BOS: add_special_tokens changes nothing.
	TokenizeVLLM
	// TokenizeLlamaCpp serves llama.cpp's POST /apply-template
	// ({"messages"} → {"prompt"}) and POST /tokenize ({"content"} →
	// {"tokens": [ids]}, or [{"id", "piece"}] with with_pieces).
	TokenizeLlamaCpp
)

// defaultContextLength is a model's context when it sets none.
const defaultContextLength = 32768

// vllmTokenizeRequest is the union of vLLM's TokenizeCompletionRequest and
// TokenizeChatRequest, as far as the fake reads them.
type vllmTokenizeRequest struct {
	Model           string          `json:"model"`
	Prompt          *string         `json:"prompt"`
	Messages        json.RawMessage `json:"messages"`
	ReturnTokenStrs bool            `json:"return_token_strs"`
}

// vllmTokenize answers vLLM's /tokenize: the tokens of the prompt, or of
// the messages as the fake's chat template renders them (which adds no
// tokens: see templatePrompt).
func (s *Server) vllmTokenize(w http.ResponseWriter, r *http.Request, cfg Config) {
	var req vllmTokenizeRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		vllmError(w, http.StatusBadRequest, "BadRequestError", "", "JSON decode error: "+err.Error())
		return
	}
	ctxLen := defaultContextLength
	if len(cfg.Models) > 0 {
		ctxLen = cfg.Models[0].contextLength()
	}
	if req.Model != "" {
		m, ok := cfg.model(req.Model)
		if !ok {
			vllmError(w, http.StatusNotFound, "NotFoundError", "model", fmt.Sprintf("The model `%s` does not exist.", req.Model))
			return
		}
		ctxLen = m.contextLength()
	}
	var text string
	switch {
	case len(req.Messages) > 0 && string(req.Messages) != "null":
		var msgs []chatMessage
		if err := json.Unmarshal(req.Messages, &msgs); err != nil {
			vllmError(w, http.StatusBadRequest, "BadRequestError", "messages", "messages: "+err.Error())
			return
		}
		text = templatePrompt(msgs)
	case req.Prompt != nil:
		text = *req.Prompt
	default:
		vllmError(w, http.StatusBadRequest, "BadRequestError", "", "Either `prompt` or `messages` should be provided.")
		return
	}
	words := fakemodel.Words(text)
	out := struct {
		Count       int      `json:"count"`
		MaxModelLen int      `json:"max_model_len"`
		Tokens      []int    `json:"tokens"`
		TokenStrs   []string `json:"token_strs"`
	}{Count: len(words), MaxModelLen: ctxLen, Tokens: ids(words)}
	if req.ReturnTokenStrs {
		out.TokenStrs = pieces(words)
	}
	writeJSON(w, http.StatusOK, out)
}

// vllmError writes vLLM's error body: {"error": {"message", "type",
// "param", "code"}} with the status as the code.
func vllmError(w http.ResponseWriter, status int, typ, param, msg string) {
	type info struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    int     `json:"code"`
	}
	e := info{Message: msg, Type: typ, Code: status}
	if param != "" {
		e.Param = &param
	}
	writeJSON(w, status, struct {
		Error info `json:"error"`
	}{e})
}

// applyTemplate answers llama.cpp's /apply-template with the messages as
// the fake's chat template renders them.
func (s *Server) applyTemplate(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Messages json.RawMessage `json:"messages"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		llamaError(w, http.StatusBadRequest, err.Error())
		return
	}
	if len(req.Messages) == 0 {
		llamaError(w, http.StatusBadRequest, "'messages' is required")
		return
	}
	var msgs []chatMessage
	if err := json.Unmarshal(req.Messages, &msgs); err != nil {
		llamaError(w, http.StatusBadRequest, "Expected 'messages' to be an array")
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"prompt": templatePrompt(msgs)})
}

// llamaTokenize answers llama.cpp's /tokenize: the ids of the content's
// tokens, or {id, piece} objects with with_pieces (a piece keeps the
// space before its word). The fake's tokenizer has no special tokens:
// add_special and parse_special change nothing. No content is no tokens,
// as in llama.cpp.
func (s *Server) llamaTokenize(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Content    *string `json:"content"`
		WithPieces bool    `json:"with_pieces"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		llamaError(w, http.StatusBadRequest, err.Error())
		return
	}
	var words []string
	if req.Content != nil {
		words = fakemodel.Words(*req.Content)
	}
	if !req.WithPieces {
		writeJSON(w, http.StatusOK, map[string][]int{"tokens": ids(words)})
		return
	}
	type piece struct {
		ID    int    `json:"id"`
		Piece string `json:"piece"`
	}
	out := []piece{}
	for i, p := range pieces(words) {
		out = append(out, piece{ID: fakemodel.ID(words[i]), Piece: p})
	}
	writeJSON(w, http.StatusOK, map[string][]piece{"tokens": out})
}

// llamaError writes llama.cpp's error body: {"error": {"code", "message",
// "type"}}.
func llamaError(w http.ResponseWriter, status int, msg string) {
	type info struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
		Type    string `json:"type"`
	}
	writeJSON(w, status, struct {
		Error info `json:"error"`
	}{info{Code: status, Message: msg, Type: "invalid_request_error"}})
}

// templatePrompt is the fake's chat template: each message's text on its
// own line. It adds no tokens of its own, so that tokenizing the rendered
// prompt counts what the fake reports as a chat's prompt_tokens (a real
// template's role markers are tokens, and a real server counts them in
// both).
func templatePrompt(msgs []chatMessage) string {
	texts := make([]string, len(msgs))
	for i, m := range msgs {
		texts[i] = messageText(m.Content)
	}
	return strings.Join(texts, "\n")
}

// ids are the token ids of words.
func ids(words []string) []int {
	out := make([]int, len(words))
	for i, w := range words {
		out[i] = fakemodel.ID(w)
	}
	return out
}

// pieces are words as token strings: each after the first with the space
// before it, as tokenizers write a word's token.
func pieces(words []string) []string {
	out := make([]string, len(words))
	for i, w := range words {
		if i > 0 {
			w = " " + w
		}
		out[i] = w
	}
	return out
}

func (m Model) contextLength() int {
	if m.ContextLength > 0 {
		return m.ContextLength
	}
	return defaultContextLength
}
