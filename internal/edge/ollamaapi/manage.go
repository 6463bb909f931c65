package ollamaapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/iop-dev/iop/internal/edge/auth"
	"github.com/iop-dev/iop/internal/edge/dispatch"
	"github.com/iop-dev/iop/internal/edge/edgemetrics"
	"github.com/iop-dev/iop/internal/edge/frontdoor"
	"github.com/iop-dev/iop/internal/edge/frontend"
	"github.com/iop-dev/iop/internal/edge/sched"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// Model management on the fleet (issue 23): Ollama's /api/pull,
// /api/delete, /api/copy and /api/create, for admin principals only, sent
// to one Ollama provider of each chosen Node as a management tunnel
// (dispatch.Manage), every Ollama provider of a Node when it has several
// (they may be different servers).
//
// Which Nodes: those the request names, by id ("nodes": [...] in the body,
// or the X-IOP-Nodes header, comma-separated) and by label ("labels":
// {...}, or X-IOP-Labels: k=v,k2=v2), both if both are given. Neither, as
// from the ollama CLI and the official clients: a pull or a create goes to
// every ready Node with an online Ollama provider, a delete or a copy to
// those whose servers list the model. A Node named but not connected, not
// ready or without an Ollama provider is a failure of the call, with its
// reason.
//
// What a client sees. Pull and create stream every Node's progress as
// Ollama's lines, each status prefixed with the Node's id ("gpu1: pulling
// 6a0746a1ec1a") and each digest made the Node's ("gpu1 6a0746a1ec1a"), so
// that the ollama CLI draws one progress bar per Node and blob; a Node's
// end is a status line too ("gpu1: success"). The last line is
// {"status":"success"} only when every Node succeeded; otherwise it is an
// {"error"} line naming each Node that failed with its reason, and those
// that succeeded (the official client returns it as the call's error). One
// Node failing never stops the others; every Node failing before its first
// line is an HTTP error, as Ollama answers an error before output. With "stream": false the answer is
// that last line alone, once every Node is done. Delete and copy answer 200
// with {"status":"success","nodes":[...]} when every Node succeeded, and
// otherwise the failure in Ollama's shape, its status the servers' own when
// they agree (404 for a model none of them has), else 502.
//
// A Node lists its models again as each call ends, before it answers the
// end (its inventory follows at once, not a relist interval later), so
// /api/tags shows a pulled model moments after the pull's last line.

// Route labels of the management endpoints.
const (
	routePull   = "ollama_pull"
	routeDelete = "ollama_delete"
	routeCopy   = "ollama_copy"
	routeCreate = "ollama_create"
)

// Headers that name the Nodes of a management call, for clients that
// cannot add fields to the body.
const (
	NodesHeader  = "X-IOP-Nodes"
	LabelsHeader = "X-IOP-Labels"
)

// Limits of a management call.
const (
	// maxManageBody bounds its request body: a model's name and options,
	// or a create's template, system prompt and parameters.
	maxManageBody = 1 << 20
	// maxManageLine bounds one line of a Node's progress, and a Node's
	// whole answer to a delete or copy (and any error body).
	maxManageLine = 64 << 10
	// manageWriteTimeout bounds one write to the client: one that cannot
	// take a line for that long has stopped reading, and the call is
	// cancelled on every Node.
	manageWriteTimeout = time.Minute
)

// Manager is what model management needs of the dispatcher
// (*dispatch.Dispatcher).
type Manager interface {
	// ManagedNodes lists every Node the Edge knows with its online
	// providers of adapter.
	ManagedNodes(adapter string) []dispatch.ManagedNode
	// Manage opens a management tunnel to one provider of one Node.
	Manage(ctx context.Context, nodeID, provider string, req *wirepb.TunnelRequest, body []byte) (dispatch.TunnelStream, error)
}

