// Package adminapi serves the Edge's operational HTTP endpoints: the Node
// list, liveness and readiness, and the credential state with the
// operations that change it (revoke, reload, disable, enable).
//
// The read endpoints (nodes, queues, runs, credentials, cluster, usage, and the Edge's
// /metrics through ReadAccess) follow the config's api.admin_reads
// (Options.OpenReads):
// open to anyone, or only to an admin principal, since they show the fleet
// (Node ids and identities, addresses, labels, versions, providers,
// credential names). /healthz and /readyz are always open, for probes. The
// endpoints that change state always need the API key of a principal with
// admin: true (see credentials.go and reload.go).
package adminapi

import (
	"encoding/json"
	"log/slog"
	"net/http"

	"github.com/iop-dev/iop/internal/edge/auth"
	"github.com/iop-dev/iop/internal/edge/credentials"
	"github.com/iop-dev/iop/internal/edge/fleet"
	"github.com/iop-dev/iop/internal/edge/inflight"
	"github.com/iop-dev/iop/internal/edge/reload"
	"github.com/iop-dev/iop/internal/edge/sched"
)

// Readiness reports whether the Edge can do its job; nil means ready.
type Readiness func() error

// Queues returns the scheduler's queues for the admin view (any JSON
// value).
type Queues func() any

// Options are the optional parts of the admin endpoints.
type Options struct {
	// Queues serves /admin/v1/queues; nil serves an empty list.
	Queues Queues
	// Models adds "models" to /admin/v1/queues: each model with where it
	// is served, its free capacity and its queue (sched.Scheduler.Models);
	// nil leaves it out.
	Models func() any
	// Sessions adds "sessions" to /admin/v1/queues: how many sessions the
	// dispatcher remembers where they last ran, and their turns by
	// outcome (dispatch.Dispatcher.Sessions); nil leaves it out.
	Sessions func() any
	// NotYetBack adds "not_yet_back" to /admin/v1/queues: the models a
	// restarted Edge served before, whose Nodes have not reconnected yet,
	// answered 503 retry meanwhile (dispatch.Dispatcher.NotYetBack); nil
	// leaves it out.
	NotYetBack func() any
	// Load is the slots held on each provider of each Node generation
	// (sched.Scheduler.InFlight): /admin/v1/nodes shows each provider's
	// in_flight from it; nil shows 0.
	Load func() []sched.LoadView
	// Runs serves /admin/v1/runs, the work in flight and how recent work
	// ended (the status page's); nil leaves it answering 404.
	Runs *inflight.Tracker
	// Credentials serves the credential endpoints (credentials.go); nil
	// leaves them answering 404.
	Credentials *credentials.Store
	// Authenticator authenticates the callers of the endpoints that change
	// state, and of the reads unless OpenReads: only a principal with
	// Admin may call them. Nil refuses every such request.
	Authenticator *auth.Authenticator
	// OpenReads serves the read endpoints to anyone; otherwise (the
	// default) only to an admin principal.
	OpenReads bool
	// ReadsOpen, when set, is asked on every read instead of OpenReads,
	// so that a configuration reload can open or close them
	// (auth.Authenticator.AdminReadsOpen).
	ReadsOpen func() bool
	// Reloader serves POST /admin/v1/reload (reload.go); nil leaves it
	// answering 404.
	Reloader *reload.Reloader
	// Cluster serves GET /admin/v1/cluster and /admin/v1/usage
	// (cluster.go); nil leaves them answering 404.
	Cluster Cluster
	// Logger logs every change made through the admin endpoints, at Warn;
	// nil logs nothing.
	Logger *slog.Logger
	// Wake serves GET /admin/v1/wake: the Nodes the Edge can wake, each
	// sleeping, waking or awake (wake.Tracker.Snapshot, issue 23); nil
	// leaves it answering 404.
	Wake func() any
}

// newHandler is the handler of opts.
func newHandler(opts Options) *handler {
	h := &handler{creds: opts.Credentials, authn: opts.Authenticator, readsOpen: opts.ReadsOpen, reloader: opts.Reloader, log: opts.Logger}
	if h.readsOpen == nil {
		open := opts.OpenReads
		h.readsOpen = func() bool { return open }
	}
	if h.log == nil {
		h.log = slog.New(slog.DiscardHandler)
	}
	return h
}

