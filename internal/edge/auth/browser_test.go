package auth

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/iop-dev/iop/internal/edge/edgeconfig"
)

// browserConfig is keyedConfig with anonymous access (the loopback setup with keys), the LAN
// 192.168.1.0/24 trusted as "lan", the name edge.lan allowed as Host and the page
// https://chat.example allowed as an origin.
func browserConfig() *edgeconfig.Config {
	c := keyedConfig(true)
	c.Principals = append(c.Principals, edgeconfig.Principal{Name: "lan", Routes: []string{"llama"}})
	c.API.TrustedNetworks = []edgeconfig.TrustedNetwork{{CIDR: "192.168.1.0/24", Principal: "lan"}}
	c.API.AllowedHosts = []string{"edge.lan"}
	c.API.AllowedOrigins = []string{"https://chat.example"}
	return c
}

// recorded are the refusals a boundary reported, by kind.
type recorded struct {
	mu    sync.Mutex
	kinds []string
}

func (r *recorded) refuse(kind, _ string, _ ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.kinds = append(r.kinds, kind)
}

// edgeBoundary is a's Boundary around a handler that answers 200 "served", with the Edge's open
// paths and admin reads.
func edgeBoundary(a *Authenticator, rec *recorded) http.Handler {
	opts := BoundaryOptions{
		Public: []string{"GET /healthz", "GET /readyz", "GET /{$}", "GET /status", "GET /status/"},
		Reads:  []string{"GET /admin/", "GET /metrics"},
	}
	if rec != nil {
		opts.Refuse = rec.refuse
	}
	return a.Boundary(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "served")
	}), opts)
}

// browserRequest is one request through the boundary.
type browserRequest struct {
	method, path string
	host         string            // "" is 127.0.0.1:8080
	remote       string            // "" is 127.0.0.1:50000
	header       map[string]string // Origin, Sec-Fetch-Site, Content-Type, Authorization...
	body         string
}

