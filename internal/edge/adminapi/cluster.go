package adminapi

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/iop-dev/iop/internal/edge/cluster"
)

// Cluster is the cluster as the admin reads show it: *cluster.Cluster when
// a cluster is configured, *cluster.Single for an Edge alone (itself, from
// memory).
type Cluster interface {
	// View is every Edge and, for every Node, the Edges it is connected
	// to.
	View(ctx context.Context) cluster.View
	// Usage is the usage ledger's totals over a window.
	Usage(ctx context.Context, q cluster.UsageQuery) (cluster.UsageReport, error)
}

var (
	_ Cluster = (*cluster.Cluster)(nil)
	_ Cluster = (*cluster.Single)(nil)
)

// Usage windows.
const (
	// DefaultUsageWindow is the window of GET /admin/v1/usage without one.
	DefaultUsageWindow = time.Hour
	// MaxUsageWindow bounds a window, so one read cannot sum the whole
	// ledger's history.
	MaxUsageWindow = 90 * 24 * time.Hour
)

// clusterRoutes serves, with Options.Cluster, behind the read guard:
//
//	GET /admin/v1/cluster  every Edge (id, addresses, version, alive,
//	                       stopping, heartbeat age, configuration hash and
//	                       whether it differs from the majority's) and every
//	                       Node with the Edges it is connected to
//	GET /admin/v1/usage    the ledger's totals over a window:
//	                       ?window=1h (default; up to 90 days, ending now)
//	                       or ?from=RFC3339&to=RFC3339, and
//	                       ?by=principal,model,node (the default; any of
//	                       principal, model, node, edge, or "" for one total)
//
// Without it they answer 404.
func (h *handler) clusterRoutes(mux *http.ServeMux, c Cluster) {
	if c == nil {
		return
	}
	mux.HandleFunc("GET /admin/v1/cluster", h.read(func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, c.View(r.Context()))
	}))
	mux.HandleFunc("GET /admin/v1/usage", h.read(func(w http.ResponseWriter, r *http.Request) {
		q, err := usageQuery(r, time.Now())
		if err != nil {
			writeJSON(w, http.StatusBadRequest, errorBody{err.Error()})
			return
		}
		report, err := c.Usage(r.Context(), q)
		if err != nil {
			// The database is away: the figures would be this Edge's
			// alone, which is not what was asked.
			writeJSON(w, http.StatusServiceUnavailable, errorBody{err.Error()})
			return
		}
		writeJSON(w, http.StatusOK, report)
	}))
}

// usageQuery reads GET /admin/v1/usage's parameters.
func usageQuery(r *http.Request, now time.Time) (cluster.UsageQuery, error) {
	p := r.URL.Query()
	q := cluster.UsageQuery{By: []string{cluster.ByPrincipal, cluster.ByModel, cluster.ByNode}}
	if by, ok := p["by"]; ok {
		q.By = nil
		for _, d := range strings.Split(strings.Join(by, ","), ",") {
			if d = strings.TrimSpace(d); d != "" {
				q.By = append(q.By, d)
			}
		}
	}
	if err := q.Check(); err != nil {
		return q, err
	}
	from, to := p.Get("from"), p.Get("to")
	switch {
	case from != "" || to != "":
		if p.Get("window") != "" {
			return q, fmt.Errorf("usage: give window, or from and to, not both")
		}
		var err error
		if q.From, err = time.Parse(time.RFC3339, from); err != nil {
			return q, fmt.Errorf("usage: from must be an RFC 3339 time (2026-05-01T00:00:00Z): %w", err)
		}
		q.To = now
		if to != "" {
			if q.To, err = time.Parse(time.RFC3339, to); err != nil {
				return q, fmt.Errorf("usage: to must be an RFC 3339 time: %w", err)
			}
		}
	default:
		window := DefaultUsageWindow
		if s := p.Get("window"); s != "" {
			d, err := time.ParseDuration(s)
			if err != nil || d <= 0 {
				return q, fmt.Errorf("usage: window must be a positive duration (15m, 24h), got %q", s)
			}
			window = d
		}
		q.From, q.To = now.Add(-window), now
	}
	if !q.To.After(q.From) || q.To.Sub(q.From) > MaxUsageWindow {
		return q, fmt.Errorf("usage: the window must end after it starts and span at most %v", MaxUsageWindow)
	}
	return q, nil
}
