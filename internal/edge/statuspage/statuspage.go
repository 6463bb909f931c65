// Package statuspage serves the Edge's live status page: one HTML page,
// its script and its style sheet, embedded in the binary, that poll the
// admin reads (/admin/v1/nodes, /admin/v1/queues, /admin/v1/runs, and
// /admin/v1/cluster when the Edge serves it) and draw the cluster's Edges,
// the Nodes with the Edges each is connected to, the models, the work in
// flight and how recent work ended.
//
// The page loads nothing from anywhere else, so it works on a LAN without
// internet access; its Content-Security-Policy says so to the browser too
// (only this origin, no inline script or style).
//
// Protection: the page itself holds no data and is served to anyone; the
// data comes from the admin reads, which keep their own guard
// (api.admin_reads: open on a loopback or anonymous Edge, an admin
// principal's key otherwise). A browser cannot send a bearer token when it
// navigates, so when a read answers 401 or 403 the page asks for the admin
// key, keeps it in the tab's session storage, and sends it as
// "Authorization: Bearer KEY" on its own requests, which go to this
// origin only.
package statuspage

import (
	"embed"
	"net/http"
)

// Path is where the page is served; its assets are under Path + "/".
const Path = "/status"

//go:embed assets
var assets embed.FS

// asset is one embedded file and its content type.
type asset struct {
	file, contentType string
}

var files = map[string]asset{
	Path:                {"assets/index.html", "text/html; charset=utf-8"},
	Path + "/app.js":    {"assets/app.js", "text/javascript; charset=utf-8"},
	Path + "/style.css": {"assets/style.css", "text/css; charset=utf-8"},
}

// csp allows this origin only: the page's script, its style sheet and its
// requests to the admin reads. No inline script, no inline style
// attributes, no frames, no forms sent anywhere.
const csp = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; " +
	"base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// Handler serves the page at Path and its assets under Path + "/"; mount
// it at both. Path + "/" itself redirects to Path (the page's relative
// URLs resolve against Path).
func Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		if r.URL.Path == Path+"/" {
			http.Redirect(w, r, Path, http.StatusMovedPermanently)
			return
		}
		a, ok := files[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		b, err := assets.ReadFile(a.file)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		h := w.Header()
		h.Set("Content-Type", a.contentType)
		h.Set("Content-Security-Policy", csp)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("X-Frame-Options", "DENY")
		// The binary is the version: revalidate rather than keep an old
		// page after an upgrade.
		h.Set("Cache-Control", "no-cache")
		w.WriteHeader(http.StatusOK)
		if r.Method == http.MethodGet {
			_, _ = w.Write(b)
		}
	})
}

// Assets returns every file the page is made of, by the path it is served
// at: for tests that check what a browser gets.
func Assets() map[string][]byte {
	out := make(map[string][]byte, len(files))
	for path, a := range files {
		b, err := assets.ReadFile(a.file)
		if err != nil {
			panic("statuspage: embedded asset missing: " + a.file)
		}
		out[path] = b
	}
	return out
}