// Management is what the management endpoints need beside the front end:
// who a request is from (only an admin principal may manage models), the
// Nodes, and the metrics to count calls in (nil counts nothing).
type Management struct {
	Auth    *auth.Authenticator
	Manager Manager
	Metrics *edgemetrics.Metrics
}

// Option configures Handler.
type Option func(*handler)

// WithManagement serves /api/pull, /api/delete, /api/copy and /api/create
// (see manage.go); without it they are unknown paths.
func WithManagement(m Management) Option {
	return func(h *handler) { h.manager = &m }
}

// manageOp is one of the management endpoints.
type manageOp struct {
	route, path, method string
	verb                string // in messages: "pull", "delete", ...
	progress            bool   // answers Ollama's progress stream
	// model reads the model the call is about from the body's fields;
	// held is the model a Node's server must list to be chosen by
	// default ("": every Node).
	model func(f map[string]json.RawMessage) (model, held string)
}

var (
	opPull = &manageOp{route: routePull, path: "/api/pull", method: http.MethodPost, verb: "pull", progress: true,
		model: func(f map[string]json.RawMessage) (string, string) { return nameField(f, "model", "name"), "" }}
	opDelete = &manageOp{route: routeDelete, path: "/api/delete", method: http.MethodDelete, verb: "delete",
		model: func(f map[string]json.RawMessage) (string, string) {
			m := nameField(f, "model", "name")
			return m, m
		}}
	opCopy = &manageOp{route: routeCopy, path: "/api/copy", method: http.MethodPost, verb: "copy",
		model: func(f map[string]json.RawMessage) (string, string) {
			m := nameField(f, "source")
			return m, m
		}}
	opCreate = &manageOp{route: routeCreate, path: "/api/create", method: http.MethodPost, verb: "create", progress: true,
		model: func(f map[string]json.RawMessage) (string, string) { return nameField(f, "model", "name"), "" }}
)

// nameField is the first of keys that is a non-empty string in f.
func nameField(f map[string]json.RawMessage, keys ...string) string {
	for _, k := range keys {
		var s string
		if json.Unmarshal(f[k], &s) == nil && s != "" {
			return s
		}
	}
	return ""
}

// manage serves op: refused as an unknown path when management is not
// configured.
func (h *handler) manage(op *manageOp) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if h.manager == nil {
			h.front.Refuse(shape, frontend.UnknownURL).ServeHTTP(w, r)
			return
		}
		c := &manageCall{h: h, op: op, w: w, r: r, arrived: time.Now(), wd: frontdoor.NewWriteDeadline(w, manageWriteTimeout)}
		c.serve()
		c.record()
	})
}

// manageCall is one management request, from its arrival to its record.
type manageCall struct {
	h       *handler
	op      *manageOp
	w       http.ResponseWriter
	r       *http.Request
	arrived time.Time
	wd      *frontdoor.WriteDeadline

	principal, model string
	parts            []*part // the Nodes' providers it went to, and the Nodes refused before
	outcome          string  // "ok", or why not
	errMsg           string
	committed        bool // the answer's head went
}

// part is the call on one provider of one Node.
type part struct {
	node, provider string
	label          string // how lines and messages name it: the Node, or node/provider
	status         int    // the server's HTTP status, 0 without one
	err            string // why it failed; "" once it succeeded
	ok             bool
}