func (br browserRequest) serve(h http.Handler) *httptest.ResponseRecorder {
	method := br.method
	if method == "" {
		method = http.MethodPost
	}
	var body io.Reader
	if br.body != "" {
		body = strings.NewReader(br.body)
	}
	r := httptest.NewRequest(method, br.path, body)
	r.Host = "127.0.0.1:8080"
	if br.host != "" {
		r.Host = br.host
	}
	if br.host == "-" {
		r.Host = ""
	}
	r.RemoteAddr = "127.0.0.1:50000"
	if br.remote != "" {
		r.RemoteAddr = br.remote
	}
	for k, v := range br.header {
		r.Header.Set(k, v)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

const chatBody = `{"model":"llama","messages":[{"role":"user","content":"hi"}]}`

var (
	asJSON    = map[string]string{"Content-Type": "application/json"}
	withKey   = map[string]string{"Content-Type": "application/json", "Authorization": "Bearer " + aliceKey}
	crossJSON = map[string]string{"Content-Type": "application/json", "Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"}
)

// with is h plus extra headers.
func with(h map[string]string, kv ...string) map[string]string {
	out := make(map[string]string, len(h)+len(kv)/2)
	for k, v := range h {
		out[k] = v
	}
	for i := 0; i+1 < len(kv); i += 2 {
		out[kv[i]] = kv[i+1]
	}
	return out
}

// Issue 24, gap 1: a request let in without a key (anonymous, a trusted network, the open
// admin reads) must name the Edge by address, localhost or a listed name; must not come from
// another site's page unless that origin is listed; and must declare a JSON body. A request
// with a valid key is not checked, nor are the paths that reveal nothing.
func TestBoundaryKeepsPagesFromAddressTrustedAccess(t *testing.T) {
	a := mustNew(t, browserConfig())
	tests := []struct {
		name string
		req  browserRequest
		want int   // 200: served
		err  error // the refusal, when not served
	}{
		// Host: DNS rebinding sends the page's own name.
		{"anonymous by IP", browserRequest{path: "/v1/chat/completions", header: asJSON, body: chatBody}, 200, nil},
		{"anonymous by localhost", browserRequest{path: "/v1/chat/completions", host: "localhost:8080", header: asJSON, body: chatBody}, 200, nil},
		{"anonymous by a name under .localhost", browserRequest{path: "/v1/chat/completions", host: "edge.localhost:8080", header: asJSON, body: chatBody}, 200, nil},
		{"anonymous by localhost with a trailing dot", browserRequest{path: "/v1/chat/completions", host: "localhost.:8080", header: asJSON, body: chatBody}, 200, nil},
		{"anonymous by IPv6 loopback", browserRequest{path: "/v1/chat/completions", host: "[::1]:8080", header: asJSON, body: chatBody}, 200, nil},
		{"anonymous by IPv6 without a port", browserRequest{path: "/v1/chat/completions", host: "[::1]", header: asJSON, body: chatBody}, 200, nil},
		{"anonymous by a public IP", browserRequest{path: "/v1/chat/completions", host: "203.0.113.7", header: asJSON, body: chatBody}, 200, nil},
		{"anonymous without a Host (HTTP/1.0)", browserRequest{path: "/v1/chat/completions", host: "-", header: asJSON, body: chatBody}, 200, nil},
		{"anonymous by a listed name, in any case", browserRequest{path: "/v1/chat/completions", host: "EDGE.lan:8080", header: asJSON, body: chatBody}, 200, nil},
		{"rebinding: chat", browserRequest{path: "/v1/chat/completions", host: "attacker.example:8080", header: asJSON, body: chatBody}, 403, ErrHostNotAllowed},
		{"rebinding: Ollama chat", browserRequest{path: "/api/chat", host: "attacker.example", header: asJSON, body: chatBody}, 403, ErrHostNotAllowed},
		{"rebinding: models", browserRequest{method: "GET", path: "/v1/models", host: "attacker.example"}, 403, ErrHostNotAllowed},
		{"rebinding: admin read", browserRequest{method: "GET", path: "/admin/v1/nodes", host: "attacker.example"}, 403, ErrHostNotAllowed},
		{"rebinding: metrics", browserRequest{method: "GET", path: "/metrics", host: "attacker.example"}, 403, ErrHostNotAllowed},
		{"rebinding: a name that ends like localhost", browserRequest{method: "GET", path: "/v1/models", host: "evil-localhost"}, 403, ErrHostNotAllowed},
		{"rebinding: a listed name's subdomain", browserRequest{method: "GET", path: "/v1/models", host: "x.edge.lan"}, 403, ErrHostNotAllowed},
		{"rebinding: POST to the Ollama root", browserRequest{path: "/", host: "attacker.example", header: asJSON, body: "{}"}, 403, ErrHostNotAllowed},
		{"rebinding with a valid key", browserRequest{path: "/v1/chat/completions", host: "attacker.example", header: withKey, body: chatBody}, 200, nil},
		{"rebinding with a valid key: admin read", browserRequest{method: "GET", path: "/admin/v1/nodes", host: "attacker.example",
			header: map[string]string{"X-Api-Key": aliceKey}}, 200, nil},
		{"rebinding with a wrong key: the handler's 401", browserRequest{path: "/v1/chat/completions", host: "attacker.example",
			header: with(asJSON, "Authorization", "Bearer sk-wrong"), body: chatBody}, 200, nil},
		{"rebinding with a wrong key: admin read", browserRequest{method: "GET", path: "/admin/v1/nodes", host: "attacker.example",
			header: map[string]string{"Authorization": "Bearer sk-wrong"}}, 403, ErrHostNotAllowed},
		{"trusted network, rebinding", browserRequest{path: "/v1/chat/completions", host: "attacker.example", remote: "192.168.1.5:50000",
			header: asJSON, body: chatBody}, 403, ErrHostNotAllowed},
		{"trusted network, by a listed name", browserRequest{path: "/v1/chat/completions", host: "edge.lan", remote: "192.168.1.5:50000",
			header: asJSON, body: chatBody}, 200, nil},
		// What reveals nothing stays answerable by anyone.
		{"health", browserRequest{method: "GET", path: "/healthz", host: "attacker.example", header: crossJSON}, 200, nil},
		{"readiness", browserRequest{method: "HEAD", path: "/readyz", host: "attacker.example"}, 200, nil},
		{"the Ollama probe", browserRequest{method: "HEAD", path: "/", host: "attacker.example"}, 200, nil},
		{"the status page", browserRequest{method: "GET", path: "/status", host: "attacker.example", header: crossJSON}, 200, nil},
		{"the status page's script", browserRequest{method: "GET", path: "/status/app.js", host: "attacker.example"}, 200, nil},

		// Cross-site: a page of another site posting without asking.
		{"cross-site JSON", browserRequest{path: "/v1/chat/completions", header: crossJSON, body: chatBody}, 403, ErrCrossSite},
		{"cross-site text/plain", browserRequest{path: "/v1/chat/completions", header: with(crossJSON, "Content-Type", "text/plain"), body: chatBody}, 403, ErrCrossSite},
		{"cross-site form", browserRequest{path: "/api/chat", header: with(crossJSON, "Content-Type", "application/x-www-form-urlencoded"), body: "a=b"}, 403, ErrCrossSite},
		{"same-site (another port of localhost)", browserRequest{path: "/v1/chat/completions", header: with(asJSON, "Origin", "http://localhost:3000", "Sec-Fetch-Site", "same-site"), body: chatBody}, 403, ErrCrossSite},
		{"cross-site GET of a listing", browserRequest{method: "GET", path: "/api/tags", header: map[string]string{"Sec-Fetch-Site": "cross-site"}}, 403, ErrCrossSite},
		{"old browser: a foreign Origin", browserRequest{path: "/v1/chat/completions", header: with(asJSON, "Origin", "https://evil.example"), body: chatBody}, 403, ErrCrossSite},
		{"old browser: the opaque origin null", browserRequest{path: "/v1/chat/completions", header: with(asJSON, "Origin", "null"), body: chatBody}, 403, ErrCrossSite},
		{"old browser: the same host by another scheme is the same host", browserRequest{path: "/v1/chat/completions", header: with(asJSON, "Origin", "https://127.0.0.1:8080"), body: chatBody}, 200, nil},
		{"same origin", browserRequest{path: "/v1/chat/completions", header: with(asJSON, "Origin", "http://127.0.0.1:8080", "Sec-Fetch-Site", "same-origin"), body: chatBody}, 200, nil},
		{"same origin, old browser", browserRequest{path: "/v1/chat/completions", header: with(asJSON, "Origin", "http://127.0.0.1:8080"), body: chatBody}, 200, nil},
		{"typed by the user", browserRequest{method: "GET", path: "/v1/models", header: map[string]string{"Sec-Fetch-Site": "none"}}, 200, nil},
		{"a listed origin", browserRequest{path: "/v1/chat/completions", header: with(crossJSON, "Origin", "https://chat.example"), body: chatBody}, 200, nil},
		{"a listed origin's text/plain", browserRequest{path: "/v1/chat/completions", header: with(crossJSON, "Origin", "https://chat.example", "Content-Type", "text/plain"), body: chatBody}, 415, ErrContentType},
		{"cross-site with a valid key", browserRequest{path: "/v1/chat/completions", header: with(withKey, "Origin", "https://evil.example", "Sec-Fetch-Site", "cross-site"), body: chatBody}, 200, nil},

		// Content type: what a page may send anywhere without a preflight is not JSON.
		{"text/plain", browserRequest{path: "/v1/chat/completions", header: map[string]string{"Content-Type": "text/plain;charset=UTF-8"}, body: chatBody}, 415, ErrContentType},
		{"form", browserRequest{path: "/api/generate", header: map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, body: chatBody}, 415, ErrContentType},
		{"multipart", browserRequest{path: "/v1/messages", header: map[string]string{"Content-Type": "multipart/form-data; boundary=x"}, body: "--x--"}, 415, ErrContentType},
		{"not quite JSON", browserRequest{path: "/v1/chat/completions", header: map[string]string{"Content-Type": "application/jsonp"}, body: chatBody}, 415, ErrContentType},
		{"unparsable", browserRequest{path: "/v1/chat/completions", header: map[string]string{"Content-Type": ";;"}, body: chatBody}, 415, ErrContentType},
		{"JSON with a charset", browserRequest{path: "/v1/chat/completions", header: map[string]string{"Content-Type": "application/json; charset=utf-8"}, body: chatBody}, 200, nil},
		{"JSON in capitals", browserRequest{path: "/v1/chat/completions", header: map[string]string{"Content-Type": "Application/JSON"}, body: chatBody}, 200, nil},
		{"a +json type", browserRequest{path: "/v1/chat/completions", header: map[string]string{"Content-Type": "application/vnd.api+json"}, body: chatBody}, 200, nil},
		{"no content type", browserRequest{path: "/v1/chat/completions", body: chatBody}, 200, nil},
		{"text/plain without a body", browserRequest{method: "GET", path: "/v1/models", header: map[string]string{"Content-Type": "text/plain"}}, 200, nil},
		{"text/plain with a valid key", browserRequest{path: "/v1/chat/completions", header: with(withKey, "Content-Type", "text/plain"), body: chatBody}, 200, nil},
		{"trusted network, form", browserRequest{path: "/api/chat", remote: "192.168.1.5:50000",
			header: map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, body: chatBody}, 415, ErrContentType},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := tt.req.serve(edgeBoundary(a, nil))
			if w.Code != tt.want {
				t.Fatalf("%s %s (Host %q) = %d %s; want %d", tt.req.method, tt.req.path, tt.req.host, w.Code, w.Body, tt.want)
			}
			if tt.err == nil {
				if w.Code == 200 && w.Body.String() != "served" && tt.req.method != "HEAD" {
					t.Errorf("body %q; want the handler's", w.Body)
				}
				return
			}
			if body := strings.ToLower(w.Body.String()); !strings.Contains(body, refusalCode(tt.err)) {
				t.Errorf("refusal %s does not carry the code %q", body, refusalCode(tt.err))
			}
		})
	}
}

