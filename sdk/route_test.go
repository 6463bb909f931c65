package sdk

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"
)

// A relayed path stays on the server: it is joined under the base URL's
// path, and anything that could steer it elsewhere is refused.
func TestRouteURLStaysOnTheServer(t *testing.T) {
	for path, want := range map[string]string{
		"/api/tags":            "http://ollama.internal:8080/prefix/api/tags",
		"/api/show?verbose=1":  "http://ollama.internal:8080/prefix/api/show?verbose=1",
		"/api/blobs/sha256%3A": "http://ollama.internal:8080/prefix/api/blobs/sha256%3A",
	} {
		for _, base := range []string{"http://ollama.internal:8080/prefix", "http://ollama.internal:8080/prefix/"} {
			if got, err := routeURL(base, path); err != nil || got != want {
				t.Errorf("%s + %s → %s %v, want %s", base, path, got, err, want)
			}
		}
	}
	for _, bad := range []string{"http://evil/api", "//evil/api", "api/tags", "/api/../../admin", ""} {
		if _, err := routeURL("http://h", bad); !errors.Is(err, ErrInvalidRequest) {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestTunnelRouteValidate(t *testing.T) {
	for _, r := range []*TunnelRoute{
		nil,
		{BaseURL: "ftp://h"},
		{BaseURL: "http://"},
		{BaseURL: "http://u:p@h"},
		{BaseURL: "http://h?x=1"},
		{BaseURL: "http://h", Header: http.Header{"Bad Name": {"v"}}},
		{BaseURL: "http://h", Header: http.Header{"X-A": {"a\r\nInjected: 1"}}},
	} {
		if r.Validate() == nil {
			t.Errorf("route %+v accepted", r)
		}
	}
	if err := (&TunnelRoute{BaseURL: "https://h:8443/v1", Header: http.Header{"X-Org": {"o"}}}).Validate(); err != nil {
		t.Errorf("a good route refused: %v", err)
	}
}

type recordedResponse struct {
	status int
	body   strings.Builder
}

func (r *recordedResponse) WriteHeader(status int, _ http.Header) error {
	r.status = status
	return nil
}

func (r *recordedResponse) Write(p []byte) (int, error) { return r.body.Write(p) }

// A lent credential goes only where the route says, as a bearer key; a
// route that presents none refuses it rather than drop it silently.
func TestRelayTunnelCredential(t *testing.T) {
	var auth string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		auth = r.Header.Get("Authorization")
		io.WriteString(w, "ok")
	}))
	defer srv.Close()
	req := func(c *Credential) *TunnelRequest {
		return &TunnelRequest{Method: "GET", Path: "/", Header: http.Header{"Authorization": {"Bearer client"}}, Body: http.NoBody, Credential: c}
	}
	resp := &recordedResponse{}
	if err := RelayTunnel(context.Background(), srv.Client(), &TunnelRoute{BaseURL: srv.URL, Bearer: true}, req(&Credential{Kind: "bearer", Secret: "upstream"}), resp); err != nil || auth != "Bearer upstream" || resp.body.String() != "ok" {
		t.Errorf("bearer: err %v, server saw %q, body %q", err, auth, resp.body.String())
	}
	if err := RelayTunnel(context.Background(), srv.Client(), &TunnelRoute{BaseURL: srv.URL}, req(nil), &recordedResponse{}); err != nil || auth != "" {
		t.Errorf("no credential: err %v, the client's key reached the server: %q", err, auth)
	}
	for _, c := range []struct {
		route *TunnelRoute
		cred  *Credential
	}{
		{&TunnelRoute{BaseURL: srv.URL}, &Credential{Secret: "s"}},
		{&TunnelRoute{BaseURL: srv.URL, Bearer: true}, &Credential{Kind: "basic", Secret: "s"}},
		{&TunnelRoute{BaseURL: srv.URL, Bearer: true}, &Credential{Secret: "s\r\nX: 1"}},
	} {
		if err := RelayTunnel(context.Background(), srv.Client(), c.route, req(c.cred), &recordedResponse{}); !errors.Is(err, ErrInvalidRequest) {
			t.Errorf("route %+v with %+v: %v, want invalid_request", c.route, c.cred, err)
		}
	}
}

