package openaiapi

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/iop-dev/iop/internal/edge/edgemetrics"
	"github.com/iop-dev/iop/internal/edge/frontdoor"
	"github.com/iop-dev/iop/internal/edge/frontend"
	ft "github.com/iop-dev/iop/internal/edge/frontend/frontendtest"
)

// Issue 22, planned stops drain: once the Edge stops accepting, a new
// request reaches the official SDK as a 503 server_error edge_stopping with
// Retry-After (its retry policy retries it, and behind a load balancer the
// retry lands on another Edge), while a request that came before is served.
func TestAStoppingEdgeTellsTheOfficialClientToRetry(t *testing.T) {
	f := &ft.Dispatcher{Events: []ft.Step{ft.Text("hello"), ft.Completed("stop")}}
	front := frontend.New(f, testAuth(t), frontend.Options{Metrics: edgemetrics.New(nil, nil),
		Door: frontdoor.New(frontdoor.Limits{MaxRequest: testMaxRequest}, nil)})
	srv := httptest.NewServer(Handler(front))
	t.Cleanup(srv.Close)
	c := openai.NewClient(option.WithBaseURL(srv.URL+"/v1/"), option.WithAPIKey(testKey), option.WithMaxRetries(0))
	params := openai.ChatCompletionNewParams{Model: "m1", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}}
	if _, err := c.Chat.Completions.New(t.Context(), params); err != nil {
		t.Fatalf("before the stop: %v", err)
	}

	front.StopAccepting()
	_, err := c.Chat.Completions.New(t.Context(), params)
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) {
		t.Fatalf("err = %v, want *openai.Error", err)
	}
	if apiErr.StatusCode != http.StatusServiceUnavailable || apiErr.Code != "edge_stopping" || apiErr.Type != "server_error" {
		t.Errorf("status %d type %q code %q message %q", apiErr.StatusCode, apiErr.Type, apiErr.Code, apiErr.Message)
	}
	if ra := apiErr.Response.Header.Get("Retry-After"); ra != "1" {
		t.Errorf("Retry-After %q, want 1", ra)
	}
}
