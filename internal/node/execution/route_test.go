package execution

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/iop-dev/iop/quicwire/wirepb"
	"github.com/iop-dev/iop/sdk"
)

// routePlugin is a fake plugin that gives a route and no Tunnel of its
// own: every tunnel must be relayed by the Node.
type routePlugin struct {
	*fakePlugin
	route   *sdk.TunnelRoute
	tunnels atomic.Int32
}

func newRoutePlugin(baseURL string) *routePlugin {
	return &routePlugin{fakePlugin: newFakePlugin(nil),
		route: &sdk.TunnelRoute{BaseURL: baseURL, Header: http.Header{"X-Static": {"s"}}, Bearer: true}}
}

func (p *routePlugin) Capabilities() []string { return []string{sdk.CapTunnelRoute} }
func (p *routePlugin) TunnelRoute(context.Context) (*sdk.TunnelRoute, error) {
	return p.route, nil
}
func (p *routePlugin) Tunnel(context.Context, *wirepb.TunnelRequest, *sdk.Credential, io.Reader, func(*wirepb.TunnelFrame) error) error {
	p.tunnels.Add(1)
	return sdk.ErrUnsupported
}

// R3 with a route: the Node sends the request itself (path under the base
// URL, the route's headers and bearer key, not the client's hop-by-hop
// headers or Authorization), and relays the answer as head, body and one
// terminal; the plugin's Tunnel is never called.
func TestRoutedTunnelIsRelayedByTheNode(t *testing.T) {
	var got struct {
		path, static, auth, conn, body string
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got.path, got.static, got.auth, got.conn, got.body = r.URL.RequestURI(), r.Header.Get("X-Static"), r.Header.Get("Authorization"), r.Header.Get("X-Hop"), string(b)
		w.Header().Set("Content-Type", "application/x-ndjson")
		w.WriteHeader(201)
		for i := range 3 {
			fmt.Fprintf(w, "{\"n\":%d}\n", i)
			w.(http.Flusher).Flush()
		}
	}))
	defer srv.Close()
	pl := newRoutePlugin(srv.URL + "/base")
	_, h := onlineSet(t, 1, pl)
	req := tunnelReq("t1")
	req.Path = "/api/chat?x=1"
	req.Headers = []*wirepb.Header{{Name: "Authorization", Value: "Bearer client-key"}, {Name: "Connection", Value: "X-Hop"}, {Name: "X-Hop", Value: "1"}}
	st := newFakeTunnelStream(true, `{"model":`, `"m"}`)
	serveTunnelOn(h, t.Context(), req, st)

	sent, _ := st.frames()
	head, body, term := requireTunnelOrder(t, sent)
	if head.GetStatus() != 201 || string(body) != "{\"n\":0}\n{\"n\":1}\n{\"n\":2}\n" || term.GetOutcome() != wirepb.TunnelOutcome_TUNNEL_OUTCOME_COMPLETED {
		t.Errorf("head %v body %q terminal %v", head, body, term)
	}
	if got.path != "/base/api/chat?x=1" || got.static != "s" || got.auth != "" || got.conn != "" || got.body != `{"model":"m"}` {
		t.Errorf("the server saw %+v", got)
	}
	if pl.tunnels.Load() != 0 {
		t.Error("the plugin's Tunnel was called")
	}
}