// refusalCode is the code a refusal's body carries: OpenAI's code field, and the start of the
// other shapes' messages.
func refusalCode(err error) string {
	switch {
	case errors.Is(err, ErrHostNotAllowed):
		return "host not allowed"
	case errors.Is(err, ErrCrossSite):
		return "cross-site request"
	case errors.Is(err, ErrContentType):
		return "not json"
	}
	return "?"
}

// The Edge's loopback setup without keys (`go run ./edged/dev`): every request is anonymous,
// even one with the placeholder key OpenAI SDKs insist on, so that key is no way around.
func TestBoundaryTreatsAPlaceholderKeyAsNoKey(t *testing.T) {
	a := mustNew(t, edgeconfig.Default())
	w := browserRequest{path: "/v1/chat/completions", host: "attacker.example",
		header: with(asJSON, "Authorization", "Bearer unused-on-loopback"), body: chatBody}.serve(edgeBoundary(a, nil))
	if w.Code != http.StatusForbidden {
		t.Fatalf("rebinding with a placeholder key on a keyless Edge = %d %s; want 403", w.Code, w.Body)
	}
	w = browserRequest{path: "/v1/chat/completions", header: with(asJSON, "Authorization", "Bearer unused-on-loopback"), body: chatBody}.serve(edgeBoundary(a, nil))
	if w.Code != http.StatusOK {
		t.Fatalf("the OpenAI SDK's request on a keyless Edge = %d %s; want 200", w.Code, w.Body)
	}
}

