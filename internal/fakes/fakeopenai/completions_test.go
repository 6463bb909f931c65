package fakeopenai_test

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"

	"github.com/iop-dev/iop/internal/fakes/fakeopenai"
)

// Issue 12: the official client reads the fake's embeddings, batched, with
// dimensions, as floats and as base64 (little-endian float32).
func TestOfficialClientReadsEmbeddings(t *testing.T) {
	s := fakeopenai.Start(fakeopenai.Config{Models: []fakeopenai.Model{{Name: "emb", EmbeddingDims: 12}}})
	defer s.Close()
	c := client(s, "")
	res, err := c.Embeddings.New(t.Context(), openai.EmbeddingNewParams{Model: "emb",
		Input: openai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: []string{"a b", "c"}}})
	if err != nil || len(res.Data) != 2 || res.Data[1].Index != 1 || len(res.Data[0].Embedding) != 12 || res.Usage.PromptTokens != 3 || res.Model != "emb" {
		t.Fatalf("%+v, %v", res, err)
	}
	want := fakeopenai.Vector("emb", "c", 12)
	for i, v := range res.Data[1].Embedding {
		if float32(v) != want[i] {
			t.Fatalf("vector %v, want %v", res.Data[1].Embedding, want)
		}
	}
	res, err = c.Embeddings.New(t.Context(), openai.EmbeddingNewParams{Model: "emb", Dimensions: openai.Int(4),
		EncodingFormat: openai.EmbeddingNewParamsEncodingFormatBase64,
		Input:          openai.EmbeddingNewParamsInputUnion{OfString: openai.String("a b")}})
	if err != nil || len(res.Data) != 1 {
		t.Fatalf("base64: %+v, %v", res, err)
	}
	var b64 string
	if err := json.Unmarshal([]byte(res.Data[0].JSON.Embedding.Raw()), &b64); err != nil {
		t.Fatalf("embedding %s: %v", res.Data[0].JSON.Embedding.Raw(), err)
	}
	raw, _ := base64.StdEncoding.DecodeString(b64)
	var norm float64
	for i := 0; i+4 <= len(raw); i += 4 {
		f := math.Float32frombits(binary.LittleEndian.Uint32(raw[i:]))
		norm += float64(f) * float64(f)
	}
	if len(raw) != 16 || math.Abs(norm-1) > 1e-5 {
		t.Errorf("base64 of %d bytes, length² %v; want 4 float32 of a unit vector", len(raw), norm)
	}
	_, err = c.Embeddings.New(t.Context(), openai.EmbeddingNewParams{Model: "emb", Dimensions: openai.Int(13),
		Input: openai.EmbeddingNewParamsInputUnion{OfString: openai.String("x")}})
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadRequest {
		t.Errorf("more dimensions than the model has: %v", err)
	}
}

// Issue 12: the official client reads the fake's text completions, whole
// and streamed with usage; the suffix reaches the server, and a model
// without fill-in-the-middle refuses it as vLLM does.
func TestOfficialClientReadsCompletions(t *testing.T) {
	s := fakeopenai.Start(fakeopenai.Config{Models: []fakeopenai.Model{
		{Name: "coder", Tokens: []string{"return", " a", " +", " b"}},
		{Name: "plain", Tokens: []string{"x"}, NoSuffix: true},
	}})
	defer s.Close()
	c := client(s, "")
	params := openai.CompletionNewParams{Model: "coder", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("def add(a, b):\n    ")},
		Suffix: openai.String("\nprint(add(1, 2))")}
	res, err := c.Completions.New(t.Context(), params)
	if err != nil || len(res.Choices) != 1 || res.Choices[0].Text != "return a + b" || res.Choices[0].FinishReason != "stop" ||
		res.Usage.CompletionTokens != 4 || res.Object != "text_completion" {
		t.Fatalf("%+v, %v", res, err)
	}
	if !strings.Contains(string(s.Requests()[0].Body), `"suffix":"\nprint(add(1, 2))"`) {
		t.Errorf("recorded %s", s.Requests()[0].Body)
	}

	params.MaxTokens = openai.Int(2)
	params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	stream := c.Completions.NewStreaming(t.Context(), params)
	var text []string
	var finish string
	var usage int64
	for stream.Next() {
		chunk := stream.Current()
		for _, ch := range chunk.Choices {
			text = append(text, ch.Text)
			if ch.FinishReason != "" {
				finish = string(ch.FinishReason)
			}
		}
		usage += chunk.Usage.CompletionTokens
	}
	if err := stream.Err(); err != nil || !slices.Equal(text, []string{"return", " a", ""}) || finish != "length" || usage != 2 {
		t.Errorf("stream %q, finish %q, usage %d, %v", text, finish, usage, err)
	}

	params.Model = "plain"
	_, err = c.Completions.New(t.Context(), params)
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadRequest || !strings.Contains(apiErr.Message, "suffix") {
		t.Errorf("a suffix on a model without it: %v", err)
	}
}
