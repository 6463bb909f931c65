package anthropicapi

import (
	"net/http"
	"sort"
	"strconv"
	"time"

	"github.com/iop-dev/iop/internal/edge/gateway"
)

// Model listing limits, as Anthropic's: a page holds 20 models unless the
// client asks for up to 1000.
const (
	defaultPageSize = 20
	maxPageSize     = 1000
)

// modelInfo is one model, in Anthropic's shape. The Edge does not know
// when a model was released: created_at is the Unix epoch, as the OpenAI
// API's created is 0.
type modelInfo struct {
	Type        string    `json:"type"`
	ID          string    `json:"id"`
	DisplayName string    `json:"display_name"`
	CreatedAt   time.Time `json:"created_at"`
}

func newModelInfo(m gateway.Model) modelInfo {
	return modelInfo{Type: "model", ID: m.ID, DisplayName: m.ID, CreatedAt: time.Unix(0, 0).UTC()}
}

// modelPage is one page of the list.
type modelPage struct {
	Data    []modelInfo `json:"data"`
	HasMore bool        `json:"has_more"`
	FirstID *string     `json:"first_id"`
	LastID  *string     `json:"last_id"`
}

// models lists the models the principal may ask for (the gateway's
// inventory, sorted by id, SPEC P1), a page at a time: limit, and the
// after_id or before_id cursors, as Anthropic pages them.
func (h *handler) models(w http.ResponseWriter, r *http.Request) {
	p, ok := h.authenticate(w, r, routeModels)
	if !ok {
		return
	}
	q := r.URL.Query()
	limit := defaultPageSize
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > maxPageSize {
			writeError(w, invalid("limit", "must be an integer from 1 to %d", maxPageSize))
			h.count(routeModels, "invalid_request")
			return
		}
		limit = n
	}
	all := h.runner.Models(p) // sorted by id
	// first is the position of the first model whose id is above id (or,
	// with the id's own, at or above it).
	first := func(id string, own bool) int {
		return sort.Search(len(all), func(i int) bool { return all[i].ID > id || own && all[i].ID == id })
	}
	var from, to int
	var more bool
	if id := q.Get("before_id"); id != "" {
		to = first(id, true)
		from = max(0, to-limit)
		more = from > 0
	} else {
		if id := q.Get("after_id"); id != "" {
			from = first(id, false)
		}
		to = min(len(all), from+limit)
		more = to < len(all)
	}
	page := modelPage{Data: []modelInfo{}, HasMore: more}
	for _, m := range all[from:to] {
		page.Data = append(page.Data, newModelInfo(m))
	}
	if n := len(page.Data); n > 0 {
		page.FirstID, page.LastID = &page.Data[0].ID, &page.Data[n-1].ID
	}
	writeJSON(w, http.StatusOK, page)
	h.count(routeModels, "ok")
}

// model answers GET /v1/models/{model}.
func (h *handler) model(w http.ResponseWriter, r *http.Request) {
	p, ok := h.authenticate(w, r, routeModels)
	if !ok {
		return
	}
	id := r.PathValue("model")
	for _, m := range h.runner.Models(p) {
		if m.ID == id {
			writeJSON(w, http.StatusOK, newModelInfo(m))
			h.count(routeModels, "ok")
			return
		}
	}
	writeError(w, modelNotFound(id))
	h.count(routeModels, "model_not_found")
}