// A keyed Edge without anonymous access or trusted networks: a request without a key is the
// handler's to refuse with 401 (missing key), whatever its Host; only the admin reads are
// checked here, so that an Edge that opens them by reload never serves one unchecked.
func TestBoundaryLeavesRequestsThatNeedAKeyToTheHandler(t *testing.T) {
	a := mustNew(t, keyedConfig(false))
	h := edgeBoundary(a, nil)
	if w := (browserRequest{path: "/v1/chat/completions", host: "edge.example.com", header: map[string]string{"Content-Type": "text/plain"}, body: chatBody}).serve(h); w.Code != 200 {
		t.Errorf("a request that needs a key = %d %s; want passed to the handler (its 401)", w.Code, w.Body)
	}
	if w := (browserRequest{method: "GET", path: "/admin/v1/nodes", host: "attacker.example"}).serve(h); w.Code != 403 {
		t.Errorf("an admin read without a key = %d %s; want 403", w.Code, w.Body)
	}
}

// Refusals are answered in the shape of the API of the path, so that each client shows the
// message, and say how to fix them.
func TestBoundaryRefusalsHaveTheShapeOfTheirAPI(t *testing.T) {
	a := mustNew(t, browserConfig())
	h := edgeBoundary(a, nil)
	rebind := func(method, path string, header map[string]string) *httptest.ResponseRecorder {
		return browserRequest{method: method, path: path, host: "attacker.example", header: header, body: chatBody}.serve(h)
	}
	t.Run("OpenAI", func(t *testing.T) {
		w := rebind("POST", "/v1/chat/completions", asJSON)
		var b struct {
			Error struct{ Message, Type, Code string }
		}
		decode(t, w, &b)
		if b.Error.Code != "host_not_allowed" || b.Error.Type != "invalid_request_error" || !strings.Contains(b.Error.Message, "api.allowed_hosts") {
			t.Errorf("OpenAI refusal %s", w.Body)
		}
	})
	t.Run("Anthropic", func(t *testing.T) {
		for _, w := range []*httptest.ResponseRecorder{
			rebind("POST", "/v1/messages", asJSON),
			rebind("GET", "/v1/models", map[string]string{"Anthropic-Version": "2023-06-01"}),
		} {
			var b struct {
				Type  string
				Error struct{ Type, Message string }
			}
			decode(t, w, &b)
			if b.Type != "error" || b.Error.Type != "permission_error" || !strings.Contains(b.Error.Message, "api.allowed_hosts") {
				t.Errorf("Anthropic refusal %s", w.Body)
			}
		}
		w := browserRequest{path: "/v1/messages", header: map[string]string{"Content-Type": "text/plain"}, body: chatBody}.serve(h)
		var b struct {
			Type  string
			Error struct{ Type, Message string }
		}
		decode(t, w, &b)
		if w.Code != 415 || b.Error.Type != "invalid_request_error" || !strings.Contains(b.Error.Message, "Content-Type: application/json") {
			t.Errorf("Anthropic content type refusal %d %s", w.Code, w.Body)
		}
	})
	for _, path := range []string{"/api/chat", "/admin/v1/reload", "/metrics"} {
		t.Run(path, func(t *testing.T) {
			method := "POST"
			if path == "/metrics" {
				method = "GET"
			}
			w := rebind(method, path, asJSON)
			var b struct{ Error string }
			decode(t, w, &b)
			if !strings.Contains(b.Error, "attacker.example") || !strings.Contains(b.Error, "api.allowed_hosts") || !strings.Contains(b.Error, "API key") {
				t.Errorf("refusal %s", w.Body)
			}
		})
	}
	w := browserRequest{path: "/api/chat", header: crossJSON, body: chatBody}.serve(h)
	var b struct{ Error string }
	decode(t, w, &b)
	if !strings.Contains(b.Error, "https://evil.example") || !strings.Contains(b.Error, "api.allowed_origins") {
		t.Errorf("cross-site refusal %s", w.Body)
	}
	w = browserRequest{path: "/api/chat", header: map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, body: chatBody}.serve(h)
	decode(t, w, &b)
	if w.Code != 415 || !strings.Contains(b.Error, "Content-Type: application/json") {
		t.Errorf("content type refusal %d %s", w.Code, w.Body)
	}
}