// writesResponse records the size of each write.
type writesResponse struct {
	recordedResponse
	writes []int
	wrote  chan struct{} // told of each write, when not nil
}

func (r *writesResponse) Write(p []byte) (int, error) {
	r.writes = append(r.writes, len(p))
	if r.wrote != nil {
		r.wrote <- struct{}{}
	}
	return r.recordedResponse.Write(p)
}

// Issue 25: a relay reads into a small buffer while the server's pieces
// are small (a line each, written one by one), and a read that fills it
// moves it to the large one, so a large answer that is all there crosses
// in few writes; every byte arrives in order either way.
func TestRelayTunnelReadsGrowWhenMoreIsReady(t *testing.T) {
	big := strings.Repeat("0123456789abcdef", 16<<10) // 256 KiB
	wrote := make(chan struct{}, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/lines" {
			for i := range 3 {
				fmt.Fprintf(w, "{\"line\":%d}\n", i)
				w.(http.Flusher).Flush()
				<-wrote // the next line once the relay has passed this one on
			}
			return
		}
		io.WriteString(w, big)
	}))
	defer srv.Close()
	relay := func(path string) *writesResponse {
		resp := &writesResponse{}
		if path == "/lines" {
			resp.wrote = wrote
		}
		req := &TunnelRequest{Method: "GET", Path: path, Body: http.NoBody}
		if err := RelayTunnel(context.Background(), srv.Client(), &TunnelRoute{BaseURL: srv.URL}, req, resp); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		return resp
	}
	lines := relay("/lines")
	if lines.body.String() != "{\"line\":0}\n{\"line\":1}\n{\"line\":2}\n" || len(lines.writes) != 3 {
		t.Errorf("lines: writes %v, body %q; want one write per line", lines.writes, lines.body.String())
	}
	whole := relay("/big")
	if whole.body.String() != big {
		t.Fatalf("the large answer changed on the way: %d bytes of %d", whole.body.Len(), len(big))
	}
	if most := slices.Max(whole.writes); most <= tunnelReadFirst || most > tunnelRead {
		t.Errorf("the large answer's writes %v: the largest %d, want above the first buffer (%d) and at most %d", whole.writes, most, tunnelReadFirst, tunnelRead)
	}
}

// A body with a Content-Length is sent once that much has been read: the
// relay does not wait for its end (the Node's body ends with a FIN that
// may come in a packet of its own). The round tripper here writes the
// whole request before it reads the answer, as the Node's relay does
// (net/http's Transport reads the answer while it writes, which would hide
// a wait); the body's reader never ends, until the test gives up on it.
func TestRelayTunnelSendsABodyOfItsLengthWithoutWaitingForItsEnd(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "got %s", b)
	}))
	defer srv.Close()
	pr, pw := io.Pipe()
	go func() { _, _ = io.WriteString(pw, `{"a":1}`) }() // and never the end
	giveUp := time.AfterFunc(10*time.Second, func() { pw.CloseWithError(errors.New("the relay waited for the body's end")) })
	defer giveUp.Stop()
	writeThenRead := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		c, err := net.Dial("tcp", srv.Listener.Addr().String())
		if err != nil {
			return nil, err
		}
		t.Cleanup(func() { c.Close() })
		if err := r.Write(c); err != nil {
			return nil, err
		}
		return http.ReadResponse(bufio.NewReader(c), r)
	})
	req := &TunnelRequest{Method: http.MethodPost, Path: "/api/chat", Body: pr,
		Header: http.Header{"Content-Length": {"7"}}}
	var resp recordedResponse
	if err := RelayTunnelTransport(t.Context(), writeThenRead, &TunnelRoute{BaseURL: srv.URL}, req, &resp); err != nil {
		t.Fatal(err)
	}
	if resp.status != 200 || resp.body.String() != `got {"a":1}` {
		t.Fatalf("answer %d %q", resp.status, resp.body.String())
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
