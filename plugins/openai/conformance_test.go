package openai_test

import (
	"testing"
	"time"

	"github.com/iop-dev/iop/internal/fakes/fakeopenai"
	"github.com/iop-dev/iop/plugins/openai"
	"github.com/iop-dev/iop/sdk"
	"github.com/iop-dev/iop/sdk/sdktest"
)

// The OpenAI-compatible adapter passes the adapter conformance kit through
// the real plugin path, against the fake OpenAI server. (noded's tests run
// the kit on it as a plugin process too.)
func TestOpenAIConforms(t *testing.T) {
	srv := fakeopenai.Start(fakeopenai.Config{Models: []fakeopenai.Model{
		{Name: "gpt-test"},
		{Name: "slow", TokenCount: 1000, Delay: 20 * time.Millisecond},
		{Name: "busy", Fail: &fakeopenai.Failure{Status: 429, Message: "Rate limit reached", Type: "requests", Code: "rate_limit_exceeded"}},
		{Name: "overloaded", Fail: &fakeopenai.Failure{Status: 503, Message: "The server is overloaded"}},
	}})
	t.Cleanup(srv.Close)
	requireKey := func() func() {
		srv.Update(func(c *fakeopenai.Config) { c.APIKey = "sk-conformance" })
		return func() { srv.Update(func(c *fakeopenai.Config) { c.APIKey = "" }) }
	}
	sdktest.Run(t, sdktest.Subject{Adapter: func() sdk.Adapter { return openai.New() }}, sdktest.Options{
		Config:        sdk.MustConfig(map[string]string{"base_url": srv.BaseURL()}),
		Target:        "gpt-test",
		SlowTarget:    "slow",
		UnknownTarget: "no-such-model",
		TunnelPath:    "/models",
		ErrorCases: []sdktest.ErrorCase{
			{Name: "429", Target: "busy", Want: sdk.KindRateLimited},
			{Name: "503", Target: "overloaded", Want: sdk.KindUnavailable},
			{Name: "401 without the key the server wants", Setup: requireKey, Want: sdk.KindUnauthenticated},
		},
	})
}
