package ollamaapi

import (
	"bytes"
	"encoding/json"
	"slices"

	"github.com/iop-dev/iop/internal/edge/frontend"
	"github.com/iop-dev/iop/internal/edge/sched"
)

// peekModel reads the model a body names, in "model" (for show, Ollama's
// deprecated "name" too), and whether the answer streams (Ollama's
// default), before the principal's right to the model is checked and the
// rest is decoded: two strings are all this decode allocates, however
// large the body.
func peekModel(nameToo bool) func(body []byte) (frontend.Peek, *frontend.Failure) {
	return func(body []byte) (frontend.Peek, *frontend.Failure) {
		if len(bytes.TrimSpace(body)) == 0 {
			return frontend.Peek{}, invalid("missing request body")
		}
		var named struct {
			Model  string `json:"model"`
			Name   string `json:"name"`
			Stream *bool  `json:"stream"`
		}
		if err := json.Unmarshal(body, &named); err != nil {
			return frontend.Peek{}, invalid("%s", err.Error())
		}
		p := frontend.Peek{Model: named.Model, Stream: named.Stream == nil || *named.Stream}
		if p.Model == "" && nameToo {
			p.Model = named.Name
		}
		if p.Model == "" {
			return frontend.Peek{}, invalid("model is required")
		}
		return p, nil
	}
}

// translate is route's translation: through the raw tunnel exactly when
// an Ollama server is among the model's candidates now (tunnel.go); any
// other model runs as a normalized run (run.go), an embedding call
// (embed.go) or, for show, what the Edge knows (listings.go), on whatever
// provider serves it. A model no candidate serves now is not tunnelled, so
// that its refusal (404 unknown, 503 unavailable) considers every
// provider.
func (h *handler) translate(route string) func(t *frontend.Turn) (frontend.Job, *frontend.Failure) {
	return func(t *frontend.Turn) (frontend.Job, *frontend.Failure) {
		if slices.ContainsFunc(t.Candidates(), func(c sched.Candidate) bool { return c.Adapter == Adapter }) {
			return tunnelJob(t, route), nil
		}
		switch route {
		case routeChat, routeGenerate:
			return runJob(t, route)
		case routeEmbed, routeEmbeddings:
			return embedJob(t, route)
		}
		return h.show(t), nil
	}
}
