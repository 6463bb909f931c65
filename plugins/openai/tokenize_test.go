package openai_test

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/iop-dev/iop/plugins/openai"
	"github.com/iop-dev/iop/sdk"
)

// tokenServer is a model server of the test's own that records what it is
// asked (path and body) and answers with answer.
type tokenServer struct {
	*httptest.Server
	mu   sync.Mutex
	seen []string // "path body"
}

func newTokenServer(t *testing.T, answer func(path, body string) (int, string)) *tokenServer {
	t.Helper()
	s := &tokenServer{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if r.Header.Get("Authorization") != "Bearer sk-count" {
			http.Error(w, `{"error":{"message":"no key"}}`, http.StatusUnauthorized)
			return
		}
		s.mu.Lock()
		s.seen = append(s.seen, r.URL.Path+" "+string(b))
		s.mu.Unlock()
		status, out := answer(r.URL.Path, string(b))
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		io.WriteString(w, out)
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *tokenServer) requests() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.seen)
}

// vllm answers /tokenize as vLLM does: a count (and the tokens).
func vllm(count string) func(path, body string) (int, string) {
	return func(path, _ string) (int, string) {
		if path != "/tokenize" {
			return 404, `{"detail":"Not Found"}`
		}
		return 200, `{"count":` + count + `,"max_model_len":8192,"tokens":[1,2,3]}`
	}
}

// llamaCpp answers as llama.cpp's server does: /tokenize reads only
// content (one token a word here, and a BOS when add_special), and
// /apply-template renders the messages' contents.
func llamaCpp(path, body string) (int, string) {
	var req struct {
		Content    *string `json:"content"`
		AddSpecial bool    `json:"add_special"`
		Messages   []struct {
			Role    string `json:"role"`
			Content any    `json:"content"`
		} `json:"messages"`
	}
	json.Unmarshal([]byte(body), &req)
	switch path {
	case "/tokenize":
		tokens := []int{}
		if req.Content != nil {
			if req.AddSpecial {
				tokens = append(tokens, 1)
			}
			for range strings.Fields(*req.Content) {
				tokens = append(tokens, 7)
			}
		}
		b, _ := json.Marshal(map[string]any{"tokens": tokens})
		return 200, string(b)
	case "/apply-template":
		var prompt []string
		for _, m := range req.Messages {
			s, _ := m.Content.(string)
			prompt = append(prompt, "<|"+m.Role+"|> "+s)
		}
		b, _ := json.Marshal(map[string]string{"prompt": strings.Join(prompt, " ") + " <|assistant|>"})
		return 200, string(b)
	}
	return 404, `{"error":{"code":404,"message":"File Not Found","type":"not_found_error"}}`
}

// countRun is a chat with every kind of message, a tool, an image, and
// chat_template_kwargs among Extra's fields.
func countRun() *sdk.Request {
	return &sdk.Request{Target: "m", Credential: &sdk.Credential{Kind: "bearer", Secret: "sk-count"},
		Messages: []sdk.Message{
			{Role: "system", Content: "be brief"},
			{Role: "user", Content: "what is this?", Images: [][]byte{png}},
			{Role: "assistant", ToolCalls: []sdk.ToolCall{{ID: "c1", Name: "look", Arguments: `{"x":1}`}}},
			{Role: "tool", ToolCallID: "c1", Content: "a cat"},
		},
		Tools: []sdk.Tool{{Name: "look", Parameters: json.RawMessage(`{"type":"object"}`)}},
		Options: sdk.Options{Extra: json.RawMessage(`{"chat_template_kwargs":{"enable_thinking":false},"top_k":20}`),
			MaxTokens: ptr(int64(9))},
	}
}

const (
	countMessages = `"messages":[{"role":"system","content":"be brief"},` +
		`{"role":"user","content":[{"type":"text","text":"what is this?"},{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgoAAAANSUhEUg=="}}]},` +
		`{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"look","arguments":"{\"x\":1}"}}]},` +
		`{"role":"tool","content":"a cat","tool_call_id":"c1"}]`
	countMessagesNoImage = `"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"what is this?"},` +
		`{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"look","arguments":"{\"x\":1}"}}]},` +
		`{"role":"tool","content":"a cat","tool_call_id":"c1"}]`
	countTools = `"tools":[{"type":"function","function":{"name":"look","parameters":{"type":"object"}}}]`
)