func decode(t *testing.T, w *httptest.ResponseRecorder, v any) {
	t.Helper()
	if ct := w.Header().Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Errorf("Content-Type %q", ct)
	}
	if err := json.Unmarshal(w.Body.Bytes(), v); err != nil {
		t.Fatalf("%d %s: %v", w.Code, w.Body, err)
	}
}

// CORS is answered only for the listed origins: their preflight gets what a browser SDK
// needs, and their requests the Allow-Origin that lets the page read the answer. Any other
// origin gets no CORS header at all, and its preflight is refused.
func TestBoundaryAnswersCORSForListedOriginsOnly(t *testing.T) {
	a := mustNew(t, browserConfig())
	rec := &recorded{}
	h := edgeBoundary(a, rec)
	preflight := func(origin string) *httptest.ResponseRecorder {
		return browserRequest{method: "OPTIONS", path: "/v1/chat/completions", header: map[string]string{
			"Origin": origin, "Sec-Fetch-Site": "cross-site", "Access-Control-Request-Method": "POST",
			"Access-Control-Request-Headers": "authorization,content-type,x-stainless-os", "Access-Control-Request-Private-Network": "true",
		}}.serve(h)
	}
	w := preflight("https://chat.example")
	if w.Code != http.StatusNoContent || w.Body.Len() != 0 {
		t.Fatalf("preflight from the listed origin = %d %s; want 204", w.Code, w.Body)
	}
	hd := w.Header()
	if hd.Get("Access-Control-Allow-Origin") != "https://chat.example" {
		t.Errorf("Allow-Origin %q", hd.Get("Access-Control-Allow-Origin"))
	}
	allowed := strings.ToLower(hd.Get("Access-Control-Allow-Headers"))
	for _, want := range []string{"authorization", "x-api-key", "anthropic-version", "content-type", "x-stainless-os"} {
		if !strings.Contains(allowed, want) {
			t.Errorf("Allow-Headers %q lacks %s", allowed, want)
		}
	}
	if hd.Get("Access-Control-Allow-Private-Network") != "true" {
		t.Errorf("Allow-Private-Network %q: a public page of a listed origin may reach a loopback Edge", hd.Get("Access-Control-Allow-Private-Network"))
	}
	if m := hd.Get("Access-Control-Allow-Methods"); !strings.Contains(m, "POST") || !strings.Contains(m, "GET") {
		t.Errorf("Allow-Methods %q", m)
	}
	if !slices.Contains(hd.Values("Vary"), "Origin") || hd.Get("Access-Control-Allow-Credentials") != "" {
		t.Errorf("Vary %q, Allow-Credentials %q", hd.Values("Vary"), hd.Get("Access-Control-Allow-Credentials"))
	}

	w = preflight("https://evil.example")
	if w.Code != http.StatusForbidden {
		t.Errorf("preflight from another origin = %d; want 403", w.Code)
	}
	for k := range w.Header() {
		if strings.HasPrefix(k, "Access-Control-") {
			t.Errorf("preflight from another origin got %s", k)
		}
	}
	if !slices.Equal(rec.kinds, []string{RefusedCrossSite}) {
		t.Errorf("refusals recorded %q; want one %s", rec.kinds, RefusedCrossSite)
	}

	// The requests themselves: keyless from the listed origin, keyed from another.
	w = browserRequest{path: "/v1/chat/completions", header: with(crossJSON, "Origin", "https://chat.example"), body: chatBody}.serve(h)
	if w.Code != 200 || w.Header().Get("Access-Control-Allow-Origin") != "https://chat.example" || !slices.Contains(w.Header().Values("Vary"), "Origin") {
		t.Errorf("request from the listed origin = %d, headers %v", w.Code, w.Header())
	}
	w = browserRequest{path: "/v1/chat/completions", header: with(withKey, "Origin", "https://evil.example", "Sec-Fetch-Site", "cross-site"), body: chatBody}.serve(h)
	if w.Code != 200 || w.Header().Get("Access-Control-Allow-Origin") != "" {
		t.Errorf("keyed request from another origin = %d, headers %v; want served without CORS", w.Code, w.Header())
	}
	// A refusal to the listed origin is readable by its page, so it can show the message.
	w = browserRequest{path: "/v1/chat/completions", header: with(crossJSON, "Origin", "https://chat.example", "Content-Type", "text/plain"), body: chatBody}.serve(h)
	if w.Code != 415 || w.Header().Get("Access-Control-Allow-Origin") != "https://chat.example" {
		t.Errorf("refusal to the listed origin = %d, headers %v", w.Code, w.Header())
	}
	// An OPTIONS that is not a preflight is the handler's.
	if w := (browserRequest{method: "OPTIONS", path: "/v1/models"}).serve(h); w.Code != 200 {
		t.Errorf("OPTIONS without Access-Control-Request-Method = %d", w.Code)
	}
}

