package openai_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/iop-dev/iop/internal/fakes/fakeopenai"
	"github.com/iop-dev/iop/sdk"
)

func TestListTargetsReadsModels(t *testing.T) {
	s := startFake(t, fakeopenai.Config{Models: []fakeopenai.Model{{Name: "qwen"}, {Name: "llama"}}})
	got, err := configured(t, s.BaseURL()).ListTargets(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Name != "qwen" || got[1].Name != "llama" {
		t.Errorf("targets = %+v", got)
	}
	if p := s.Requests()[0].Path; p != "/v1/models" {
		t.Errorf("path = %s", p)
	}
}

func TestListTargetsOnKeyedServerIsUnauthenticated(t *testing.T) {
	s := startFake(t, fakeopenai.Config{APIKey: "k", Models: []fakeopenai.Model{{Name: "m"}}})
	_, err := configured(t, s.BaseURL()).ListTargets(t.Context())
	if !errors.Is(err, sdk.ErrUnauthenticated) {
		t.Errorf("err = %v", err)
	}
}

func TestProbeIsAvailableOnlyOnAClearYes(t *testing.T) {
	models := []fakeopenai.Model{{Name: "m"}}
	refused := httptest.NewServer(http.NotFoundHandler())
	refusedURL := refused.URL + "/v1"
	refused.Close()
	malformed := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Write([]byte("<html>proxy</html>"))
	}))
	defer malformed.Close()

	tests := []struct {
		name    string
		baseURL func(t *testing.T) string
		target  string
		timeout time.Duration
		want    sdk.HealthStatus
	}{
		{"target listed", fakeURL(fakeopenai.Config{Models: models}), "m", 0, sdk.HealthAvailable},
		{"target not listed", fakeURL(fakeopenai.Config{Models: models}), "other", 0, sdk.HealthUnavailable},
		{"connection refused", func(*testing.T) string { return refusedURL }, "m", 0, sdk.HealthUnavailable},
		{"server says 503", fakeURL(fakeopenai.Config{Models: models, ModelsFail: &fakeopenai.Failure{Status: 503}}), "m", 0, sdk.HealthUnavailable},
		{"server says 500", fakeURL(fakeopenai.Config{Models: models, ModelsFail: &fakeopenai.Failure{Status: 500}}), "m", 0, sdk.HealthUnknown},
		{"key required", fakeURL(fakeopenai.Config{APIKey: "k", Models: models}), "m", 0, sdk.HealthUnknown},
		{"no answer in time", fakeURL(fakeopenai.Config{Models: models, ModelsDelay: time.Minute}), "m", 50 * time.Millisecond, sdk.HealthUnknown},
		{"malformed list", func(*testing.T) string { return malformed.URL + "/v1" }, "m", 0, sdk.HealthUnknown},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := t.Context()
			if tt.timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tt.timeout)
				defer cancel()
			}
			h, err := configured(t, tt.baseURL(t)).Probe(ctx, tt.target)
			if err != nil {
				t.Fatal(err)
			}
			if h.Status != tt.want || h.Detail == "" {
				t.Errorf("health = %v (%q), want %v", h.Status, h.Detail, tt.want)
			}
		})
	}
}
