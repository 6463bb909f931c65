package openai

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"slices"

	"github.com/iop-dev/iop/sdk"
)

// maxModelsBody bounds the /models answer.
const maxModelsBody = 8 << 20

// ListTargets lists the models of GET {base_url}/models. It carries no
// credential (the call is not part of a run): a server that requires a key
// for it answers 401, returned as an unauthenticated error.
func (a *Adapter) ListTargets(ctx context.Context) ([]sdk.Target, error) {
	ids, err := a.models(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]sdk.Target, len(ids))
	for i, id := range ids {
		out[i] = sdk.Target{Name: id}
	}
	return out, nil
}

func (a *Adapter) models(ctx context.Context) ([]string, error) {
	c, err := a.config()
	if err != nil {
		return nil, err
	}
	req, err := c.newRequest(ctx, http.MethodGet, "/models", nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := a.client.Do(req)
	if err != nil {
		return nil, transportError(ctx, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, httpError(resp)
	}
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxModelsBody)).Decode(&list); err != nil {
		if ctx.Err() != nil {
			return nil, transportError(ctx, err)
		}
		return nil, &sdk.Error{Kind: sdk.KindUpstream, Message: "openai: malformed /models answer: " + err.Error()}
	}
	ids := make([]string, 0, len(list.Data))
	for _, m := range list.Data {
		if m.ID != "" {
			ids = append(ids, m.ID)
		}
	}
	return ids, nil
}

// Probe checks that target is listed by GET {base_url}/models. A clear
// answer is available (listed) or unavailable (the server answered without
// it, refused the connection, or said it is down with 502/503/504);
// anything unclear — a timeout, a refused credential (the probe carries
// none), another error status, a malformed list — is unknown. Only a
// missing configuration is an error.
func (a *Adapter) Probe(ctx context.Context, target string) (sdk.Health, error) {
	if _, err := a.config(); err != nil {
		return sdk.Health{}, err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, probeTimeout)
		defer cancel()
	}
	ids, err := a.models(ctx)
	if err == nil {
		if slices.Contains(ids, target) {
			return sdk.Health{Status: sdk.HealthAvailable, Detail: "target listed by /models"}, nil
		}
		return sdk.Health{Status: sdk.HealthUnavailable, Detail: "target not listed by /models"}, nil
	}
	if ctx.Err() != nil {
		return sdk.Health{Status: sdk.HealthUnknown, Detail: "probe timed out"}, nil
	}
	var e *sdk.Error
	if !errors.As(err, &e) {
		return sdk.Health{Status: sdk.HealthUnknown, Detail: "probe failed"}, nil
	}
	switch {
	case e.Kind == sdk.KindUnavailable && e.UpstreamStatus == 0:
		return sdk.Health{Status: sdk.HealthUnavailable, Detail: "server unreachable"}, nil
	case e.Kind == sdk.KindUnavailable:
		return sdk.Health{Status: sdk.HealthUnavailable, Detail: "server answered " + http.StatusText(e.UpstreamStatus)}, nil
	case e.UpstreamStatus != 0:
		return sdk.Health{Status: sdk.HealthUnknown, Detail: "/models answered " + http.StatusText(e.UpstreamStatus)}, nil
	}
	return sdk.Health{Status: sdk.HealthUnknown, Detail: "unclear /models answer"}, nil
}