// Each refusal is reported once, by kind, for the log and iop_edge_refusals_total.
func TestBoundaryReportsEachRefusal(t *testing.T) {
	a := mustNew(t, browserConfig())
	rec := &recorded{}
	h := edgeBoundary(a, rec)
	browserRequest{method: "GET", path: "/metrics", host: "attacker.example"}.serve(h)
	browserRequest{path: "/v1/chat/completions", header: crossJSON, body: chatBody}.serve(h)
	browserRequest{path: "/v1/chat/completions", header: map[string]string{"Content-Type": "text/plain"}, body: chatBody}.serve(h)
	browserRequest{path: "/v1/chat/completions", header: asJSON, body: chatBody}.serve(h)
	if want := []string{RefusedHost, RefusedCrossSite, RefusedContentType}; !slices.Equal(rec.kinds, want) {
		t.Errorf("refusals %q; want %q", rec.kinds, want)
	}
}

// api.allowed_hosts and api.allowed_origins follow a reload (Replace) at once.
func TestBoundaryFollowsAReload(t *testing.T) {
	c := browserConfig()
	a := mustNew(t, c)
	h := edgeBoundary(a, nil)
	req := browserRequest{path: "/v1/chat/completions", host: "gpu.lan", header: with(asJSON, "Origin", "https://notes.example"), body: chatBody}
	if w := req.serve(h); w.Code != 403 {
		t.Fatalf("before the reload: %d", w.Code)
	}
	next := browserConfig()
	next.API.AllowedHosts = append(next.API.AllowedHosts, "gpu.lan")
	next.API.AllowedOrigins = []string{"https://notes.example"}
	if err := a.Replace(next); err != nil {
		t.Fatal(err)
	}
	if w := req.serve(h); w.Code != 200 || w.Header().Get("Access-Control-Allow-Origin") != "https://notes.example" {
		t.Errorf("after the reload: %d %v", w.Code, w.Header())
	}
}

