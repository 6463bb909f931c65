package statuspage_test

import (
	"io/fs"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"github.com/iop-dev/iop/internal/edge/statuspage"
)

func serve(t *testing.T, method, path string) *httptest.ResponseRecorder {
	t.Helper()
	rec := httptest.NewRecorder()
	statuspage.Handler().ServeHTTP(rec, httptest.NewRequest(method, path, nil))
	return rec
}

func TestEveryAssetIsServedWithItsTypeAndAPolicyOfThisOriginOnly(t *testing.T) {
	for path, want := range map[string]string{
		"/status":           "text/html; charset=utf-8",
		"/status/app.js":    "text/javascript; charset=utf-8",
		"/status/style.css": "text/css; charset=utf-8",
	} {
		rec := serve(t, http.MethodGet, path)
		if rec.Code != http.StatusOK || rec.Header().Get("Content-Type") != want || rec.Body.Len() == 0 {
			t.Errorf("GET %s = %d %q (%d bytes), want 200 %q", path, rec.Code, rec.Header().Get("Content-Type"), rec.Body.Len(), want)
		}
		csp := rec.Header().Get("Content-Security-Policy")
		for _, d := range []string{"default-src 'none'", "script-src 'self'", "connect-src 'self'", "style-src 'self'"} {
			if !strings.Contains(csp, d) {
				t.Errorf("GET %s: policy %q lacks %q", path, csp, d)
			}
		}
		if strings.Contains(csp, "unsafe-inline") || strings.Contains(csp, "unsafe-eval") {
			t.Errorf("GET %s: policy %q allows inline code", path, csp)
		}
		if rec.Header().Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("GET %s without nosniff", path)
		}
		if head := serve(t, http.MethodHead, path); head.Code != http.StatusOK || head.Body.Len() != 0 {
			t.Errorf("HEAD %s = %d with %d bytes", path, head.Code, head.Body.Len())
		}
	}
	if rec := serve(t, http.MethodGet, "/status/"); rec.Code != http.StatusMovedPermanently || rec.Header().Get("Location") != "/status" {
		t.Errorf("GET /status/ = %d to %q, want a redirect to /status", rec.Code, rec.Header().Get("Location"))
	}
	if rec := serve(t, http.MethodGet, "/status/secret.json"); rec.Code != http.StatusNotFound {
		t.Errorf("GET of an unknown asset = %d, want 404", rec.Code)
	}
	if rec := serve(t, http.MethodPost, "/status"); rec.Code != http.StatusMethodNotAllowed {
		t.Errorf("POST /status = %d, want 405", rec.Code)
	}
}

// externalRefs lists what in b could make a browser reach beyond the page's
// own origin: absolute or protocol-relative URLs, style sheet imports and
// url(), elements that load anything but the page's own assets (or the
// empty data: icon), and markup or connections made from strings.
func externalRefs(b []byte) []string {
	patterns := []*regexp.Regexp{
		regexp.MustCompile(`(?i)\b(https?|wss?|ftp|file):`),
		regexp.MustCompile("[\"'`(=]\\s*//[^/\\s]"), // protocol-relative: "//cdn..."
		regexp.MustCompile(`(?i)\bcdn\b|cdnjs|jsdelivr|unpkg|googleapis|gstatic`),
		regexp.MustCompile(`(?i)@import|url\(`),
		regexp.MustCompile(`\b(innerHTML|outerHTML|insertAdjacentHTML|document\.write|eval\(|new Function|importScripts|WebSocket|EventSource|sendBeacon)\b`),
	}
	var found []string
	for _, re := range patterns {
		for _, m := range re.FindAll(b, -1) {
			found = append(found, string(m))
		}
	}
	loads := regexp.MustCompile(`(?i)<(?:script|link|img|iframe|source|embed|object)\b[^>]*?\b(?:src|href|data)\s*=\s*["']?([^"'\s>]*)`)
	for _, m := range loads.FindAllSubmatch(b, -1) {
		if ref := string(m[1]); !strings.HasPrefix(ref, "status/") && ref != "data:," {
			found = append(found, string(m[0]))
		}
	}
	return found
}

// The page must work on a LAN without internet access: nothing it serves
// refers to anything outside this Edge.
func TestTheServedAssetsReferToNothingOutsideThisEdge(t *testing.T) {
	for path, b := range statuspage.Assets() {
		rec := serve(t, http.MethodGet, path)
		if rec.Body.String() != string(b) {
			t.Errorf("GET %s does not serve the embedded asset", path)
		}
		if refs := externalRefs(rec.Body.Bytes()); len(refs) > 0 {
			t.Errorf("%s refers outside this Edge: %q", path, refs)
		}
	}
	// Every embedded file is served (none is there unchecked) …
	n := 0
	if err := fs.WalkDir(statuspage.EmbeddedFS(), ".", func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			n++
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if n != len(statuspage.Assets()) {
		t.Errorf("%d files are embedded, %d served: every embedded file must be served and checked", n, len(statuspage.Assets()))
	}
	// … and the page loads its own script and style sheet, by paths
	// relative to itself.
	page := string(statuspage.Assets()["/status"])
	for _, want := range []string{`src="status/app.js"`, `href="status/style.css"`} {
		if !strings.Contains(page, want) {
			t.Errorf("the page lacks %s", want)
		}
	}
}

// The check above can fail: each of these would reach outside the Edge.
func TestTheCheckFindsExternalReferences(t *testing.T) {
	for _, bad := range []string{
		`<script src="https://cdn.example.com/chart.js"></script>`,
		`<link rel="stylesheet" href="//fonts.example.com/css">`,
		`<img src="http://10.0.0.1/logo.png">`,
		`fetch("//metrics.example.org/x")`,
		`@import "theme.css";`,
		`body { background: url(bg.png); }`,
		`<script src="/other/app.js"></script>`,
		`el.innerHTML = name;`,
		`new EventSource('https://x')`,
		`const u = 'wss://example.org/live';`,
		`<link href="data:text/css,body{}" rel="stylesheet">`,
	} {
		if refs := externalRefs([]byte(bad)); len(refs) == 0 {
			t.Errorf("not caught: %s", bad)
		}
	}
	for _, fine := range []string{
		`<script src="status/app.js" defer></script>`,
		`<link rel="icon" href="data:,">`,
		`// a comment`,
		`getJSON('admin/v1/nodes')`,
	} {
		if refs := externalRefs([]byte(fine)); len(refs) > 0 {
			t.Errorf("flagged %s: %q", fine, refs)
		}
	}
}
