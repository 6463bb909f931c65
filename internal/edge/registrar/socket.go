package registrar

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// maxSocketBody bounds a request on the admin socket.
const maxSocketBody = 4 << 10

// TokenResult is what `node add` gets: the token, and what to print.
type TokenResult struct {
	NodeID  string    `json:"node_id"`
	Token   string    `json:"token"`
	Expires time.Time `json:"expires"`
	CAHash  string    `json:"ca_hash"`
}

// RemoveResult is what `node remove` gets.
type RemoveResult struct {
	NodeID  string   `json:"node_id"`
	Revoked []string `json:"revoked_serials"`
	// Fenced: a live connection of the Node was closed.
	Fenced bool `json:"fenced"`
	// Offline: no Edge was running; it refuses the Node when it starts.
	Offline bool `json:"offline,omitempty"`
}

// RestoreResult is what `node restore` gets.
type RestoreResult struct {
	NodeID string `json:"node_id"`
	// Removed is when the removal now lifted was made.
	Removed time.Time `json:"removed"`
}

// AddToken makes a token for nodeID valid for ttl.
func (s *Service) AddToken(nodeID string, ttl time.Duration) (TokenResult, error) {
	return s.addToken(context.Background(), nodeID, ttl)
}

func (s *Service) addToken(ctx context.Context, nodeID string, ttl time.Duration) (TokenResult, error) {
	tok, exp, err := s.NewTokenBy(ctx, ActorAdminSocket, nodeID, ttl)
	if err != nil {
		return TokenResult{}, err
	}
	return TokenResult{NodeID: nodeID, Token: tok.String(), Expires: exp, CAHash: tok.CAHashString()}, nil
}

// socketErrors are the errors that keep their identity across the
// socket: the Edge names the sentinel an error matches ("is"), and the
// client's error matches it again (remoteError), so `errors.Is` works in
// the CLI as in the Edge.
var socketErrors = []struct {
	name string
	err  error
	code int
}{
	{"unknown_node", ErrUnknownNode, http.StatusNotFound},
	{"node_removed", ErrNodeRemoved, http.StatusConflict},
	{"not_removed", ErrNotRemoved, http.StatusConflict},
	{"database_unreachable", ErrDatabaseUnreachable, http.StatusServiceUnavailable},
	{"no_audit_log", ErrNoAuditLog, http.StatusNotFound},
}

// auditPage reads GET /audit's before and limit (both optional).
func auditPage(q url.Values) (before int64, limit int, err error) {
	if v := q.Get("before"); v != "" {
		if before, err = strconv.ParseInt(v, 10, 64); err != nil || before < 0 {
			return 0, 0, fmt.Errorf("before: want an entry id, got %q", v)
		}
	}
	limit = 100
	if v := q.Get("limit"); v != "" {
		if limit, err = strconv.Atoi(v); err != nil || limit < 1 || limit > MaxAuditPage {
			return 0, 0, fmt.Errorf("limit: want 1 to %d, got %q", MaxAuditPage, v)
		}
	}
	return before, limit, nil
}

// socketError is an error as the socket carries it.
type socketError struct {
	Error string `json:"error"`
	Is    string `json:"is,omitempty"`
}

// Handler is the admin socket's API: POST /nodes/{id}/tokens?ttl=D,
// DELETE /nodes/{id}, POST /nodes/{id}/restore, GET /nodes, and GET
// /audit?before=ID&limit=N (a page of the audit log, newest first). An
// error is a socketError with a status of 400, 404, 409 or 503.
func (s *Service) Handler() http.Handler {
	mux := http.NewServeMux()
	reply := func(w http.ResponseWriter, v any, err error) {
		w.Header().Set("Content-Type", "application/json")
		if err != nil {
			code, e := http.StatusBadRequest, socketError{Error: err.Error()}
			for _, se := range socketErrors {
				if errors.Is(err, se.err) {
					code, e.Is = se.code, se.name
					break
				}
			}
			w.WriteHeader(code)
			_ = json.NewEncoder(w).Encode(e)
			return
		}
		_ = json.NewEncoder(w).Encode(v)
	}
	mux.HandleFunc("POST /nodes/{id}/tokens", func(w http.ResponseWriter, r *http.Request) {
		ttl, err := time.ParseDuration(r.URL.Query().Get("ttl"))
		if err != nil {
			reply(w, nil, fmt.Errorf("ttl: %w", err))
			return
		}
		if !s.Renews() {
			// The file may say otherwise: the running Edge decides.
			reply(w, nil, fmt.Errorf("the running Edge would refuse the join: %w (then restart it)", ErrDisabled))
			return
		}
		res, err := s.addToken(r.Context(), r.PathValue("id"), ttl)
		reply(w, res, err)
	})
	mux.HandleFunc("DELETE /nodes/{id}", func(w http.ResponseWriter, r *http.Request) {
		revoked, fenced, err := s.RemoveBy(r.Context(), ActorAdminSocket, r.PathValue("id"))
		reply(w, RemoveResult{NodeID: r.PathValue("id"), Revoked: revoked, Fenced: fenced}, err)
	})
	mux.HandleFunc("POST /nodes/{id}/restore", func(w http.ResponseWriter, r *http.Request) {
		removed, err := s.RestoreBy(r.Context(), ActorAdminSocket, r.PathValue("id"))
		reply(w, RestoreResult{NodeID: r.PathValue("id"), Removed: removed}, err)
	})
	mux.HandleFunc("GET /audit", func(w http.ResponseWriter, r *http.Request) {
		before, limit, err := auditPage(r.URL.Query())
		if err != nil {
			reply(w, nil, err)
			return
		}
		page, err := s.AuditLog(r.Context(), before, limit)
		if page == nil {
			page = []AuditEntry{}
		}
		reply(w, page, err)
	})
	mux.HandleFunc("GET /nodes", func(w http.ResponseWriter, r *http.Request) {
		list, err := s.List()
		if err != nil {
			reply(w, nil, err)
			return
		}
		// A JSON array written a Node at a time, as long as the store is:
		// the client reads it as a stream (SocketClient.List), so no
		// fleet is too large to list.
		w.Header().Set("Content-Type", "application/json")
		bw := bufio.NewWriter(w)
		enc := json.NewEncoder(bw)
		bw.WriteString("[")
		for i := range list {
			if i > 0 {
				bw.WriteString(",")
			}
			if enc.Encode(&list[i]) != nil {
				return
			}
		}
		bw.WriteString("]\n")
		_ = bw.Flush()
	})
	return http.MaxBytesHandler(mux, maxSocketBody)
}