// Issue 25, the first byte never held: a head that came with the first
// part of its body (as a streamed answer's first token comes, in one
// segment) goes to the Edge with it in one write, so both cross in one
// packet; a head whose body has not come goes at once, before the relay
// waits for the body; a head without a body goes before the terminal.
func TestARelayedHeadGoesWithTheBodyThatCameWithIt(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		switch r.URL.Path {
		case "/together":
			fmt.Fprintln(w, `{"n":0}`) // the head and this line leave in one flush
			w.(http.Flusher).Flush()
			fmt.Fprintln(w, `{"n":1}`)
		case "/apart":
			w.WriteHeader(200)
			w.(http.Flusher).Flush() // the head alone; the body waits
			<-release
			fmt.Fprintln(w, `{"n":0}`)
		case "/empty":
			w.WriteHeader(204)
		}
	}))
	defer srv.Close()
	_, h := onlineSet(t, 1, newRoutePlugin(srv.URL))
	relay := func(path string) *fakeTunnelStream {
		req := tunnelReq("t-" + path)
		req.Path = path
		st := newFakeTunnelStream(true)
		serveTunnelOn(h, t.Context(), req, st)
		return st
	}

	st := relay("/together")
	sent, _ := st.frames()
	if head, body, term := requireTunnelOrder(t, sent); head.GetStatus() != 200 || string(body) != "{\"n\":0}\n{\"n\":1}\n" || term.GetOutcome() != wirepb.TunnelOutcome_TUNNEL_OUTCOME_COMPLETED {
		t.Fatalf("together: head %v body %q terminal %v", head, body, term)
	}
	if w := st.writeSizes(); w[0] != 2 || sent[1].GetBody() == nil {
		t.Errorf("together: writes of %v frames (%v); want the head and the first body frame in the first", w, sent)
	}

	req := tunnelReq("t-apart")
	req.Path = "/apart"
	st = newFakeTunnelStream(true)
	done := make(chan struct{})
	go func() {
		defer close(done)
		serveTunnelOn(h, t.Context(), req, st)
	}()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		if sent, _ := st.frames(); len(sent) == 1 && sent[0].GetHead().GetStatus() == 200 {
			break // the head went while the body had not come
		}
		if time.Now().After(deadline) {
			sent, _ := st.frames()
			close(release)
			t.Fatalf("apart: the head was not sent before the body came: %v", sent)
		}
	}
	close(release)
	<-done
	sent, _ = st.frames()
	if _, body, term := requireTunnelOrder(t, sent); string(body) != "{\"n\":0}\n" || term.GetOutcome() != wirepb.TunnelOutcome_TUNNEL_OUTCOME_COMPLETED {
		t.Errorf("apart: body %q terminal %v", body, term)
	}

	st = relay("/empty")
	sent, _ = st.frames()
	if head, body, term := requireTunnelOrder(t, sent); head.GetStatus() != 204 || len(body) != 0 || term.GetOutcome() != wirepb.TunnelOutcome_TUNNEL_OUTCOME_COMPLETED {
		t.Errorf("empty: head %v body %q terminal %v", head, body, term)
	}
}

// An unreachable server fails the tunnel as provider_unavailable and
// retryable, before any head.
func TestRoutedTunnelToAnUnreachableServer(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close()
	_, h := onlineSet(t, 1, newRoutePlugin(url))
	st := newFakeTunnelStream(true)
	serveTunnelOn(h, t.Context(), tunnelReq("t1"), st)
	sent, _ := st.frames()
	if len(sent) != 1 {
		t.Fatalf("frames %v, want only the terminal", sent)
	}
	f := sent[0].GetTerminal().GetFailure()
	if f.GetKind() != wirepb.FailureKind_FAILURE_KIND_PROVIDER_UNAVAILABLE || !f.GetRetryable() || !strings.Contains(f.GetMessage(), "unreachable") {
		t.Errorf("terminal %v", sent[0])
	}
}

// The Edge's cancel reaches the server: the Node's request is cancelled
// and the tunnel ends cancelled, exactly once.
func TestRoutedTunnelCancelReachesTheServer(t *testing.T) {
	gone := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(200)
		fmt.Fprintln(w, `{"n":0}`)
		w.(http.Flusher).Flush()
		<-r.Context().Done()
		close(gone)
	}))
	defer srv.Close()
	_, h := onlineSet(t, 1, newRoutePlugin(srv.URL))
	st := newFakeTunnelStream(true)
	done := make(chan struct{})
	go func() {
		defer close(done)
		serveTunnelOn(h, t.Context(), tunnelReq("t1"), st)
	}()
	for {
		if sent, _ := st.frames(); len(sent) >= 2 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	st.cancel()
	<-done
	select {
	case <-gone:
	case <-time.After(10 * time.Second):
		t.Fatal("the server's request was not cancelled")
	}
	_, refused := st.frames()
	if len(refused) != 1 || refused[0].GetTerminal().GetOutcome() != wirepb.TunnelOutcome_TUNNEL_OUTCOME_CANCELLED {
		t.Errorf("after the cancel: %v, want one cancelled terminal", refused)
	}
}
