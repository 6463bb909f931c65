package ollamaapi

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
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
// Node failing never stops the others. With "stream": false the answer is
// that last line alone, once every Node is done. Delete and copy answer 200
// with {"status":"success","nodes":[...]} when every Node succeeded, and
// otherwise the failure in Ollama's shape, its status the servers' own when
// they agree (404 for a model none of them has), else 502.
//
// A Node lists its models again as each call ends (its inventory follows
// at once), so /api/tags shows a pulled model when the pull's last line
// comes.

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
			"send an admin's API key (Authorization: Bearer KEY)", c.op.verb, p.Name))
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

// selection is the Nodes a request names.
type selection struct {
	nodes  []string
	labels map[string]string
}

// selectionOf reads the Nodes the request names from the body's "nodes"
// and "labels", else from the X-IOP-Nodes and X-IOP-Labels headers.
func selectionOf(fields map[string]json.RawMessage, h http.Header) (selection, error) {
	var s selection
	if raw, ok := fields["nodes"]; ok {
		if err := json.Unmarshal(raw, &s.nodes); err != nil {
			return s, fmt.Errorf(`"nodes" must be a list of Node ids: %w`, err)
		}
	} else if v := h.Get(NodesHeader); v != "" {
		for n := range strings.SplitSeq(v, ",") {
			if n = strings.TrimSpace(n); n != "" {
				s.nodes = append(s.nodes, n)
			}
		}
	}
	if raw, ok := fields["labels"]; ok {
		if err := json.Unmarshal(raw, &s.labels); err != nil {
			return s, fmt.Errorf(`"labels" must be an object of label values: %w`, err)
		}
	} else if v := h.Get(LabelsHeader); v != "" {
		s.labels = map[string]string{}
		for kv := range strings.SplitSeq(v, ",") {
			k, val, ok := strings.Cut(strings.TrimSpace(kv), "=")
			if !ok || strings.TrimSpace(k) == "" {
				return s, fmt.Errorf("%s: %q is not key=value", LabelsHeader, kv)
			}
			s.labels[strings.TrimSpace(k)] = strings.TrimSpace(val)
		}
	}
	return s, nil
}

// none reports whether the request names no Nodes at all.
func (s selection) none() bool { return len(s.nodes) == 0 && len(s.labels) == 0 }

// String describes the selection for a message: "" for none.
func (s selection) String() string {
	var b strings.Builder
	if len(s.nodes) > 0 {
		fmt.Fprintf(&b, " among Nodes %s", strings.Join(s.nodes, ", "))
	}
	if len(s.labels) > 0 {
		kv := make([]string, 0, len(s.labels))
		for k, v := range s.labels {
			kv = append(kv, k+"="+v)
		}
		slices.Sort(kv)
		fmt.Fprintf(&b, " with labels %s", strings.Join(kv, ","))
	}
	return b.String()
}

// matches reports whether labels has every label s asks for.
func (s selection) matches(labels map[string]string) bool {
	for k, v := range s.labels {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// choose is the parts of a call among nodes: every online provider of each
// Node s names (a Node named that cannot take it is a part failed with the
// reason); with no Node named, those of every ready Node, restricted to the
// providers that list held when it is set.
func (s selection) choose(nodes []dispatch.ManagedNode, held string) []*part {
	var parts []*part
	named := map[string]bool{}
	for _, n := range s.nodes {
		named[n] = true
	}
	refuse := func(id, why string) { parts = append(parts, &part{node: id, label: id, err: why}) }
	for _, n := range nodes {
		byID := named[n.ID]
		delete(named, n.ID)
		switch {
		case len(s.nodes) > 0 && !byID:
			continue
		case !s.matches(n.Labels):
			if byID {
				refuse(n.ID, "its labels do not match"+selection{labels: s.labels}.String())
			}
			continue
		case n.Unavailable != "":
			if !s.none() {
				refuse(n.ID, n.Unavailable)
			}
			continue
		}
		var provs []dispatch.ManagedProvider
		for _, p := range n.Providers {
			if held == "" || !s.none() || slices.ContainsFunc(p.Targets, func(t string) bool { return sched.SameModel(t, held) }) {
				provs = append(provs, p)
			}
		}
		if len(provs) == 0 {
			if !s.none() {
				refuse(n.ID, "it has no online Ollama provider")
			}
			continue
		}
		for _, p := range provs {
			label := n.ID
			if len(provs) > 1 {
				label = n.ID + "/" + p.Name
			}
			parts = append(parts, &part{node: n.ID, provider: p.Name, label: label})
		}
	}
	for _, id := range s.nodes {
		if named[id] {
			refuse(id, "not connected to this Edge")
			delete(named, id)
		}
	}
	return parts
}

// open starts the call on pt; a part refused while choosing is not
// started.
func (c *manageCall) open(ctx context.Context, pt *part, body []byte) (dispatch.TunnelStream, *wirepb.TunnelResponseHead, bool) {
	if pt.err != "" {
		return nil, nil, false
	}
	req := &wirepb.TunnelRequest{Method: c.op.method, Path: c.op.path,
		Headers: []*wirepb.Header{{Name: "Content-Type", Value: "application/json"}}}
	ts, err := c.h.manager.Manager.Manage(ctx, pt.node, pt.provider, req, body)
	if err != nil {
		pt.err = err.Error()
		return nil, nil, false
	}
	head, err := ts.Head()
	if err != nil {
		ts.Close()
		pt.err = err.Error()
		return nil, nil, false
	}
	pt.status = int(head.GetStatus())
	if pt.status != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(ts, maxManageLine))
		ts.Close()
		pt.err = serverError(b, pt.status)
		return nil, nil, false
	}
	return ts, head, true
}

