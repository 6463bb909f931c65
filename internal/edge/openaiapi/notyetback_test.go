package openaiapi

import (
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"

	"github.com/iop-dev/iop/internal/edge/dispatch"
	ft "github.com/iop-dev/iop/internal/edge/frontend/frontendtest"
)

// Issue 26: a model served before the Edge restarted, whose Nodes are not
// back yet, reaches the official SDK as a 503 server_error with
// Retry-After and the code model_not_ready (its retry policy retries it),
// not the not-found error it raises for a 404; it is listed, so that a
// client that lists and then asks is told to retry.
func TestOfficialClientIsToldToRetryAModelNotYetBack(t *testing.T) {
	c, _ := officialClient(t, &ft.Dispatcher{NotYetBack: []string{"m1"},
		Offerings: []dispatch.Offering{{ID: "m1", Reconnecting: true}}})
	params := openai.ChatCompletionNewParams{Model: "m1", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}}
	_, err := c.Chat.Completions.New(t.Context(), params)
	stream := c.Chat.Completions.NewStreaming(t.Context(), params)
	for stream.Next() {
		t.Error("an event of a refused request was delivered")
	}
	_, embedErr := c.Embeddings.New(t.Context(), openai.EmbeddingNewParams{Model: "m1",
		Input: openai.EmbeddingNewParamsInputUnion{OfString: openai.String("hi")}})
	for _, err := range []error{err, stream.Err(), embedErr} {
		var apiErr *openai.Error
		if !errors.As(err, &apiErr) {
			t.Fatalf("err = %v, want *openai.Error", err)
		}
		if apiErr.StatusCode != http.StatusServiceUnavailable || apiErr.Code != "model_not_ready" || apiErr.Type != "server_error" ||
			!strings.Contains(apiErr.Message, "reconnecting") {
			t.Errorf("status %d type %q code %q message %q", apiErr.StatusCode, apiErr.Type, apiErr.Code, apiErr.Message)
		}
		if ra := apiErr.Response.Header.Get("Retry-After"); ra != "1" {
			t.Errorf("Retry-After %q, want 1", ra)
		}
	}
	page, err := c.Models.List(t.Context())
	if err != nil || !slices.ContainsFunc(page.Data, func(m openai.Model) bool { return m.ID == "m1" }) {
		t.Errorf("a model not yet back is not listed: %+v %v", page, err)
	}
	if m, err := c.Models.Get(t.Context(), "m1"); err != nil || m.ID != "m1" {
		t.Errorf("a model not yet back: %+v %v", m, err)
	}
}
