package ollama

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/iop-dev/iop/internal/fakes/fakeollama"
	"github.com/iop-dev/iop/sdk"
)

const chatBody = `{"model":"m","messages":[{"role":"user","content":"hi"}]}`

func tunnelReq(method, path, body string) *sdk.TunnelRequest {
	h := http.Header{"Content-Type": {"application/json"}}
	if body != "" {
		h.Set("Content-Length", strconv.Itoa(len(body)))
	}
	return &sdk.TunnelRequest{TunnelID: "t1", Method: method, Path: path, Header: h, Body: strings.NewReader(body)}
}

// TestTunnelRelaysStreamingChatIncrementally is SPEC R3 at the adapter: the
// NDJSON answer reaches the host byte for byte, each line as Ollama flushed
// it, not all at the end.
func TestTunnelRelaysStreamingChatIncrementally(t *testing.T) {
	const lines, delay = 6, 50 * time.Millisecond
	f := newFake(t, fakeollama.Model{Name: "m", TokenCount: lines, TokenDelay: delay})
	a := newAdapter(t, f.URL(), nil)
	var rec tunnelRecorder
	if err := a.Tunnel(ctxTimeout(t, 5*time.Second), tunnelReq("POST", "/api/chat", chatBody), &rec); err != nil {
		t.Fatal(err)
	}
	sent := lastRequest(t, f).Response
	if rec.status != 200 || rec.heads != 1 || !bytes.Equal(rec.body(), sent) || bytes.Count(sent, []byte("\n")) != lines+1 {
		t.Fatalf("status %d heads %d; relayed %q\nsent %q", rec.status, rec.heads, rec.body(), sent)
	}
	if ct := rec.header.Get("Content-Type"); ct != "application/x-ndjson" {
		t.Fatalf("content type %q", ct)
	}
	if _, ok := rec.header["Transfer-Encoding"]; ok {
		t.Fatal("hop-by-hop Transfer-Encoding relayed")
	}
	if len(rec.writes) < lines {
		t.Fatalf("%d writes for %d lines: the body was buffered", len(rec.writes), lines+1)
	}
	if spread := rec.at[len(rec.at)-1].Sub(rec.at[0]); spread < (lines-1)*delay/2 {
		t.Fatalf("writes spread over %v only: lines did not arrive as they were flushed", spread)
	}
	if first := rec.writes[0]; !bytes.HasSuffix(first, []byte("\n")) || bytes.Count(first, []byte("\n")) != 1 {
		t.Fatalf("first write %q is not exactly the first line", first)
	}
}

func TestTunnelHeadersAndCredential(t *testing.T) {
	f := newFake(t, fakeollama.Model{Name: "m"})
	a := newAdapter(t, f.URL(), map[string]any{"headers": map[string]string{"X-Static": "yes"}})
	req := tunnelReq("POST", "/api/chat?trace=1", chatBody)
	req.Header.Set("Authorization", "Bearer edge-api-key")
	req.Header.Set("Connection", "keep-alive, X-Per-Hop")
	req.Header.Set("X-Per-Hop", "drop me")
	req.Header.Set("Proxy-Authorization", "Basic x")
	req.Header.Set("Te", "trailers")
	req.Header.Set("X-Client", "kept")
	req.Header.Set("User-Agent", "ollama/0.17.4")

	var rec tunnelRecorder
	if err := a.Tunnel(ctxTimeout(t, 5*time.Second), req, &rec); err != nil {
		t.Fatal(err)
	}
	got := lastRequest(t, f)
	h := got.Header
	if h.Get("X-Client") != "kept" || h.Get("X-Static") != "yes" || h.Get("User-Agent") != "ollama/0.17.4" || got.Query != "trace=1" {
		t.Fatalf("headers %v query %q", h, got.Query)
	}
	for _, k := range []string{"Authorization", "X-Per-Hop", "Proxy-Authorization", "Te"} {
		if _, ok := h[k]; ok {
			t.Errorf("%s relayed", k)
		}
	}
	if string(got.Body) != chatBody {
		t.Fatalf("body %q", got.Body)
	}

	req = tunnelReq("GET", "/api/tags", "")
	req.Credential = &sdk.Credential{Kind: "bearer", Secret: "lease-secret"}
	if err := a.Tunnel(ctxTimeout(t, 5*time.Second), req, &tunnelRecorder{}); err != nil {
		t.Fatal(err)
	}
	got = lastRequest(t, f)
	if got.Header.Get("Authorization") != "Bearer lease-secret" || got.Method != "GET" || len(got.Body) != 0 {
		t.Fatalf("request %s %v body %q", got.Method, got.Header, got.Body)
	}
	if _, ok := got.Header["User-Agent"]; ok {
		t.Fatal("a User-Agent was invented")
	}
}

