package ollama_test

import (
	"testing"
	"time"

	"github.com/iop-dev/iop/internal/fakes/fakeollama"
	"github.com/iop-dev/iop/plugins/ollama"
	"github.com/iop-dev/iop/sdk"
	"github.com/iop-dev/iop/sdk/sdktest"
)

// The Ollama adapter passes the adapter conformance kit through the real
// plugin path, against the fake Ollama. (noded's tests run the kit on it as
// a plugin process too.)
func TestOllamaConforms(t *testing.T) {
	fake := fakeollama.New(
		fakeollama.Model{Name: "llama3.2:latest"},
		fakeollama.Model{Name: "slow:latest", TokenCount: 1000, TokenDelay: 20 * time.Millisecond},
		fakeollama.Model{Name: "busy:latest", FailStatus: 429, FailMessage: "server busy, please try again"},
		fakeollama.Model{Name: "overloaded:latest", FailStatus: 503, FailMessage: "server overloaded"},
		fakeollama.Model{Name: "broken:latest", FailStatus: 500, FailMessage: "llama runner process has terminated"},
	)
	t.Cleanup(fake.Close)
	// mode puts the whole server in m for one error case. (Setup runs in
	// a subtest's goroutine: it reports with Error, not Fatal.)
	mode := func(m fakeollama.Mode) func() func() {
		return func() func() {
			if err := fake.SetMode(m); err != nil {
				t.Errorf("fake mode %v: %v", m, err)
			}
			return func() {
				if err := fake.SetMode(fakeollama.ModeUp); err != nil {
					t.Errorf("fake mode up: %v", err)
				}
			}
		}
	}
	sdktest.Run(t, sdktest.Subject{Adapter: func() sdk.Adapter { return ollama.New() }}, sdktest.Options{
		Config:        sdk.MustConfig(map[string]string{"base_url": fake.URL()}),
		Target:        "llama3.2",
		SlowTarget:    "slow",
		UnknownTarget: "no-such-model",
		TunnelPath:    "/api/version",
		ErrorCases: []sdktest.ErrorCase{
			{Name: "429", Target: "busy", Want: sdk.KindRateLimited},
			{Name: "503", Target: "overloaded", Want: sdk.KindUnavailable},
			{Name: "500", Target: "broken", Want: sdk.KindUpstream},
			{Name: "server-wide 503", Setup: mode(fakeollama.ModeUnavailable), Want: sdk.KindUnavailable},
			{Name: "connection refused", Setup: mode(fakeollama.ModeRefuse), Want: sdk.KindUnavailable},
		},
	})
}
