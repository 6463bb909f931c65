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

	"github.com/iop-dev/iop/internal/edge/auth"
	"github.com/iop-dev/iop/internal/edge/dispatch"
	"github.com/iop-dev/iop/internal/edge/frontend"
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

// version answers GET /api/version with the version of the first Node's
// Ollama that answers.
func (h *handler) version(r *http.Request, _ auth.Principal) (any, *frontend.Failure) {
	replies, failed := h.fanOut(r, routeVersion, "/api/version")
	for _, rep := range replies {
		var v struct {
			Version string `json:"version"`
		}
		if rep.Err == nil && json.Unmarshal(rep.Body, &v) == nil && v.Version != "" {
			return v, nil
		}
	}
	if len(replies) == 0 {
		return nil, frontend.NoProvider("no Ollama provider is connected")
	}
	return nil, frontend.Upstream("no Node answered /api/version: %s", errors.Join(failed...))
}

// fanOut sends GET path to every Node and returns the replies, with Err set
// on each that failed (an error, a status other than 200, or a body that is
// not a JSON object), and those errors, each logged.
func (h *handler) fanOut(r *http.Request, route, path string) (replies []dispatch.MetadataReply, failed []error) {
	ctx, cancel := context.WithTimeout(r.Context(), metadataTimeout)
	defer cancel()
	replies = h.d.Metadata(ctx, Adapter, http.MethodGet, path, maxMetadataBody)
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
			h.front.Logger().LogAttrs(r.Context(), slog.LevelWarn, "ollama metadata call failed", slog.String("route", route),
				slog.String("node", rep.NodeID), slog.String("provider", rep.Provider), slog.String("err", rep.Err.Error()))
		}
	}
	return replies, failed
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