// Issue 21: on vLLM a count is one POST /tokenize at the server's root
// with the chat as vLLM templates it (messages with images, tools,
// chat_template_kwargs, the generation prompt) and the run's credential;
// the answer's count is the count. The dialect is remembered: the next
// count is one request too.
func TestCountTokensOnVLLM(t *testing.T) {
	srv := newTokenServer(t, vllm("321"))
	a := configured(t, srv.URL+"/v1")
	for range 2 {
		n, err := a.CountTokens(t.Context(), countRun())
		if err != nil || n != 321 {
			t.Fatalf("count %d, %v; want 321", n, err)
		}
	}
	want := `/tokenize {"add_generation_prompt":true,"chat_template_kwargs":{"enable_thinking":false},` + countMessages + `,"model":"m",` + countTools + `}`
	got := srv.requests()
	if len(got) != 2 || got[0] != want || got[1] != want {
		t.Errorf("requests\n got %q\nwant two of %s", got, want)
	}
}

// Issue 21: a raw completion's prompt and suffix are tokenized each on
// vLLM (the suffix without a prompt's special tokens), and summed.
func TestCountTokensOfARawCompletionOnVLLM(t *testing.T) {
	srv := newTokenServer(t, vllm("5"))
	req := &sdk.Request{Target: "coder", Prompt: "def add(a, b):", Suffix: "print(add(1, 2))", Credential: &sdk.Credential{Secret: "sk-count"}}
	n, err := configured(t, srv.URL+"/v1").CountTokens(t.Context(), req)
	if err != nil || n != 10 {
		t.Fatalf("count %d, %v; want 10", n, err)
	}
	want := []string{
		`/tokenize {"model":"coder","prompt":"def add(a, b):"}`,
		`/tokenize {"add_special_tokens":false,"model":"coder","prompt":"print(add(1, 2))"}`,
	}
	if got := srv.requests(); !slices.Equal(got, want) {
		t.Errorf("requests\n got %q\nwant %q", got, want)
	}
}

// Issue 21: llama.cpp's server answers vLLM's /tokenize with no tokens and
// no count; the adapter then templates the chat with /apply-template
// (without images, which it does not render) and tokenizes the prompt as
// a chat completion's, BOS added and special tokens parsed. The dialect is
// remembered: the next count skips vLLM's request.
func TestCountTokensOnLlamaCpp(t *testing.T) {
	srv := newTokenServer(t, llamaCpp)
	a := configured(t, srv.URL+"/v1")
	// "<|system|> be brief <|user|> what is this? <|assistant|> <|tool|> a cat <|assistant|>": 12 words and the BOS.
	for range 2 {
		n, err := a.CountTokens(t.Context(), countRun())
		if err != nil || n != 13 {
			t.Fatalf("count %d, %v; want 13", n, err)
		}
	}
	probe := `/tokenize {"add_generation_prompt":true,"chat_template_kwargs":{"enable_thinking":false},` + countMessages + `,"model":"m",` + countTools + `}`
	template := `/apply-template {"chat_template_kwargs":{"enable_thinking":false},` + countMessagesNoImage + `,"model":"m",` + countTools + `}`
	tokenize := `/tokenize {"add_special":true,"content":"\u003c|system|\u003e be brief \u003c|user|\u003e what is this? \u003c|assistant|\u003e  \u003c|tool|\u003e a cat \u003c|assistant|\u003e","model":"m","parse_special":true}`
	want := []string{probe, template, tokenize, template, tokenize}
	if got := srv.requests(); !slices.Equal(got, want) {
		t.Errorf("requests\n got %q\nwant %q", got, want)
	}

	raw := &sdk.Request{Target: "m", Prompt: "a b c", Suffix: "d e", Credential: &sdk.Credential{Secret: "sk-count"}}
	if n, err := a.CountTokens(t.Context(), raw); err != nil || n != 6 {
		t.Errorf("a raw completion: count %d, %v; want 6 (BOS, 3 and 2 words)", n, err)
	}
}

