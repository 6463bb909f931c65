package ollamaapi

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/iop-dev/iop/internal/edge/gateway"
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

// tags answers GET /api/tags: every model the principal may ask for and
// that can be served now (the inventory), with an Ollama server's own entry
// where one serves it, sorted by name.
func (h *handler) tags(w http.ResponseWriter, r *http.Request) {
	h.listing(w, r, routeTags, "/api/tags", false)
}

// ps answers GET /api/ps: the running models of the inventory. A model an
// Ollama server has loaded is listed once per server that has it (two
// processes); a model another kind of server serves is loaded while it is
// served.
func (h *handler) ps(w http.ResponseWriter, r *http.Request) {
	h.listing(w, r, routePS, "/api/ps", true)
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
