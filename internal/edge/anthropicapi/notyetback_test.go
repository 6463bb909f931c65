package anthropicapi

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/shared"

	"github.com/iop-dev/iop/internal/edge/dispatch"
	ft "github.com/iop-dev/iop/internal/edge/frontend/frontendtest"
)

// Issue 26: a model served before the Edge restarted, whose Nodes are not
// back yet, reaches the official SDK as a 503 overloaded_error with
// Retry-After (its retry policy retries it), not the not_found_error of a
// 404; it is listed.
func TestOfficialClientIsToldToRetryAModelNotYetBack(t *testing.T) {
	c, _ := officialClient(t, &ft.Dispatcher{NotYetBack: []string{"m1"},
		Offerings: []dispatch.Offering{{ID: "m1", Reconnecting: true}}})
	params := anthropic.MessageNewParams{Model: "m1", MaxTokens: 8,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))}}
	_, err := c.Messages.New(t.Context(), params)
	stream := c.Messages.NewStreaming(t.Context(), params)
	for stream.Next() {
		t.Error("an event of a refused request was delivered")
	}
	for _, err := range []error{err, stream.Err()} {
		var apiErr *anthropic.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusServiceUnavailable || apiErr.Type() != shared.ErrorTypeOverloadedError ||
			!strings.Contains(apiErr.Error(), "reconnecting") {
			t.Fatalf("err = %v, want *anthropic.Error 503 overloaded_error saying the Nodes are reconnecting", err)
		}
		if ra := apiErr.Response.Header.Get("Retry-After"); ra != "1" {
			t.Errorf("Retry-After %q, want 1", ra)
		}
	}
	page, err := c.Models.List(t.Context(), anthropic.ModelListParams{})
	if err != nil || len(page.Data) != 1 || page.Data[0].ID != "m1" {
		t.Errorf("a model not yet back is not listed: %+v %v", page, err)
	}
}
