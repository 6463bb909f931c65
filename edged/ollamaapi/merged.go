package ollamaapi

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/iop-dev/iop/edged/auth"
	"github.com/iop-dev/iop/edged/gateway"
)

// Limits of the read-only calls fanned out to every Node.
const (
	// maxMetadataBody bounds one Node's answer; a longer one is cut and
	// so counts as failed.
	maxMetadataBody = 8 << 20
	// metadataTimeout bounds the whole fan-out, so that one Node that
	// does not answer cannot hold a listing forever; it counts as failed.
	metadataTimeout = 10 * time.Second
)

// modelList is the body of /api/tags and /api/ps: entries are kept as the
// Nodes sent them, so fields this package does not know pass through.
type modelList struct {
	Models []json.RawMessage `json:"models"`
}

// entry is one model of a list with the name it is listed under.
type entry struct {
	name string
	raw  json.RawMessage
}

// tags answers GET /api/tags: every ready Node's models, the first Node's
// entry winning for a name more than one has, without those the principal
// may not ask for (by the name the client would send), sorted by name.
func (h *handler) tags(w http.ResponseWriter, r *http.Request) {
	h.merged(w, r, routeTags, "/api/tags", true)
}

// ps answers GET /api/ps: every ready Node's running models. A model loaded
// on two Nodes is two entries, as it is two processes.
func (h *handler) ps(w http.ResponseWriter, r *http.Request) {
	h.merged(w, r, routePS, "/api/ps", false)
}

// merged fans path out to every Node and answers the merged lists. Nodes
// that fail are left out and logged; if every one fails (and there is at
// least one), the answer is 502, since an empty list would say that no
// model exists.
func (h *handler) merged(w http.ResponseWriter, r *http.Request, route, path string, dedupe bool) {
	p, ok := h.authenticate(w, r, route)
	if !ok {
		return
	}
	replies, failed := h.fanOut(r, route, path)
	if len(replies) > 0 && len(failed) == len(replies) {
		h.fail(w, r, route, &apiError{status: http.StatusBadGateway, code: "upstream",
			message: fmt.Sprintf("no Node answered %s: %s", path, errors.Join(failed...))})
		return
	}
	var all []entry
	seen := map[string]bool{}
	for _, rep := range replies {
		var list modelList
		if rep.Err != nil || json.Unmarshal(rep.Body, &list) != nil {
			continue // logged by fanOut
		}
		for _, raw := range list.Models {
			name := entryName(raw)
			if name == "" || (dedupe && seen[name]) || !h.allowed(p, name) {
				continue
			}
			seen[name] = true
			all = append(all, entry{name: name, raw: raw})
		}
	}
	slices.SortStableFunc(all, func(a, b entry) int { return cmp.Compare(a.name, b.name) })
	out := modelList{Models: make([]json.RawMessage, 0, len(all))}
	for _, e := range all {
		out.Models = append(out.Models, e.raw)
	}
	writeJSON(w, http.StatusOK, out)
	h.count(route, "ok")
}

// version answers GET /api/version with the version of the first Node's
// Ollama that answers.
func (h *handler) version(w http.ResponseWriter, r *http.Request) {
	if _, ok := h.authenticate(w, r, routeVersion); !ok {
		return
	}
	replies, failed := h.fanOut(r, routeVersion, "/api/version")
	for _, rep := range replies {
		var v struct {
			Version string `json:"version"`
		}
		if rep.Err == nil && json.Unmarshal(rep.Body, &v) == nil && v.Version != "" {
			writeJSON(w, http.StatusOK, v)
			h.count(routeVersion, "ok")
			return
		}
	}
	if len(replies) == 0 {
		h.fail(w, r, routeVersion, &apiError{status: http.StatusServiceUnavailable, code: "no_candidate",
			message: "no Ollama provider is connected"})
		return
	}
	h.fail(w, r, routeVersion, &apiError{status: http.StatusBadGateway, code: "upstream",
		message: fmt.Sprintf("no Node answered /api/version: %s", errors.Join(failed...))})
}

// fanOut sends GET path to every Node and returns the replies, with Err set
// on each that failed (an error, a status other than 200, or a body that is
// not a JSON object), and those errors, each logged.
func (h *handler) fanOut(r *http.Request, route, path string) (replies []gateway.MetadataReply, failed []error) {
	ctx, cancel := context.WithTimeout(r.Context(), metadataTimeout)
	defer cancel()
	replies = h.runner.Metadata(ctx, http.MethodGet, path, maxMetadataBody)
	for i := range replies {
		rep := &replies[i]
		switch {
		case rep.Err != nil:
		case rep.Status != http.StatusOK:
			rep.Err = fmt.Errorf("status %d: %s", rep.Status, strings.TrimSpace(string(rep.Body[:min(len(rep.Body), 200)])))
		case !json.Valid(rep.Body) || !strings.HasPrefix(strings.TrimSpace(string(rep.Body)), "{"):
			rep.Err = errors.New("the answer is not a JSON object")
		}
		if rep.Err != nil {
			rep.Err = fmt.Errorf("node %s provider %s: %w", rep.NodeID, rep.Provider, rep.Err)
			failed = append(failed, rep.Err)
			h.log.LogAttrs(r.Context(), slog.LevelWarn, "ollama metadata call failed", slog.String("route", route),
				slog.String("node", rep.NodeID), slog.String("provider", rep.Provider), slog.String("err", rep.Err.Error()))
		}
	}
	return replies, failed
}

// fail answers e and records it.
func (h *handler) fail(w http.ResponseWriter, r *http.Request, route string, e *apiError) {
	writeError(w, e)
	h.count(route, e.code)
	h.log.LogAttrs(r.Context(), slog.LevelInfo, "ollama metadata", slog.String("route", route),
		slog.String("outcome", e.code), slog.String("err", e.message))
}

// entryName is the name a list entry is listed under: "name", or "model"
// for an entry without one.
func entryName(raw json.RawMessage) string {
	var n struct {
		Name  string `json:"name"`
		Model string `json:"model"`
	}
	if json.Unmarshal(raw, &n) != nil {
		return ""
	}
	return cmp.Or(n.Name, n.Model)
}

// allowed reports whether p may ask for model.
func (h *handler) allowed(p auth.Principal, model string) bool {
	_, err := h.runner.Profile(p, model)
	return err == nil
}
