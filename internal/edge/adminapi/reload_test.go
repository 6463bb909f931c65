package adminapi_test

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/iop-dev/iop/internal/edge/adminapi"
	"github.com/iop-dev/iop/internal/edge/auth"
	"github.com/iop-dev/iop/internal/edge/edgeconfig"
	"github.com/iop-dev/iop/internal/edge/fleet"
	"github.com/iop-dev/iop/internal/edge/reload"
)

const reloadFile = `
listen: {quic: '127.0.0.1:7443', http: '127.0.0.1:8080'}
identity: {mode: loopback}
api:
  allow_anonymous: true
  admin_reads: open
  keys: [{principal: ops, sha256: %q}, {principal: viewer, sha256: %q}]
principals: [{name: ops, routes: ['*'], admin: true}, {name: viewer, routes: ['*']}]
`

// POST /admin/v1/reload: only an admin may reload, however open the reads are; an applied
// reload answers what changed, a refused one 422 with the error.
func TestReloadEndpointIsForAdminsAndAnswersWhatHappened(t *testing.T) {
	path := filepath.Join(t.TempDir(), "edge.yaml")
	write := func(s string) {
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(fmtFile(opsKey, viewerKey))
	cfg, err := edgeconfig.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	authn, err := auth.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r := reload.New(cfg, reload.Options{Path: path, Auth: authn})
	h := adminapi.Handler(fleet.New(fleet.Options{}), func() error { return nil },
		adminapi.Options{Authenticator: authn, ReadsOpen: authn.AdminReadsOpen, Reloader: r})

	for _, tt := range []struct {
		name string
		key  string
		code int
	}{
		{"anonymous", "", http.StatusForbidden},
		{"not an admin", viewerKey, http.StatusForbidden},
		{"a wrong key", "sk-nobody", http.StatusUnauthorized},
	} {
		if rec, _ := do(t, h, "POST", "/admin/v1/reload", tt.key); rec.Code != tt.code {
			t.Errorf("%s: %d, want %d", tt.name, rec.Code, tt.code)
		}
	}
	if rec, _ := do(t, h, "GET", "/admin/v1/reload", opsKey); rec.Code != http.StatusMethodNotAllowed {
		t.Errorf("GET: %d, want 405", rec.Code)
	}

	// The viewer's key is rotated; the reads are closed.
	const newViewerKey = "sk-viewer-rotated-0001"
	write(strings.Replace(fmtFile(opsKey, newViewerKey), "admin_reads: open", "admin_reads: admins", 1))
	rec, body := do(t, h, "POST", "/admin/v1/reload", opsKey)
	if rec.Code != http.StatusOK || body["applied"] != true {
		t.Fatalf("reload by ops: %d %v", rec.Code, body)
	}
	if changes, _ := body["changes"].([]any); len(changes) != 2 {
		t.Errorf("changes %v, want the keys and the admin reads", body["changes"])
	}
	if rec, _ := do(t, h, "GET", "/admin/v1/nodes", ""); rec.Code != http.StatusForbidden {
		t.Errorf("an anonymous read after the reload closed reads: %d, want 403", rec.Code)
	}
	if rec, _ := do(t, h, "GET", "/admin/v1/nodes", newViewerKey); rec.Code != http.StatusForbidden {
		t.Errorf("the rotated viewer key after the reload: %d, want 403 (authenticated, not an admin)", rec.Code)
	}

	// An invalid file: 422 with the error; the running configuration stays.
	write("identity: {mode: nonsense}\n")
	rec, body = do(t, h, "POST", "/admin/v1/reload", opsKey)
	if rec.Code != http.StatusUnprocessableEntity || body["applied"] != false || !strings.Contains(body["error"].(string), "identity.mode") {
		t.Errorf("an invalid reload: %d %v; want 422 naming identity.mode", rec.Code, body)
	}
	if rec, _ := do(t, h, "GET", "/admin/v1/nodes", opsKey); rec.Code != http.StatusOK {
		t.Errorf("ops after a refused reload: %d", rec.Code)
	}

	// Without a reloader: 404.
	without := adminapi.Handler(fleet.New(fleet.Options{}), func() error { return nil }, adminapi.Options{Authenticator: authn})
	if rec, _ := do(t, without, "POST", "/admin/v1/reload", opsKey); rec.Code != http.StatusNotFound {
		t.Errorf("without a reloader: %d, want 404", rec.Code)
	}
}

func fmtFile(ops, viewer string) string {
	return fmt.Sprintf(reloadFile, auth.HashKey(ops), auth.HashKey(viewer))
}

// P5, issue 24: a reload by the admin that would leave no admin key is refused with 422, saying
// why and that a restart applies it; the admin's key keeps working, so the admin can fix the
// file and reload again.
func TestReloadEndpointRefusesToDropTheLastAdminKey(t *testing.T) {
	path := filepath.Join(t.TempDir(), "edge.yaml")
	if err := os.WriteFile(path, []byte(fmtFile(opsKey, viewerKey)), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := edgeconfig.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	authn, err := auth.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h := adminapi.Handler(fleet.New(fleet.Options{}), func() error { return nil },
		adminapi.Options{Authenticator: authn, ReadsOpen: authn.AdminReadsOpen, Reloader: reload.New(cfg, reload.Options{Path: path, Auth: authn})})

	// ops stays a principal, but is no admin any more.
	if err := os.WriteFile(path, []byte(strings.Replace(fmtFile(opsKey, viewerKey), "admin: true", "admin: false", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	rec, body := do(t, h, "POST", "/admin/v1/reload", opsKey)
	msg, _ := body["error"].(string)
	if rec.Code != http.StatusUnprocessableEntity || body["applied"] != false || !strings.Contains(msg, "admin: true") || !strings.Contains(msg, "restart") {
		t.Fatalf("reload dropping the last admin: %d %v; want 422 saying why and what to do", rec.Code, body)
	}
	if rec, _ := do(t, h, "POST", "/admin/v1/reload", opsKey); rec.Code != http.StatusUnprocessableEntity {
		t.Errorf("ops after the refused reload: %d, want still an admin (422 again, not 403)", rec.Code)
	}
}
