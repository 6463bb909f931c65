package openai_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/iop-dev/iop/internal/fakes/fakeopenai"
	"github.com/iop-dev/iop/sdk"
)

// tunnelRecorder is a TunnelResponse that records what it receives and
// signals every write.
type tunnelRecorder struct {
	mu     sync.Mutex
	status int
	header http.Header
	writes []string
	wrote  chan string
}

func newTunnelRecorder() *tunnelRecorder { return &tunnelRecorder{wrote: make(chan string, 64)} }

func (r *tunnelRecorder) WriteHeader(status int, h http.Header) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.status, r.header = status, h
	return nil
}

func (r *tunnelRecorder) Write(p []byte) (int, error) {
	r.mu.Lock()
	r.writes = append(r.writes, string(p))
	r.mu.Unlock()
	r.wrote <- string(p)
	return len(p), nil
}

func (r *tunnelRecorder) body() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Join(r.writes, "")
}

func tunnelReq(method, path, body string, h http.Header) *sdk.TunnelRequest {
	if h == nil {
		h = http.Header{}
	}
	return &sdk.TunnelRequest{TunnelID: "t1", Method: method, Path: path, Header: h, Body: strings.NewReader(body)}
}

func TestTunnelFlushesEveryChunkAsTheServerSendsIt(t *testing.T) {
	next := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range 3 {
			fmt.Fprintf(w, "data: %d\n\n", i)
			w.(http.Flusher).Flush()
			if i < 2 {
				<-next // the next chunk only once the previous one was relayed
			}
		}
	}))
	defer srv.Close()
	a := configured(t, srv.URL+"/v1")
	rec := newTunnelRecorder()
	errc := make(chan error, 1)
	go func() {
		errc <- a.Tunnel(t.Context(), tunnelReq("POST", "/chat/completions", `{"stream":true}`, nil), rec)
	}()
	var got []string
	for i := range 3 {
		select {
		case w := <-rec.wrote:
			got = append(got, w)
		case <-time.After(5 * time.Second):
			t.Fatalf("chunk %d was not relayed before the next was sent", i)
		}
		if i < 2 {
			next <- struct{}{}
		}
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if strings.Join(got, "") != "data: 0\n\ndata: 1\n\ndata: 2\n\n" || rec.status != 200 {
		t.Errorf("status %d, writes %q", rec.status, got)
	}
}

func TestTunnelDropsHopByHopHeadersAndTheClientsKey(t *testing.T) {
	var seen http.Header
	var seenTE []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen, seenTE = r.Header.Clone(), r.TransferEncoding
		w.Header().Set("Keep-Alive", "timeout=5")
		w.Header().Set("X-Answer", "1")
		w.WriteHeader(http.StatusTeapot)
	}))
	defer srv.Close()
	a := configured(t, srv.URL+"/v1")
	h := http.Header{}
	h.Set("Connection", "X-Hop")
	h.Set("X-Hop", "1")
	h.Set("Keep-Alive", "300")
	h.Set("Upgrade", "websocket")
	h.Set("Proxy-Authorization", "Basic x")
	h.Set("Authorization", "Bearer edge-client-key")
	h.Set("X-Keep", "yes")
	req := tunnelReq("GET", "/models?x=1", "", h)
	req.Credential = &sdk.Credential{Kind: "bearer", Secret: "sk-lease"}
	rec := newTunnelRecorder()
	if err := a.Tunnel(t.Context(), req, rec); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"Connection", "X-Hop", "Keep-Alive", "Upgrade", "Proxy-Authorization"} {
		if v := seen.Get(name); v != "" {
			t.Errorf("server received %s: %q", name, v)
		}
	}
	if seen.Get("Authorization") != "Bearer sk-lease" || seen.Get("X-Keep") != "yes" {
		t.Errorf("server headers %v", seen)
	}
	if len(seenTE) != 0 {
		t.Errorf("an empty GET was sent with transfer encoding %v", seenTE)
	}
	if rec.status != http.StatusTeapot || rec.header.Get("X-Answer") != "1" || rec.header.Get("Keep-Alive") != "" {
		t.Errorf("relayed %d %v", rec.status, rec.header)
	}
}

func TestTunnelReachesTheFakeUnderBaseURL(t *testing.T) {
	s := startFake(t, fakeopenai.Config{Models: []fakeopenai.Model{{Name: "m", Tokens: []string{"a", "b"}}}})
	a := configured(t, s.BaseURL())
	rec := newTunnelRecorder()
	body := `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	h := http.Header{"Content-Type": {"application/json"}, "Content-Length": {fmt.Sprint(len(body))}}
	if err := a.Tunnel(t.Context(), tunnelReq("POST", "/chat/completions", body, h), rec); err != nil {
		t.Fatal(err)
	}
	got := s.Requests()[0]
	if got.Path != "/v1/chat/completions" || string(got.Body) != body {
		t.Errorf("server got %s %q", got.Path, got.Body)
	}
	var data []string
	sc := bufio.NewScanner(strings.NewReader(rec.body()))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			data = append(data, v)
		}
	}
	if len(data) != 4 || data[3] != "[DONE]" || !strings.Contains(rec.header.Get("Content-Type"), "text/event-stream") {
		t.Errorf("relayed %q with %v", data, rec.header)
	}
}

func TestTunnelFailures(t *testing.T) {
	refused := httptest.NewServer(http.NotFoundHandler())
	refusedURL := refused.URL + "/v1"
	refused.Close()
	tests := []struct {
		name string
		base string
		path string
		want error
	}{
		{"server refuses the connection", refusedURL, "/models", sdk.ErrUnavailable},
		{"path without a slash", refusedURL, "models", sdk.ErrInvalidRequest},
		{"path naming another host", refusedURL, "//evil.example/models", sdk.ErrInvalidRequest},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := configured(t, tt.base).Tunnel(t.Context(), tunnelReq("GET", tt.path, "", nil), newTunnelRecorder())
			if !errors.Is(err, tt.want) {
				t.Errorf("err = %v, want %v", err, tt.want)
			}
		})
	}
}

func TestTunnelCancelClosesTheUpstreamRequest(t *testing.T) {
	s := startFake(t, fakeopenai.Config{Models: []fakeopenai.Model{{Name: "m", Stall: true, StallAfter: 1}}})
	a := configured(t, s.BaseURL())
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	rec := newTunnelRecorder()
	errc := make(chan error, 1)
	body := `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	go func() { errc <- a.Tunnel(ctx, tunnelReq("POST", "/chat/completions", body, nil), rec) }()
	select {
	case <-rec.wrote:
	case <-time.After(5 * time.Second):
		t.Fatal("no chunk relayed")
	}
	cancel()
	wait, stop := context.WithTimeout(t.Context(), 5*time.Second)
	defer stop()
	select {
	case err := <-errc:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Tunnel returned %v", err)
		}
	case <-wait.Done():
		t.Fatal("Tunnel did not return after the cancel")
	}
	if _, err := s.WaitGone(wait, 1); err != nil {
		t.Fatal("the server never saw the tunnel leave")
	}
}

// Issue 23: an OpenAI-compatible server keeps the models it serves
// loaded, and its route says so: the Node reports every target warm.
func TestTunnelRouteSaysEveryModelIsLoaded(t *testing.T) {
	r, err := configured(t, "http://vllm.internal:8000/v1").TunnelRoute(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if r.Loaded != sdk.LoadedAll {
		t.Errorf("route's loaded report %q, want %q", r.Loaded, sdk.LoadedAll)
	}
}