// Handler returns the admin endpoints:
//
//	GET /admin/v1/nodes  every known Node: id, generation, state, last
//	                     heartbeat round trip, providers and their targets,
//	                     the evidence against unhealthy targets, and (with
//	                     Options.Load) each provider's slots in use
//	GET /healthz         200 while the process serves HTTP
//	GET /readyz          200 when ready() is nil, 503 with the reason otherwise
//	GET /admin/v1/queues the queues: depth, each waiting request's position
//	                     and wait; with Options.Models, each model's
//	                     Nodes, free capacity, queue depth and oldest wait;
//	                     with Options.Sessions, the session affinity table's
//	                     size and its turns by outcome
//	GET /admin/v1/runs   with Options.Runs, the work in flight (phase,
//	                     Node, time to first token, tokens) and recent
//	                     terminals by reason, per minute
//	GET /admin/v1/wake   with Options.Wake, the Nodes the Edge can wake:
//	                     sleeping, waking or awake, their models and
//	                     wakers, the last wake's time
//
// and, with Options.Credentials, the credential endpoints of
// credentials.go, with Options.Cluster the cluster view and the usage
// ledger of cluster.go. Without them those answer 404.
func Handler(reg *fleet.Registry, ready Readiness, opts Options) http.Handler {
	h := newHandler(opts)
	queues := opts.Queues
	mux := http.NewServeMux()
	h.credentialRoutes(mux)
	h.reloadRoutes(mux)
	h.clusterRoutes(mux, opts.Cluster)
	mux.HandleFunc("GET /admin/v1/queues", h.read(func(w http.ResponseWriter, r *http.Request) {
		var q any = []any{}
		if queues != nil {
			q = queues()
		}
		var m, sessions any
		if opts.Models != nil {
			m = opts.Models()
		}
		if opts.Sessions != nil {
			sessions = opts.Sessions()
		}
		var notYetBack any
		if opts.NotYetBack != nil {
			notYetBack = opts.NotYetBack()
		}
		writeJSON(w, http.StatusOK, struct {
			Queues     any `json:"queues"`
			Models     any `json:"models,omitempty"`
			Sessions   any `json:"sessions,omitempty"`
			NotYetBack any `json:"not_yet_back,omitempty"`
		}{q, m, sessions, notYetBack})
	}))
	mux.HandleFunc("GET /admin/v1/nodes", h.read(func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, struct {
			Nodes []nodeView `json:"nodes"`
		}{withLoad(reg.Snapshot(), opts.Load)})
	}))
	if opts.Wake != nil {
		mux.HandleFunc("GET /admin/v1/wake", h.read(func(w http.ResponseWriter, r *http.Request) {
			writeJSON(w, http.StatusOK, struct {
				Nodes any `json:"nodes"`
			}{opts.Wake()})
		}))
	}
	if opts.Runs != nil {
		mux.HandleFunc("GET /admin/v1/runs", h.read(func(w http.ResponseWriter, r *http.Request) {
			writeJSON(w, http.StatusOK, opts.Runs.Snapshot())
		}))
	}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, status{Status: "ok"})
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if err := ready(); err != nil {
			writeJSON(w, http.StatusServiceUnavailable, status{Status: "unavailable", Reason: err.Error()})
			return
		}
		writeJSON(w, http.StatusOK, status{Status: "ready"})
	})
	return mux
}

// ReadAccess guards h, another read of the Edge's state (its /metrics), as
// Handler with opts guards its own reads (OpenReads, Authenticator).
func ReadAccess(h http.Handler, opts Options) http.Handler {
	return newHandler(opts).read(h.ServeHTTP)
}

// read serves f to anyone when reads are open, and otherwise only to an
// admin principal (401 or 403 in the shape of the other admin errors).
func (h *handler) read(f http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if h.readsOpen() {
			f(w, r)
			return
		}
		if _, ok := h.admin(w, r); ok {
			f(w, r)
		}
	}
}

// handler holds what the optional endpoints need.
type handler struct {
	creds     *credentials.Store
	authn     *auth.Authenticator
	log       *slog.Logger
	readsOpen func() bool
	reloader  *reload.Reloader
}

type status struct {
	Status string `json:"status"`
	Reason string `json:"reason,omitempty"`
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// nodeView is a Node of the registry with its providers' slots in use.
// Its Providers hide the embedded view's in JSON (the shallower field
// wins).
type nodeView struct {
	fleet.NodeView
	Providers []providerView `json:"providers"`
}

// providerView is a provider with the slots the scheduler holds on it.
type providerView struct {
	fleet.ProviderView
	InFlight int `json:"in_flight"`
}

// withLoad joins the registry's Nodes with the scheduler's slots, by
// Node, generation and provider.
func withLoad(ns []fleet.NodeView, load func() []sched.LoadView) []nodeView {
	type key struct {
		node     string
		gen      uint64
		provider string
	}
	held := map[key]int{}
	if load != nil {
		for _, l := range load() {
			held[key{l.NodeID, l.Generation, l.Provider}] += l.InFlight
		}
	}
	out := make([]nodeView, len(ns))
	for i, n := range ns {
		out[i] = nodeView{NodeView: n, Providers: make([]providerView, len(n.Providers))}
		for j, p := range n.Providers {
			out[i].Providers[j] = providerView{ProviderView: p, InFlight: held[key{n.ID, n.Generation, p.Name}]}
		}
	}
	return out
}