// serve authenticates, reads and checks the request, chooses the Nodes and
// runs the call on them.
func (c *manageCall) serve() {
	p, err := c.h.manager.Auth.Authenticate(c.r)
	switch {
	case err != nil:
		c.w.Header().Set("WWW-Authenticate", shape.Challenge)
		c.refuse(http.StatusUnauthorized, "unauthenticated", err.Error())
		return
	case !p.Admin:
		c.principal = p.Name
		c.refuse(http.StatusForbidden, "forbidden", fmt.Sprintf("%s on the fleet is for admin principals, and %q is not one: "+
			"send an admin's API key (Authorization: Bearer KEY), or sign with an admin's Ollama key (OLLAMA_AUTH=1)", c.op.verb, p.Name))
		return
	case c.h.front.Stopping():
		c.principal = p.Name
		c.refuse(http.StatusServiceUnavailable, "edge_stopping", "this Edge is stopping and takes no new work")
		return
	}
	c.principal = p.Name
	body, err := io.ReadAll(http.MaxBytesReader(c.w, c.r.Body, maxManageBody))
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		c.refuse(http.StatusRequestEntityTooLarge, "request_too_large", fmt.Sprintf("the request body is larger than %d bytes", maxManageBody))
		return
	case err != nil:
		c.refuse(http.StatusBadRequest, "invalid_request", "the request body could not be read: "+err.Error())
		return
	case len(strings.TrimSpace(string(body))) == 0:
		c.refuse(http.StatusBadRequest, "invalid_request", "missing request body")
		return
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(body, &fields); err != nil {
		c.refuse(http.StatusBadRequest, "invalid_request", err.Error())
		return
	}
	model, held := c.op.model(fields)
	c.model = model
	if model == "" {
		c.refuse(http.StatusBadRequest, "invalid_request", "the request names no model")
		return
	}
	sel, err := selectionOf(fields, c.r.Header)
	if err != nil {
		c.refuse(http.StatusBadRequest, "invalid_request", err.Error())
		return
	}
	stream := true
	if raw, ok := fields["stream"]; ok && string(raw) != "null" {
		if err := json.Unmarshal(raw, &stream); err != nil {
			c.refuse(http.StatusBadRequest, "invalid_request", "stream: "+err.Error())
			return
		}
	}
	// The Nodes get the client's body without the Edge's own fields, and a
	// progress stream in any case: a Node that answers only at its end
	// would look stalled for the whole download.
	delete(fields, "nodes")
	delete(fields, "labels")
	if c.op.progress {
		fields["stream"] = json.RawMessage("true")
	}
	body, _ = json.Marshal(fields)

	c.parts = sel.choose(c.h.manager.Manager.ManagedNodes(Adapter), held)
	if len(c.parts) == 0 {
		switch {
		case held != "" && sel.none():
			c.notHeld()
		default:
			c.refuse(http.StatusServiceUnavailable, sched.ReasonNoCandidate, "no ready Node with an online Ollama provider"+sel.String())
		}
		return
	}
	if c.op.progress {
		c.runProgress(body, stream)
		return
	}
	c.runWhole(body)
}

// notHeld answers a delete or copy, with no Node named, of a model no
// Node's server lists, as Ollama answers for a model it does not have.
func (c *manageCall) notHeld() {
	msg := fmt.Sprintf("model '%s' not found", c.model)
	if c.op == opCopy {
		msg = fmt.Sprintf("model %q not found", c.model)
	}
	c.refuse(http.StatusNotFound, "model_not_found", msg)
}

// record counts the call and logs it: who, what, on which Nodes, how it
// ended.
func (c *manageCall) record() {
	if m := c.h.manager.Metrics; m != nil {
		m.Requests.WithLabelValues(c.op.route, "", c.principal, c.outcome).Inc()
	}
	var done, failed []string
	for _, pt := range c.parts {
		if pt.ok && pt.err == "" {
			done = append(done, pt.label)
		} else {
			failed = append(failed, pt.label)
		}
	}
	attrs := []slog.Attr{slog.String("route", c.op.route), slog.String("principal", c.principal), slog.String("outcome", c.outcome),
		slog.Duration("elapsed", time.Since(c.arrived))}
	if c.model != "" {
		attrs = append(attrs, slog.String("model", c.model))
	}
	if len(c.parts) > 0 {
		attrs = append(attrs, slog.Any("nodes_done", done), slog.Any("nodes_failed", failed))
	}
	if c.errMsg != "" {
		attrs = append(attrs, slog.String("err", c.errMsg))
	}
	c.h.front.Logger().LogAttrs(c.r.Context(), slog.LevelInfo, "ollama "+c.op.verb, attrs...)
}