// Issue 21: a server without a tokenize endpoint (404 not about the
// model, 405, 501) cannot count: unsupported, ErrNoTokenizer, remembered
// until the adapter is configured again. A failure that tells nothing of
// the server (down, an unknown model, a refused key) is returned as it is
// and not remembered.
func TestCountTokensWithoutATokenizer(t *testing.T) {
	for _, status := range []int{404, 405, 501} {
		srv := newTokenServer(t, func(string, string) (int, string) { return status, `{"error":{"message":"Not Found"}}` })
		a := configured(t, srv.URL+"/v1")
		for range 2 {
			_, err := a.CountTokens(t.Context(), countRun())
			if !errors.Is(err, sdk.ErrUnsupported) || !errors.Is(err, openai.ErrNoTokenizer) {
				t.Fatalf("%d: err %v, want unsupported ErrNoTokenizer", status, err)
			}
		}
		if n := len(srv.requests()); n != 1 {
			t.Errorf("%d: %d requests, want 1 (remembered)", status, n)
		}
		if err := a.Configure(t.Context(), sdk.MustConfig(map[string]any{"base_url": srv.URL + "/v1"})); err != nil {
			t.Fatal(err)
		}
		a.CountTokens(t.Context(), countRun())
		if n := len(srv.requests()); n != 2 {
			t.Errorf("%d: %d requests after Configure, want 2 (asked again)", status, n)
		}
	}

	var mu sync.Mutex
	fail := []string{`503 {"error":{"message":"loading"}}`, `404 {"error":{"message":"The model m does not exist.","code":"model_not_found"}}`}
	srv := newTokenServer(t, func(path, body string) (int, string) {
		mu.Lock()
		defer mu.Unlock()
		if len(fail) > 0 {
			f := fail[0]
			fail = fail[1:]
			return map[byte]int{'5': 503, '4': 404}[f[0]], f[4:]
		}
		return vllm("8")(path, body)
	})
	a := configured(t, srv.URL+"/v1")
	if _, err := a.CountTokens(t.Context(), countRun()); !errors.Is(err, sdk.ErrUnavailable) {
		t.Errorf("503: %v", err)
	}
	if _, err := a.CountTokens(t.Context(), countRun()); !errors.Is(err, sdk.ErrModelNotFound) {
		t.Errorf("unknown model: %v", err)
	}
	req := countRun()
	req.Credential = nil
	if _, err := a.CountTokens(t.Context(), req); !errors.Is(err, sdk.ErrUnauthenticated) {
		t.Errorf("no key: %v", err)
	}
	if n, err := a.CountTokens(t.Context(), countRun()); err != nil || n != 8 {
		t.Errorf("then: count %d, %v; want 8", n, err)
	}
}

// Issue 21: the tokenize endpoints are at the server's root: base_url
// without its "/v1", or base_url itself when it has none.
func TestCountTokensAtTheServersRoot(t *testing.T) {
	for _, base := range []string{"/v1", "/v1/", "", "/gw/vllm/v1"} {
		srv := newTokenServer(t, func(path, body string) (int, string) {
			return vllm("1")(strings.TrimPrefix(path, "/gw/vllm"), body)
		})
		if _, err := configured(t, srv.URL+base).CountTokens(t.Context(), countRun()); err != nil {
			t.Errorf("base_url %q: %v", base, err)
		}
	}
}

// Issue 21: the adapter reports count_tokens: capabilities are described
// before its server is known.
func TestOpenAIReportsCountTokens(t *testing.T) {
	if caps := sdk.Capabilities(openai.New()); !slices.Contains(caps, sdk.CapCountTokens) {
		t.Errorf("capabilities %v", caps)
	}
	if _, err := openai.New().CountTokens(t.Context(), countRun()); sdk.KindOf(err) != sdk.KindInternal {
		t.Errorf("before Configure: %v", err)
	}
}