// serverError is the message of a server's error answer: Ollama's
// {"error"}, else its text, else its status.
func serverError(b []byte, status int) string {
	var e errorBody
	if json.Unmarshal(b, &e) == nil && e.Error != "" {
		return e.Error
	}
	if s := strings.TrimSpace(string(b)); s != "" {
		return s
	}
	return fmt.Sprintf("status %d", status)
}

// runWhole runs a delete or copy on every part at once, and answers when
// all have.
func (c *manageCall) runWhole(body []byte) {
	var wg sync.WaitGroup
	for _, pt := range c.parts {
		wg.Go(func() {
			ts, _, ok := c.open(c.r.Context(), pt, body)
			if !ok {
				return
			}
			defer ts.Close()
			if _, err := io.Copy(io.Discard, io.LimitReader(ts, maxManageLine)); err != nil {
				pt.err = err.Error()
				return
			}
			pt.ok = true
		})
	}
	wg.Wait()
	c.conclude()
}

// event is one thing a part tells the writer: a line to pass on, or its
// end.
type event struct {
	line []byte
	end  bool
}

// runProgress runs a pull or create on every part at once: each part's
// lines are rewritten to name its Node and passed on as they come (with
// stream), then the one last line says how the whole call ended.
func (c *manageCall) runProgress(body []byte, stream bool) {
	ctx, cancel := context.WithCancel(c.r.Context())
	defer cancel()
	events := make(chan event, 4*len(c.parts))
	var wg sync.WaitGroup
	for _, pt := range c.parts {
		wg.Go(func() {
			defer func() {
				select {
				case events <- event{end: true}:
				case <-ctx.Done():
				}
			}()
			ts, _, ok := c.open(ctx, pt, body)
			if !ok {
				if pt.err != "" {
					c.pass(ctx, events, statusLine(pt.label+": failed: "+pt.err))
				}
				return
			}
			defer ts.Close()
			c.follow(ctx, pt, ts, events)
		})
	}
	for ended := 0; ended < len(c.parts); {
		ev := <-events
		switch {
		case ev.end:
			ended++
		case stream && ctx.Err() == nil:
			if !c.writeLine(ev.line) {
				cancel() // the client stopped reading: every Node's call ends
			}
		}
		if ctx.Err() != nil && ended < len(c.parts) {
			// Nobody to tell: the parts see ctx and end without sending.
			break
		}
	}
	wg.Wait()
	if ctx.Err() != nil {
		c.outcome = "cancelled"
		return
	}
	c.conclude()
}

// pass sends a line to the writer, unless the call has ended.
func (c *manageCall) pass(ctx context.Context, events chan<- event, line []byte) bool {
	select {
	case events <- event{line: line}:
		return true
	case <-ctx.Done():
		return false
	}
}