// A request the boundary let through is authenticated under the configuration the boundary
// decided with, even when a reload lands in between: a reload that turns anonymous access on
// cannot slip an unchecked request through.
func TestAuthenticateBehindTheBoundaryUsesItsSnapshot(t *testing.T) {
	closed := keyedConfig(false)
	a := mustNew(t, closed)
	var got error
	h := a.Boundary(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		if err := a.Replace(keyedConfig(true)); err != nil { // anonymous on, mid-request
			t.Error(err)
		}
		_, got = a.Authenticate(r)
	}), BoundaryOptions{})
	browserRequest{path: "/v1/chat/completions", host: "attacker.example", header: asJSON, body: chatBody}.serve(h)
	if !errors.Is(got, ErrMissingKey) {
		t.Errorf("Authenticate behind the boundary = %v; want ErrMissingKey, the configuration the boundary let it through under", got)
	}
	r := httptest.NewRequest("GET", "/v1/models", nil)
	if p, err := a.Authenticate(r); err != nil || p.Name != edgeconfig.AnonymousPrincipal {
		t.Errorf("a new request after the reload = %q, %v; want anonymous", p.Name, err)
	}
}

// The refusal's error wraps its named error and says the fix.
func TestBoundaryErrorsSayTheFix(t *testing.T) {
	a := mustNew(t, browserConfig())
	st := a.state.Load()
	for _, tt := range []struct {
		req  browserRequest
		want []string
	}{
		{browserRequest{path: "/v1/models", host: "attacker.example"}, []string{"attacker.example", "api.allowed_hosts", "API key"}},
		{browserRequest{path: "/v1/models", header: crossJSON}, []string{"https://evil.example", "api.allowed_origins", "API key"}},
		{browserRequest{path: "/v1/models", header: map[string]string{"Content-Type": "text/plain"}, body: "x"}, []string{"text/plain", "Content-Type: application/json"}},
	} {
		r := httptest.NewRequest("POST", tt.req.path, strings.NewReader(tt.req.body))
		r.Host = "127.0.0.1:8080"
		if tt.req.host != "" {
			r.Host = tt.req.host
		}
		for k, v := range tt.req.header {
			r.Header.Set(k, v)
		}
		err := st.checkBrowser(r)
		if err == nil {
			t.Fatalf("%+v passed", tt.req)
		}
		for _, w := range tt.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%v does not say %q", err, w)
			}
		}
	}
}
