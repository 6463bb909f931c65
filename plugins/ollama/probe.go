package ollama

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"syscall"

	"github.com/iop-dev/iop/sdk"
)

// maxListBody bounds /api/tags and probe answers.
const maxListBody = 32 << 20

// ListTargets lists the models Ollama has (/api/tags).
func (a *Adapter) ListTargets(ctx context.Context) ([]sdk.Target, error) {
	models, err := a.tags(ctx, a.cfg.Load())
	if err != nil {
		return nil, err
	}
	out := make([]sdk.Target, 0, len(models))
	for _, m := range models {
		out = append(out, sdk.Target{Name: m.Name})
	}
	return out, nil
}

type listedModel struct {
	Name  string `json:"name"`
	Model string `json:"model"`
}

func (a *Adapter) tags(ctx context.Context, s *settings) ([]listedModel, error) {
	req, err := a.newRequest(ctx, s, http.MethodGet, "/api/tags", nil, nil)
	if err != nil {
		return nil, err
	}
	var body struct {
		Models []listedModel `json:"models"`
	}
	if err := a.getJSON(ctx, "tags", req, &body); err != nil {
		return nil, err
	}
	return body.Models, nil
}

// getJSON sends req and decodes a 2xx JSON answer into v.
func (a *Adapter) getJSON(ctx context.Context, op string, req *http.Request, v any) error {
	resp, err := a.client.Do(req)
	if err != nil {
		return sendError(ctx, op, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return statusError(op, resp)
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxListBody)).Decode(v); err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("ollama %s: %w", op, ctx.Err())
		}
		return sdk.Errorf(sdk.KindUpstream, "ollama %s: malformed answer: %v", op, err)
	}
	return nil
}

// Probe checks one exact model: is it there, and is it answering? It is
// available when /api/tags lists it AND a load request for it (Ollama's
// documented empty-prompt /api/generate, which loads the model if needed
// and answers done_reason "load" without generating) answers within ctx.
//
// The load request is chosen over a one-token generation because it does
// not wait for a generation slot: a model busy with a stalled run still
// answers it, so a healthy server is not reported unknown just because the
// stalled run holds its only slot.
//
// The answer is fail-closed: only clear evidence gives Unavailable
// (connection refused, 502/503, the model not listed or not found), and
// anything ambiguous (timeouts, resets, other errors, malformed answers)
// gives Unknown. Probe reports its finding in the Health; it returns no
// error.
func (a *Adapter) Probe(ctx context.Context, target string) (sdk.Health, error) {
	s := a.cfg.Load()
	models, err := a.tags(ctx, s)
	if err != nil {
		return probeFailure(ctx, "tags", err), nil
	}
	if !listed(models, target) {
		return sdk.Health{Status: sdk.HealthUnavailable, Detail: "model not listed by /api/tags"}, nil
	}

	load := struct {
		Model     string          `json:"model"`
		Prompt    string          `json:"prompt"`
		Stream    bool            `json:"stream"`
		KeepAlive json.RawMessage `json:"keep_alive,omitempty"`
	}{Model: target, KeepAlive: s.keepAlive}
	body, _ := json.Marshal(load)
	req, err := a.newRequest(ctx, s, http.MethodPost, "/api/generate", body, nil)
	if err != nil {
		return sdk.Health{Status: sdk.HealthUnknown, Detail: "probe request: " + err.Error()}, nil
	}
	var answer struct {
		Done bool `json:"done"`
	}
	if err := a.getJSON(ctx, "probe", req, &answer); err != nil {
		return probeFailure(ctx, "load", err), nil
	}
	if !answer.Done {
		return sdk.Health{Status: sdk.HealthUnknown, Detail: "load request answered without done"}, nil
	}
	return sdk.Health{Status: sdk.HealthAvailable, Detail: "listed and answering"}, nil
}

// probeFailure classifies a failed probe step, fail-closed.
func probeFailure(ctx context.Context, step string, err error) sdk.Health {
	switch {
	case ctx.Err() != nil:
		return sdk.Health{Status: sdk.HealthUnknown, Detail: step + ": no answer within the probe deadline"}
	case errors.Is(err, syscall.ECONNREFUSED):
		return sdk.Health{Status: sdk.HealthUnavailable, Detail: step + ": connection refused"}
	}
	var se *sdk.Error
	if errors.As(err, &se) {
		switch se.UpstreamStatus {
		case http.StatusBadGateway, http.StatusServiceUnavailable:
			return sdk.Health{Status: sdk.HealthUnavailable, Detail: fmt.Sprintf("%s: status %d", step, se.UpstreamStatus)}
		case http.StatusNotFound:
			if se.Kind == sdk.KindModelNotFound {
				return sdk.Health{Status: sdk.HealthUnavailable, Detail: step + ": model not found"}
			}
		}
		if se.UpstreamStatus != 0 {
			return sdk.Health{Status: sdk.HealthUnknown, Detail: fmt.Sprintf("%s: status %d", step, se.UpstreamStatus)}
		}
	}
	return sdk.Health{Status: sdk.HealthUnknown, Detail: step + ": " + err.Error()}
}

// listed reports whether target is among models, reading a name without a
// tag as ":latest", as Ollama does.
func listed(models []listedModel, target string) bool {
	want := withTag(target)
	if want == "" {
		return false
	}
	for _, m := range models {
		if withTag(m.Name) == want || withTag(m.Model) == want {
			return true
		}
	}
	return false
}

func withTag(name string) string {
	if name == "" || strings.Contains(name[strings.LastIndex(name, "/")+1:], ":") {
		return name
	}
	return name + ":latest"
}