// follow reads pt's progress to its end: each line rewritten to name its
// Node (rename); the server's error line fails the part, its success line
// makes it succeed.
func (c *manageCall) follow(ctx context.Context, pt *part, ts dispatch.TunnelStream, events chan<- event) {
	sc := bufio.NewScanner(ts)
	sc.Buffer(make([]byte, 0, 4<<10), maxManageLine)
	for sc.Scan() {
		if len(strings.TrimSpace(sc.Text())) == 0 {
			continue
		}
		line, errMsg, success := rename(sc.Bytes(), pt.label)
		switch {
		case errMsg != "":
			pt.err = errMsg
		case success:
			pt.ok = true
		}
		if !c.pass(ctx, events, line) || errMsg != "" {
			return
		}
	}
	switch err := sc.Err(); {
	case pt.ok:
	case errors.Is(err, bufio.ErrTooLong):
		pt.err = fmt.Sprintf("a progress line longer than %d bytes", maxManageLine)
	case err != nil:
		pt.err = err.Error()
	default:
		pt.err = `the server's progress ended without "success"`
	}
	if ctx.Err() == nil && pt.err != "" {
		c.pass(ctx, events, statusLine(pt.label+": failed: "+pt.err))
	}
}

// rename is one progress line of a Node's server as the client gets it:
// its status prefixed with label, its digest made label's. An error line
// becomes a status line (the call's own last line tells the error); it is
// returned as errMsg. success reports the server's success line.
func rename(line []byte, label string) (out []byte, errMsg string, success bool) {
	var f map[string]json.RawMessage
	if json.Unmarshal(line, &f) != nil {
		return statusLine(label + ": " + string(line)), "", false
	}
	if msg := nameField(f, "error"); msg != "" {
		return statusLine(label + ": failed: " + msg), msg, false
	}
	status := nameField(f, "status")
	success = status == "success"
	f["status"] = mustJSON(label + ": " + status)
	if d := nameField(f, "digest"); d != "" {
		short, ok := strings.CutPrefix(d, "sha256:")
		if !ok {
			short = d
		}
		f["digest"] = mustJSON(label + " " + short[:min(12, len(short))])
	}
	return append(mustJSON(f), '\n'), "", success
}

// statusLine is a progress line of status alone.
func statusLine(status string) []byte {
	return append(mustJSON(map[string]string{"status": status}), '\n')
}

// conclude answers the call's outcome once every part has ended: success,
// or the failure naming each Node that failed and those that succeeded.
func (c *manageCall) conclude() {
	var failed, done []string
	statuses := map[int]bool{}
	for _, pt := range c.parts {
		if pt.ok && pt.err == "" {
			done = append(done, pt.label)
			continue
		}
		failed = append(failed, pt.label+": "+pt.err)
		statuses[pt.status] = true
	}
	if len(failed) == 0 {
		c.outcome = "ok"
		if c.op.progress {
			c.end(http.StatusOK, statusLine("success"))
			return
		}
		c.end(http.StatusOK, append(mustJSON(map[string]any{"status": "success", "nodes": done}), '\n'))
		return
	}
	c.outcome = "upstream"
	c.errMsg = fmt.Sprintf("%s %s failed on %s", c.op.verb, c.model, strings.Join(failed, "; "))
	if len(done) > 0 {
		c.errMsg += "; succeeded on " + strings.Join(done, ", ")
	}
	status := http.StatusBadGateway
	if len(statuses) == 1 {
		for s := range statuses {
			if s >= 400 {
				status = s
			}
		}
	}
	c.end(status, append(mustJSON(errorBody{Error: c.errMsg}), '\n'))
}

// refuse answers the call with status and Ollama's error body, before
// anything else was written; code is its outcome in metrics and the log.
func (c *manageCall) refuse(status int, code, msg string) {
	c.outcome, c.errMsg = code, msg
	c.end(status, append(mustJSON(errorBody{Error: msg}), '\n'))
}

// end writes the answer's last line: after a stream as one more line,
// else as the whole answer with status.
func (c *manageCall) end(status int, line []byte) {
	if c.committed {
		c.writeLine(line)
		return
	}
	c.committed = true
	c.w.Header().Set("Content-Type", shape.ContentType)
	c.w.WriteHeader(status)
	c.wd.Extend()
	_, _ = c.w.Write(line)
}

// writeLine writes one line of a progress stream, committing it (200,
// NDJSON) first; false when the client could not be written to.
func (c *manageCall) writeLine(line []byte) bool {
	if !c.committed {
		c.committed = true
		c.w.Header().Set("Content-Type", "application/x-ndjson")
		c.w.Header().Set("Cache-Control", "no-cache")
		c.w.Header().Set("X-Accel-Buffering", "no")
		c.w.WriteHeader(http.StatusOK)
	}
	c.wd.Extend()
	if _, err := c.w.Write(line); err != nil {
		return false
	}
	err := http.NewResponseController(c.w).Flush()
	return err == nil || errors.Is(err, http.ErrNotSupported)
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