func TestTunnelStreamsRequestBodyOfUnknownLength(t *testing.T) {
	f := newFake(t, fakeollama.Model{Name: "m"})
	a := newAdapter(t, f.URL(), nil)
	pr, pw := io.Pipe()
	go func() {
		for _, part := range []string{chatBody[:10], chatBody[10:30], chatBody[30:]} {
			_, _ = pw.Write([]byte(part))
			time.Sleep(10 * time.Millisecond)
		}
		_ = pw.Close()
	}()
	req := &sdk.TunnelRequest{Method: "POST", Path: "/api/chat", Header: http.Header{}, Body: pr}
	var rec tunnelRecorder
	if err := a.Tunnel(ctxTimeout(t, 5*time.Second), req, &rec); err != nil {
		t.Fatal(err)
	}
	if got := lastRequest(t, f); string(got.Body) != chatBody || rec.status != 200 {
		t.Fatalf("body %q status %d", got.Body, rec.status)
	}
}

func TestTunnelRelaysErrorStatusAsAnAnswer(t *testing.T) {
	f := newFake(t)
	a := newAdapter(t, f.URL(), nil)
	var rec tunnelRecorder
	if err := a.Tunnel(ctxTimeout(t, 5*time.Second), tunnelReq("POST", "/api/chat", chatBody), &rec); err != nil {
		t.Fatal(err)
	}
	if rec.status != 404 || string(rec.body()) != `{"error":"model \"m\" not found, try pulling it first"}` {
		t.Fatalf("status %d body %q", rec.status, rec.body())
	}
}

func TestTunnelConnectionRefusedIsUnavailable(t *testing.T) {
	f := fakeollama.New()
	url := f.URL()
	f.Close()
	a := newAdapter(t, url, nil)
	var rec tunnelRecorder
	err := a.Tunnel(ctxTimeout(t, 5*time.Second), tunnelReq("GET", "/api/tags", ""), &rec)
	if !errors.Is(err, sdk.ErrUnavailable) || rec.heads != 0 {
		t.Fatalf("err %v, heads %d", err, rec.heads)
	}
}

func TestTunnelCancelMidStreamReachesOllama(t *testing.T) {
	f := newFake(t, fakeollama.Model{Name: "m", TokenCount: 1000, TokenDelay: 20 * time.Millisecond})
	a := newAdapter(t, f.URL(), nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rec := &cancelOnWrite{cancel: cancel}
	err := a.Tunnel(ctx, tunnelReq("POST", "/api/chat", chatBody), rec)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v", err)
	}
	gone, err := f.WaitForDisconnect(ctxTimeout(t, 2*time.Second), lastRequest(t, f).ID)
	if err != nil {
		t.Fatal(err)
	}
	if d := gone.Sub(rec.at); d > 100*time.Millisecond {
		t.Fatalf("disconnect seen %v after the cancel", d)
	}
}

type cancelOnWrite struct {
	tunnelRecorder
	cancel func()
	at     time.Time
}

func (c *cancelOnWrite) Write(p []byte) (int, error) {
	if c.at.IsZero() {
		c.at = time.Now()
		c.cancel()
	}
	return c.tunnelRecorder.Write(p)
}

// The route is the configured base URL and headers, with a lent
// credential presented as a bearer key (sdk.RelayTunnel applies it).
func TestTunnelRouteIsTheConfiguredServer(t *testing.T) {
	a := New()
	if err := a.Configure(context.Background(), sdk.Config(`{"base_url":"http://ollama.internal:8080/prefix/","headers":{"X-Team":"a"}}`)); err != nil {
		t.Fatal(err)
	}
	r, err := a.TunnelRoute(context.Background())
	if err != nil || r.Validate() != nil {
		t.Fatalf("route %+v: %v / %v", r, err, r.Validate())
	}
	if r.BaseURL != "http://ollama.internal:8080/prefix" || r.Header.Get("X-Team") != "a" || !r.Bearer {
		t.Errorf("route %+v", r)
	}
	if r.Loaded != sdk.LoadedOllamaPS { // issue 23: the Node reads /api/ps along it
		t.Errorf("route's loaded report %q, want %q", r.Loaded, sdk.LoadedOllamaPS)
	}
	if err := a.Tunnel(context.Background(), &sdk.TunnelRequest{Method: "CONNECT", Path: "/", Header: http.Header{}, Body: http.NoBody}, &tunnelRecorder{}); !errors.Is(err, sdk.ErrInvalidRequest) {
		t.Errorf("CONNECT: %v", err)
	}
}
