package registrar

import (
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

// AddToken makes a token for nodeID valid for ttl.
func (s *Service) AddToken(nodeID string, ttl time.Duration) (TokenResult, error) {
	tok, exp, err := s.NewToken(nodeID, ttl)
	if err != nil {
		return TokenResult{}, err
	}
	return TokenResult{NodeID: nodeID, Token: tok.String(), Expires: exp, CAHash: tok.CAHashString()}, nil
}

// Handler is the admin socket's API: POST /nodes/{id}/tokens?ttl=D,
// DELETE /nodes/{id}, GET /nodes.
func (s *Service) Handler() http.Handler {
	mux := http.NewServeMux()
	reply := func(w http.ResponseWriter, v any, err error) {
		w.Header().Set("Content-Type", "application/json")
		if err != nil {
			code := http.StatusBadRequest
			if errors.Is(err, ErrUnknownNode) {
				code = http.StatusNotFound
			}
			w.WriteHeader(code)
			_ = json.NewEncoder(w).Encode(map[string]string{"error": err.Error()})
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
		res, err := s.AddToken(r.PathValue("id"), ttl)
		reply(w, res, err)
	})
	mux.HandleFunc("DELETE /nodes/{id}", func(w http.ResponseWriter, r *http.Request) {
		revoked, fenced, err := s.Remove(r.PathValue("id"))
		reply(w, RemoveResult{NodeID: r.PathValue("id"), Revoked: revoked, Fenced: fenced}, err)
	})
	mux.HandleFunc("GET /nodes", func(w http.ResponseWriter, r *http.Request) {
		list, err := s.List()
		reply(w, list, err)
	})
	return http.MaxBytesHandler(mux, maxSocketBody)
}

// ServeSocket serves Handler on ln until ctx ends.
func (s *Service) ServeSocket(ctx context.Context, ln net.Listener, log *slog.Logger) {
	srv := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 5 * time.Second, WriteTimeout: 10 * time.Second}
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

func (c *SocketClient) call(method, path string, out any) error {
	req, err := http.NewRequest(method, "http://edged"+path, nil)
	if err != nil {
		return err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ECONNREFUSED) {
			return ErrNoEdge
		}
		return fmt.Errorf("admin socket: %w", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		var e struct{ Error string }
		if json.Unmarshal(body, &e) == nil && e.Error != "" {
			if resp.StatusCode == http.StatusNotFound {
				return &remoteError{msg: e.Error, is: ErrUnknownNode}
			}
			return errors.New(e.Error)
		}
		return fmt.Errorf("admin socket: %s", resp.Status)
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

// List asks the running Edge for its Nodes.
func (c *SocketClient) List() ([]NodeStatus, error) {
	var r []NodeStatus
	err := c.call(http.MethodGet, "/nodes", &r)
	return r, err
}
