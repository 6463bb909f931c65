package anthropicapi

import (
	"net/http"
	"sort"
	"strconv"
	"time"

	"github.com/iop-dev/iop/internal/edge/dispatch"
	"github.com/iop-dev/iop/internal/edge/frontend"
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

func newModelInfo(id string) modelInfo {
	return modelInfo{Type: "model", ID: id, DisplayName: id, CreatedAt: time.Unix(0, 0).UTC()}
}

// modelPage is one page of the list.
type modelPage struct {
	Data    []modelInfo `json:"data"`
	HasMore bool        `json:"has_more"`
	FirstID *string     `json:"first_id"`
	LastID  *string     `json:"last_id"`
}

// modelsPage is a page of the models of the inventory (sorted by id, SPEC
// P1): limit, and the after_id or before_id cursors, as Anthropic pages
// them.
func modelsPage(r *http.Request, all []dispatch.Offering) (any, *frontend.Failure) {
	q := r.URL.Query()
	limit := defaultPageSize
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > maxPageSize {
			return nil, invalid("limit", "must be an integer from 1 to %d", maxPageSize)
		}
		limit = n
	}
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
	for _, o := range all[from:to] {
		page.Data = append(page.Data, newModelInfo(o.ID))
	}
	if n := len(page.Data); n > 0 {
		page.FirstID, page.LastID = &page.Data[0].ID, &page.Data[n-1].ID
	}
	return page, nil
}