// ServeSocket serves Handler on ln until ctx ends. It also prunes the store
// every pruneEvery meanwhile: the socket is served for as long as the Edge
// runs with a store, which is as long as the store needs pruning.
func (s *Service) ServeSocket(ctx context.Context, ln net.Listener, log *slog.Logger) {
	var pruning sync.WaitGroup
	defer pruning.Wait()
	pruning.Go(func() { s.keepPruned(ctx, pruneEvery) })
	srv := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 5 * time.Second, WriteTimeout: time.Minute}
	defer context.AfterFunc(ctx, func() { _ = srv.Close() })()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Error("admin socket failed", "err", err)
	}
}

// ErrNoEdge is a SocketClient's error when no Edge answers on the socket.
var ErrNoEdge = errors.New("no running edged answers on the admin socket")

// SocketClient calls a running Edge's admin socket.
type SocketClient struct {
	hc *http.Client
}

// maxSocketAnswer bounds an answer on the admin socket, but for the list
// of Nodes, which is read as a stream.
const maxSocketAnswer = 1 << 20

// do sends a request and returns the answer of an Edge that took it, or the
// Edge's error (a remoteError when it names a sentinel).
func (c *SocketClient) do(method, path string) (*http.Response, error) {
	req, err := http.NewRequest(method, "http://edged"+path, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ECONNREFUSED) {
			return nil, ErrNoEdge
		}
		// The URL is the client's own invention ("http://edged/..."):
		// the reason is what follows it.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, fmt.Errorf("admin socket: %w", err)
	}
	if resp.StatusCode == http.StatusOK {
		return resp, nil
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, maxSocketAnswer))
	var e socketError
	if json.Unmarshal(body, &e) != nil || e.Error == "" {
		return nil, fmt.Errorf("admin socket: %s", resp.Status)
	}
	for _, se := range socketErrors {
		// An Edge from before the "is" field said an unknown node by 404
		// alone.
		if e.Is == se.name || (e.Is == "" && resp.StatusCode == http.StatusNotFound && se.err == ErrUnknownNode) {
			return nil, &remoteError{msg: e.Error, is: se.err}
		}
	}
	return nil, errors.New(e.Error)
}

func (c *SocketClient) call(method, path string, out any) error {
	resp, err := c.do(method, path)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxSocketAnswer))
	if err != nil {
		return fmt.Errorf("admin socket: %w", err)
	}
	return json.Unmarshal(body, out)
}

// remoteError is an error the Edge reported on the socket, with the
// sentinel it matches.
type remoteError struct {
	msg string
	is  error
}

func (e *remoteError) Error() string        { return e.msg }
func (e *remoteError) Is(target error) bool { return target == e.is }

// AddToken asks the running Edge for a token.
func (c *SocketClient) AddToken(nodeID string, ttl time.Duration) (TokenResult, error) {
	var r TokenResult
	err := c.call(http.MethodPost, "/nodes/"+url.PathEscape(nodeID)+"/tokens?ttl="+url.QueryEscape(ttl.String()), &r)
	return r, err
}

// Remove asks the running Edge to remove nodeID.
func (c *SocketClient) Remove(nodeID string) (RemoveResult, error) {
	var r RemoveResult
	err := c.call(http.MethodDelete, "/nodes/"+url.PathEscape(nodeID), &r)
	return r, err
}

// Restore asks the running Edge to lift the removal of nodeID.
func (c *SocketClient) Restore(nodeID string) (RestoreResult, error) {
	var r RestoreResult
	err := c.call(http.MethodPost, "/nodes/"+url.PathEscape(nodeID)+"/restore", &r)
	return r, err
}

// AuditLog asks the running Edge for a page of the audit log: at most
// limit entries older than entry before (0: the newest), newest first.
func (c *SocketClient) AuditLog(before int64, limit int) ([]AuditEntry, error) {
	var page []AuditEntry
	err := c.call(http.MethodGet, fmt.Sprintf("/audit?before=%d&limit=%d", before, limit), &page)
	return page, err
}

// List asks the running Edge for its Nodes. The answer is as long as the
// store: it is decoded as a stream, a Node at a time, with no bound but
// the http.Client's timeout.
func (c *SocketClient) List() ([]NodeStatus, error) {
	resp, err := c.do(http.MethodGet, "/nodes")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	dec := json.NewDecoder(resp.Body)
	if tok, err := dec.Token(); err != nil || tok != json.Delim('[') {
		return nil, fmt.Errorf("admin socket: the list of nodes is not a JSON array (%v)", err)
	}
	var list []NodeStatus
	for dec.More() {
		var n NodeStatus
		if err := dec.Decode(&n); err != nil {
			return nil, fmt.Errorf("admin socket: node %d of the list: %w", len(list)+1, err)
		}
		list = append(list, n)
	}
	if _, err := dec.Token(); err != nil {
		return nil, fmt.Errorf("admin socket: the list of nodes ends early: %w", err)
	}
	return list, nil
}
