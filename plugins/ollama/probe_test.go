package ollama

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/iop-dev/iop/internal/fakes/fakeollama"
	"github.com/iop-dev/iop/sdk"
)

// TestProbeMatrix is the exact-target probe's evidence (SPEC R5, R6): only
// clear evidence says unavailable; anything ambiguous is unknown.
func TestProbeMatrix(t *testing.T) {
	cases := []struct {
		name   string
		target string
		setup  func(f *fakeollama.Server)
		want   sdk.HealthStatus
	}{
		{"listed and answering", "llama3.2", nil, sdk.HealthAvailable},
		{"tag spelled out", "llama3.2:latest", nil, sdk.HealthAvailable},
		{"answering while a run is stalled", "stalled", nil, sdk.HealthAvailable},
		{"model not listed", "mistral", nil, sdk.HealthUnavailable},
		{"connection refused", "llama3.2", func(f *fakeollama.Server) { must(t, f.SetMode(fakeollama.ModeRefuse)) }, sdk.HealthUnavailable},
		{"server answers 503", "llama3.2", func(f *fakeollama.Server) { must(t, f.SetMode(fakeollama.ModeUnavailable)) }, sdk.HealthUnavailable},
		{"connection reset", "llama3.2", func(f *fakeollama.Server) { must(t, f.SetMode(fakeollama.ModeReset)) }, sdk.HealthUnknown},
		{"server hangs", "llama3.2", func(f *fakeollama.Server) { must(t, f.SetMode(fakeollama.ModeHang)) }, sdk.HealthUnknown},
		{"model loads slower than the deadline", "slow", nil, sdk.HealthUnknown},
		{"model load fails", "broken", nil, sdk.HealthUnknown},
		{"model load says unavailable", "overloaded", nil, sdk.HealthUnavailable},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake(t,
				fakeollama.Model{Name: "llama3.2"},
				fakeollama.Model{Name: "stalled", Stall: true},
				fakeollama.Model{Name: "slow", LoadDelay: time.Second},
				fakeollama.Model{Name: "broken", FailStatus: 500, FailMessage: "llama runner process has terminated"},
				fakeollama.Model{Name: "overloaded", FailStatus: 503},
			)
			a := newAdapter(t, f.URL(), nil)
			if tc.target == "stalled" {
				// A run holds the model, stalled, while the probe runs.
				runCtx, stopRun := context.WithCancel(context.Background())
				ran := make(chan struct{})
				go func() {
					defer close(ran)
					_, _ = a.Execute(runCtx, userRun("stalled"), &sink{})
				}()
				defer func() { stopRun(); <-ran }()
				if _, err := f.WaitForRequests(ctxTimeout(t, time.Second), 1); err != nil {
					t.Fatal(err)
				}
			}
			if tc.setup != nil {
				tc.setup(f)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			start := time.Now()
			h, err := a.Probe(ctx, tc.target)
			if err != nil {
				t.Fatal(err)
			}
			if h.Status != tc.want || h.Detail == "" {
				t.Fatalf("health %v (%s), want %v", h.Status, h.Detail, tc.want)
			}
			if time.Since(start) > 500*time.Millisecond {
				t.Fatalf("probe took %v, past its deadline", time.Since(start))
			}
		})
	}
}

func TestProbeSendsKeepAliveAndLoadRequest(t *testing.T) {
	f := newFake(t, fakeollama.Model{Name: "llama3.2"})
	a := newAdapter(t, f.URL(), map[string]any{"keep_alive": "30m"})
	if h, _ := a.Probe(ctxTimeout(t, time.Second), "llama3.2"); h.Status != sdk.HealthAvailable {
		t.Fatalf("health %+v", h)
	}
	reqs := f.Requests()
	if len(reqs) != 2 || reqs[0].Path != "/api/tags" || reqs[1].Path != "/api/generate" {
		t.Fatalf("requests %+v", reqs)
	}
	var body map[string]any
	if err := reqs[1].Decode(&body); err != nil {
		t.Fatal(err)
	}
	if body["prompt"] != "" || body["stream"] != false || body["keep_alive"] != "30m" || body["model"] != "llama3.2" {
		t.Fatalf("load request %v", body)
	}
}

func TestProbeMalformedTagsIsUnknown(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte("<html>"))
	}))
	defer srv.Close()
	a := newAdapter(t, srv.URL, nil)
	if h, _ := a.Probe(ctxTimeout(t, time.Second), "m"); h.Status != sdk.HealthUnknown {
		t.Fatalf("health %+v", h)
	}
}

func TestListTargets(t *testing.T) {
	f := newFake(t, fakeollama.Model{Name: "llama3.2"}, fakeollama.Model{Name: "qwen3:8b"})
	a := newAdapter(t, f.URL(), nil)
	targets, err := a.ListTargets(ctxTimeout(t, time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tg := range targets {
		names = append(names, tg.Name)
	}
	if !slices.Equal(names, []string{"llama3.2:latest", "qwen3:8b"}) {
		t.Fatalf("targets %v", names)
	}
	must(t, f.SetMode(fakeollama.ModeRefuse))
	if _, err := a.ListTargets(ctxTimeout(t, time.Second)); sdk.KindOf(err) != sdk.KindUnavailable {
		t.Fatalf("err %v", err)
	}
}

func TestListedMatchesOllamaNames(t *testing.T) {
	models := []listedModel{{Name: "llama3.2:latest"}, {Name: "hf.co/org/model:Q4"}, {Name: "registry:5000/ns/m"}}
	for target, want := range map[string]bool{
		"llama3.2": true, "llama3.2:latest": true, "llama3.2:1b": false,
		"hf.co/org/model:Q4": true, "registry:5000/ns/m": true, "registry:5000/ns/m:latest": true, "": false,
	} {
		if got := listed(models, target); got != want {
			t.Errorf("listed(%q) = %v", target, got)
		}
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
