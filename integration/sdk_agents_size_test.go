package integration

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/iop-dev/iop/internal/fakes/fakeollama"
)

// bigImage is an image whose base64 data URL is 24 MiB: a few
// screenshots' worth of a coding session, far past what one frame
// carries (1 MiB).
type bigImage struct {
	url  string // data:image/png;base64,...
	size int    // the image's bytes
	// b64sum is the SHA-256 of the image's base64 text (the adapter sends
	// Ollama the image in standard base64, which is one text for one
	// image, so the same text is the whole image, in order).
	b64sum [32]byte
}

const bigImagePrefix = "data:image/png;base64,"

// newBigImage makes the image: a PNG signature, then bytes no compression
// could shrink and no misplaced part of which could go unnoticed.
func newBigImage() bigImage {
	const size = 18 << 20 // 24 MiB in base64
	raw := make([]byte, size)
	copy(raw, "\x89PNG\r\n\x1a\n")
	_, _ = rand.NewChaCha8([32]byte{21}).Read(raw[8:])
	b64 := base64.StdEncoding.EncodeToString(raw)
	return bigImage{url: bigImagePrefix + b64, size: size, b64sum: sha256.Sum256([]byte(b64))}
}

// sdkImageSent returns the base64 text of the first image in an Ollama chat
// request body, found by its place rather than by decoding the body: a
// race-instrumented decode of 24 MiB of JSON takes seconds, and the
// adapter writes compact JSON whose base64 needs no escapes.
func sdkImageSent(body []byte) ([]byte, bool) {
	const key = `"images":["`
	i := bytes.Index(body, []byte(key))
	if i < 0 {
		return nil, false
	}
	rest := body[i+len(key):]
	end := bytes.IndexByte(rest, '"')
	if end < 0 {
		return nil, false
	}
	return rest[:end], true
}

// Issue 21, P3, P7: requests as large as sessions get. A 24 MiB chat
// request (the official OpenAI SDK, text and a 24 MiB base64 image) goes
// through edged, across the QUIC hop in parts, through noded and the ollama
// adapter's plugin process, and the fake Ollama gets the whole image; the
// answer streams back. A 40 MiB request, past the Edge's limit
// (limits.max_request_mib, default 32), is 413 request_too_large naming
// the limit in bytes, while a run streaming on the same Edge completes
// untouched and the next request is answered.
func TestA24MiBImageRequestAnsweredAndOnePastTheLimitRefused(t *testing.T) {
	const (
		seeing  = "A picture of noise."
		slowLen = 40
	)
	s := startStack(t, fakeollama.Model{Name: "llava:latest", Text: seeing},
		fakeollama.Model{Name: "slow:latest", TokenCount: slowLen, TokenDelay: 25 * time.Millisecond})
	c := s.openai()
	img := newBigImage()

	began := time.Now()
	stream := c.Chat.Completions.NewStreaming(t.Context(), openai.ChatCompletionNewParams{Model: "llava",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage([]openai.ChatCompletionContentPartUnionParam{
			openai.TextContentPart("What is in this picture?"),
			openai.ImageContentPart(openai.ChatCompletionContentPartImageImageURLParam{URL: img.url}),
		})}})
	var answer strings.Builder
	chunks := 0
	var finish string
	for stream.Next() {
		chunks++
		if ch := stream.Current().Choices; len(ch) > 0 {
			answer.WriteString(ch[0].Delta.Content)
			if ch[0].FinishReason != "" {
				finish = ch[0].FinishReason
			}
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("the 24 MiB request: %v", err)
	}
	if answer.String() != seeing || finish != "stop" || chunks < 3 {
		t.Errorf("answer %q in %d chunks, finish %q; want %q streamed", answer.String(), chunks, finish, seeing)
	}
	t.Logf("the 24 MiB request was answered in %v", time.Since(began))

	var sent [][]byte
	for _, r := range s.fake.Requests() {
		if r.Path == "/api/chat" && strings.HasPrefix(r.Model, "llava") {
			if b64, ok := sdkImageSent(r.Body); ok {
				sent = append(sent, b64)
			}
		}
	}
	if len(sent) != 1 || base64.StdEncoding.DecodedLen(len(sent[0])) != img.size || sha256.Sum256(sent[0]) != img.b64sum {
		var sizes []int
		for _, b := range sent {
			sizes = append(sizes, len(b))
		}
		t.Fatalf("the fake Ollama got images of %v base64 bytes; want one, the image of %d bytes, whole", sizes, img.size)
	}

	// A run that is streaming while a request past the limit is refused.
	slow := c.Chat.Completions.NewStreaming(t.Context(), openai.ChatCompletionNewParams{Model: "slow",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("count slowly")}})
	if !slow.Next() {
		t.Fatalf("the slow run: %v", slow.Err())
	}

	// The 40 MiB request: the image and 16 MiB of text. Its body is
	// written out here, not by the SDK's encoder, which takes seconds for
	// it under the race detector; the SDK still sends it and reads the
	// error.
	var body bytes.Buffer
	body.WriteString(`{"model":"llava","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"`)
	body.WriteString(img.url)
	body.WriteString(`"}},{"type":"text","text":"`)
	body.Write(bytes.Repeat([]byte("log line "), 16<<20/9))
	body.WriteString(`"}]}]}`)
	if body.Len() < 40<<20 {
		t.Fatalf("the large request is only %d bytes", body.Len())
	}
	_, err := c.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{},
		option.WithRequestBody("application/json", body.Bytes()))
	var apiErr *openai.Error
	limit := strconv.Itoa(32 << 20)
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusRequestEntityTooLarge || apiErr.Code != "request_too_large" ||
		!strings.Contains(apiErr.Message, limit) {
		t.Fatalf("a 40 MiB request: %v; want 413 request_too_large naming the limit, %s bytes", err, limit)
	}

	slowChunks := 1
	for slow.Next() {
		slowChunks++
	}
	if err := slow.Err(); err != nil || slowChunks < slowLen {
		t.Errorf("the run streaming beside the refusal: %d chunks, %v", slowChunks, err)
	}
	small, err := c.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{Model: "llava",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("and now?")}})
	if err != nil || small.Choices[0].Message.Content != seeing {
		t.Errorf("the request after the refusal: %v", err)
	}
}
