package fakeopenai_test

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"

	"github.com/iop-dev/iop/internal/fakes/fakeopenai"
)

func sseData(t *testing.T, resp *http.Response) []string {
	t.Helper()
	var data []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			data = append(data, v)
		}
	}
	return data
}

// postJSON posts body to url and decodes the answer into out; it returns
// the status and the raw answer.
func postJSON(t *testing.T, url, body string, out any) (int, string) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if out != nil {
		_ = json.Unmarshal(b, out)
	}
	return resp.StatusCode, string(b)
}

// conversation is a chat's messages as JSON and as the official client's
// params, the same messages.
const conversation = `[{"role":"system","content":"You are a helpful assistant."},
	{"role":"user","content":[{"type":"text","text":"What is"},{"type":"text","text":"the capital of France?"}]},
	{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]},
	{"role":"tool","tool_call_id":"c1","content":"Paris, as always"}]`

func promptTokens(t *testing.T, s *fakeopenai.Server, model string) int64 {
	t.Helper()
	var msgs []openai.ChatCompletionMessageParamUnion
	if err := json.Unmarshal([]byte(conversation), &msgs); err != nil {
		t.Fatal(err)
	}
	c := client(s, "")
	res, err := c.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{Model: model, Messages: msgs})
	if err != nil {
		t.Fatal(err)
	}
	return res.Usage.PromptTokens
}

// Issue 21, P7 (count_tokens): as vLLM, the fake tokenizes messages or a prompt with
// POST /tokenize, and its count of a chat's messages is the prompt_tokens
// it reports for them; an unknown model is vLLM's 404.
func TestVLLMTokenizeCountsWhatUsageReports(t *testing.T) {
	s := fakeopenai.Start(fakeopenai.Config{Tokenize: fakeopenai.TokenizeVLLM,
		Models: []fakeopenai.Model{{Name: "qwen", ContextLength: 131072}, {Name: "small"}}})
	defer s.Close()
	var out struct {
		Count       int       `json:"count"`
		MaxModelLen int       `json:"max_model_len"`
		Tokens      []int     `json:"tokens"`
		TokenStrs   *[]string `json:"token_strs"`
	}
	status, raw := postJSON(t, s.URL()+"/tokenize", `{"model":"qwen","messages":`+conversation+`}`, &out)
	if status != 200 || out.Count == 0 || out.Count != len(out.Tokens) || out.MaxModelLen != 131072 || out.TokenStrs != nil ||
		!strings.Contains(raw, `"token_strs":null`) {
		t.Fatalf("%d %s", status, raw)
	}
	if usage := promptTokens(t, s, "qwen"); int64(out.Count) != usage {
		t.Fatalf("tokenize counted %d, usage says %d", out.Count, usage)
	}

	status, raw = postJSON(t, s.URL()+"/tokenize", `{"prompt":"Hello, world again","return_token_strs":true}`, &out)
	if status != 200 || out.Count != 3 || out.MaxModelLen != 131072 || out.TokenStrs == nil ||
		strings.Join(*out.TokenStrs, "") != "Hello, world again" {
		t.Fatalf("prompt: %d %s", status, raw)
	}
	if _, _ = postJSON(t, s.URL()+"/tokenize", `{"model":"small","prompt":"x"}`, &out); out.MaxModelLen != 32768 {
		t.Fatalf("default context %d", out.MaxModelLen)
	}

	var e struct {
		Error struct {
			Message string  `json:"message"`
			Type    string  `json:"type"`
			Param   *string `json:"param"`
			Code    int     `json:"code"`
		} `json:"error"`
	}
	status, raw = postJSON(t, s.URL()+"/tokenize", `{"model":"nope","prompt":"x"}`, &e)
	if status != 404 || e.Error.Message != "The model `nope` does not exist." || e.Error.Type != "NotFoundError" || e.Error.Code != 404 ||
		e.Error.Param == nil || *e.Error.Param != "model" {
		t.Fatalf("unknown model: %d %s", status, raw)
	}
	if status, raw = postJSON(t, s.URL()+"/tokenize", `{"model":"qwen"}`, nil); status != 400 {
		t.Fatalf("neither prompt nor messages: %d %s", status, raw)
	}
	if status, _ = postJSON(t, s.URL()+"/apply-template", `{"messages":[]}`, nil); status != 404 {
		t.Fatalf("vLLM has no /apply-template: %d", status)
	}
}

// Issue 21, P7 (count_tokens): as llama.cpp, the fake renders messages with
// POST /apply-template and tokenizes content with POST /tokenize; the two
// together count what usage reports for the messages.
func TestLlamaCppApplyTemplateThenTokenize(t *testing.T) {
	s := fakeopenai.Start(fakeopenai.Config{Tokenize: fakeopenai.TokenizeLlamaCpp, Models: []fakeopenai.Model{{Name: "gguf"}}})
	defer s.Close()
	var tmpl struct {
		Prompt string `json:"prompt"`
	}
	if status, raw := postJSON(t, s.URL()+"/apply-template", `{"messages":`+conversation+`}`, &tmpl); status != 200 || tmpl.Prompt == "" {
		t.Fatalf("apply-template: %d %s", status, raw)
	}
	body, _ := json.Marshal(map[string]any{"content": tmpl.Prompt})
	var toks struct {
		Tokens []int `json:"tokens"`
	}
	if status, raw := postJSON(t, s.URL()+"/tokenize", string(body), &toks); status != 200 || len(toks.Tokens) == 0 {
		t.Fatalf("tokenize: %d %s", status, raw)
	}
	if usage := promptTokens(t, s, "gguf"); int64(len(toks.Tokens)) != usage {
		t.Fatalf("apply-template and tokenize counted %d, usage says %d", len(toks.Tokens), usage)
	}

	var pieces struct {
		Tokens []struct {
			ID    int    `json:"id"`
			Piece string `json:"piece"`
		} `json:"tokens"`
	}
	postJSON(t, s.URL()+"/tokenize", `{"content":"Hello world","with_pieces":true,"add_special":true}`, &pieces)
	if len(pieces.Tokens) != 2 || pieces.Tokens[0].Piece != "Hello" || pieces.Tokens[1].Piece != " world" || pieces.Tokens[0].ID == pieces.Tokens[1].ID {
		t.Fatalf("pieces %+v", pieces)
	}
	if _, raw := postJSON(t, s.URL()+"/tokenize", `{}`, nil); raw != `{"tokens":[]}`+"\n" {
		t.Fatalf("no content: %q", raw)
	}
	var e struct {
		Error struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
			Type    string `json:"type"`
		} `json:"error"`
	}
	if status, raw := postJSON(t, s.URL()+"/apply-template", `{}`, &e); status != 400 || e.Error.Message != "'messages' is required" ||
		e.Error.Type != "invalid_request_error" || e.Error.Code != 400 {
		t.Fatalf("no messages: %d %s", status, raw)
	}
}

func TestNoTokenizeAPIByDefault(t *testing.T) {
	s := fakeopenai.Start(fakeopenai.Config{Models: []fakeopenai.Model{{Name: "m"}}})
	defer s.Close()
	for _, path := range []string{"/tokenize", "/apply-template"} {
		if status, _ := postJSON(t, s.URL()+path, `{"prompt":"x"}`, nil); status != 404 {
			t.Errorf("%s: %d", path, status)
		}
	}
}
