package adminapi_test

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/iop-dev/iop/internal/edge/adminapi"
	"github.com/iop-dev/iop/internal/edge/auth"
	"github.com/iop-dev/iop/internal/edge/credentials"
	"github.com/iop-dev/iop/internal/edge/edgeconfig"
	"github.com/iop-dev/iop/internal/edge/fleet"
)

const (
	opsKey    = "sk-ops-0123456789"
	viewerKey = "sk-viewer-0123456789"
	// upstreamSecret is the credential's value; every response and log is checked for it.
	upstreamSecret = "sk-upstream-SECRET-0001"
)

// env is the fake environment of the credential store.
type env struct {
	mu   sync.Mutex
	vars map[string]string
}

func (e *env) getenv(k string) string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.vars[k]
}

func (e *env) set(k, v string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.vars[k] = v
}

// edgeConfig is a managed Edge with one credential used by the chat profile, a profile without
// one, and two keyed principals: ops (admin) and viewer. anonymous says whether requests
// without a key are let through (as a non-admin).
func edgeConfig(anonymous bool) *edgeconfig.Config {
	c := edgeconfig.Default()
	c.Identity.CAFile, c.Identity.CertFile, c.Identity.KeyFile = "/ca.pem", "/edge.pem", "/edge-key.pem"
	c.Credentials = []edgeconfig.Credential{{Name: "upstream", Env: "OPENAI_API_KEY", Kind: edgeconfig.CredentialKindBearer}}
	chat, local := edgeconfig.DefaultProfile(), edgeconfig.DefaultProfile()
	chat.Name, chat.Credential, local.Name = "chat", "upstream", "local"
	c.Profiles = []edgeconfig.Profile{chat, local}
	c.Principals = []edgeconfig.Principal{
		{Name: "ops", Routes: []string{edgeconfig.AllRoutes}, Admin: true},
		{Name: "viewer", Routes: []string{edgeconfig.AllRoutes}},
	}
	c.API.Keys = []edgeconfig.APIKey{{Principal: "ops", SHA256: auth.HashKey(opsKey)}, {Principal: "viewer", SHA256: auth.HashKey(viewerKey)}}
	c.API.AllowAnonymous = &anonymous
	return c
}

type fixture struct {
	h   http.Handler
	env *env
	log *bytes.Buffer
}

func newFixture(t *testing.T, anonymous bool) *fixture {
	t.Helper()
	cfg := edgeConfig(anonymous)
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	e := &env{vars: map[string]string{"OPENAI_API_KEY": upstreamSecret}}
	store, err := credentials.New(cfg, credentials.Options{Getenv: e.getenv})
	if err != nil {
		t.Fatal(err)
	}
	authn, err := auth.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	h := adminapi.Handler(fleet.New(fleet.Options{}), func() error { return nil },
		adminapi.Options{Credentials: store, Authenticator: authn, Logger: log, OpenReads: true})
	return &fixture{h: h, env: e, log: &buf}
}

// do sends a request with key as a bearer key ("" for none) and returns the recorder and the
// body decoded; it fails the test when the body carries the secret.
func do(t *testing.T, h http.Handler, method, path, key string) (*httptest.ResponseRecorder, map[string]any) {
	t.Helper()
	r := httptest.NewRequest(method, path, nil)
	if key != "" {
		r.Header.Set("Authorization", "Bearer "+key)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, r)
	if strings.Contains(rec.Body.String(), "SECRET") {
		t.Errorf("%s %s: the response carries the secret: %s", method, path, rec.Body)
	}
	var body map[string]any
	if rec.Code != http.StatusMethodNotAllowed {
		if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
			t.Fatalf("%s %s: body is not JSON: %v\n%s", method, path, err, rec.Body)
		}
	}
	return rec, body
}

func TestCredentialsAreListedWithoutValues(t *testing.T) {
	f := newFixture(t, false)
	rec, body := do(t, f.h, http.MethodGet, "/admin/v1/credentials", "") // no key needed to read
	if rec.Code != http.StatusOK {
		t.Fatalf("status %d: %v", rec.Code, body)
	}
	want := map[string]any{
		"credentials": []any{map[string]any{"name": "upstream", "kind": "bearer", "source": "env:OPENAI_API_KEY",
			"revision": float64(1), "revoked": false, "disabled": false, "profiles": []any{"chat"}}},
		"profiles": []any{
			map[string]any{"name": "chat", "credential": "upstream", "disabled": false},
			map[string]any{"name": "default", "disabled": false},
			map[string]any{"name": "local", "disabled": false},
		},
	}
	if !reflect.DeepEqual(body, want) {
		t.Errorf("body\n got %v\nwant %v", body, want)
	}
}

func TestCredentialEndpoints(t *testing.T) {
	tests := []struct {
		name      string
		anonymous bool
		path      string
		key       string
		code      int
		want      map[string]any // fields of the body that must be equal
		message   string         // in body["error"]
	}{
		// Who may change state.
		{"no key", false, "/admin/v1/credentials/upstream/revoke", "", http.StatusUnauthorized, nil, "missing API key"},
		{"wrong key", false, "/admin/v1/credentials/upstream/revoke", "sk-mallory", http.StatusUnauthorized, nil, "invalid API key"},
		{"anonymous", true, "/admin/v1/credentials/upstream/revoke", "", http.StatusForbidden, nil,
			`admin is required, and a request without a key acts as "anonymous", which never is`},
		{"principal that is not an admin", false, "/admin/v1/credentials/upstream/revoke", viewerKey, http.StatusForbidden, nil,
			`admin is required, and principal "viewer" is not one: send the API key of a principal that has admin: true (principals[].admin in the Edge config)`},
		{"not an admin, on a profile", false, "/admin/v1/profiles/chat/disable", viewerKey, http.StatusForbidden, nil, "principals[].admin"},
		{"not an admin, bad action", false, "/admin/v1/credentials/upstream/explode", viewerKey, http.StatusForbidden, nil, "admin is required"},

		// What an admin gets.
		{"revoke", false, "/admin/v1/credentials/upstream/revoke", opsKey, http.StatusOK,
			map[string]any{"name": "upstream", "revision": float64(2), "revoked": true, "disabled": false}, ""},
		{"reload", false, "/admin/v1/credentials/upstream/reload", opsKey, http.StatusOK,
			map[string]any{"name": "upstream", "revision": float64(2), "revoked": false}, ""},
		{"disable credential", false, "/admin/v1/credentials/upstream/disable", opsKey, http.StatusOK,
			map[string]any{"name": "upstream", "revision": float64(1), "disabled": true}, ""},
		{"enable credential", false, "/admin/v1/credentials/upstream/enable", opsKey, http.StatusOK,
			map[string]any{"name": "upstream", "disabled": false}, ""},
		{"disable profile", false, "/admin/v1/profiles/chat/disable", opsKey, http.StatusOK,
			map[string]any{"name": "chat", "credential": "upstream", "disabled": true}, ""},
		{"enable profile", false, "/admin/v1/profiles/chat/enable", opsKey, http.StatusOK, map[string]any{"name": "chat", "disabled": false}, ""},
		{"unknown credential", false, "/admin/v1/credentials/openai/revoke", opsKey, http.StatusNotFound, nil,
			`no credential named "openai"; configured: upstream`},
		{"unknown profile", false, "/admin/v1/profiles/fast/disable", opsKey, http.StatusNotFound, nil, `no profile named "fast"`},
		{"bad credential action", false, "/admin/v1/credentials/upstream/delete", opsKey, http.StatusBadRequest, nil,
			`unknown credential action "delete"; one of ["revoke" "reload" "disable" "enable"]`},
		{"profiles are not revoked", false, "/admin/v1/profiles/chat/revoke", opsKey, http.StatusBadRequest, nil, `unknown profile action "revoke"`},
		{"profile without a credential", false, "/admin/v1/profiles/local/disable", opsKey, http.StatusConflict, nil,
			`profile "local" uses no credential`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, tt.anonymous)
			rec, body := do(t, f.h, http.MethodPost, tt.path, tt.key)
			if rec.Code != tt.code {
				t.Fatalf("status %d, want %d: %v", rec.Code, tt.code, body)
			}
			for k, v := range tt.want {
				if !reflect.DeepEqual(body[k], v) {
					t.Errorf("%s = %v, want %v (body %v)", k, body[k], v, body)
				}
			}
			if msg, _ := body["error"].(string); !strings.Contains(msg, tt.message) {
				t.Errorf("error %q, want it to contain %q", msg, tt.message)
			}
			if got := rec.Header().Get("WWW-Authenticate"); (tt.code == http.StatusUnauthorized) != strings.HasPrefix(got, "Bearer") {
				t.Errorf("WWW-Authenticate %q with status %d", got, rec.Code)
			}
			if strings.Contains(f.log.String(), "SECRET") {
				t.Errorf("the log carries the secret:\n%s", f.log)
			}
		})
	}
}

func TestChangesTakeEffectAndAreLogged(t *testing.T) {
	f := newFixture(t, false)
	if rec, body := do(t, f.h, http.MethodPost, "/admin/v1/credentials/upstream/revoke", opsKey); rec.Code != http.StatusOK {
		t.Fatalf("revoke: %d %v", rec.Code, body)
	}
	if rec, body := do(t, f.h, http.MethodPost, "/admin/v1/profiles/chat/disable", opsKey); rec.Code != http.StatusOK {
		t.Fatalf("disable: %d %v", rec.Code, body)
	}
	_, body := do(t, f.h, http.MethodGet, "/admin/v1/credentials", "")
	cred := body["credentials"].([]any)[0].(map[string]any)
	prof := body["profiles"].([]any)[0].(map[string]any)
	if cred["revoked"] != true || cred["revision"] != float64(2) || prof["disabled"] != true {
		t.Errorf("after revoke and disable: %v", body)
	}

	var entries []map[string]any
	for line := range strings.SplitSeq(strings.TrimSpace(f.log.String()), "\n") {
		var e map[string]any
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		entries = append(entries, e)
	}
	if len(entries) != 2 {
		t.Fatalf("log has %d entries, want 2:\n%s", len(entries), f.log)
	}
	want := []map[string]any{
		{"level": "WARN", "principal": "ops", "action": "revoke", "credential": "upstream", "revision": float64(2)},
		{"level": "WARN", "principal": "ops", "action": "disable", "profile": "chat", "credential": "upstream", "revision": float64(2)},
	}
	for i, w := range want {
		for k, v := range w {
			if entries[i][k] != v {
				t.Errorf("log entry %d: %s = %v, want %v (%v)", i, k, entries[i][k], v, entries[i])
			}
		}
	}
}

func TestFailedReloadNamesTheSourceNotTheValue(t *testing.T) {
	f := newFixture(t, false)
	f.env.set("OPENAI_API_KEY", "")
	rec, body := do(t, f.h, http.MethodPost, "/admin/v1/credentials/upstream/reload", opsKey)
	if rec.Code != http.StatusInternalServerError ||
		body["error"] != `credential "upstream" from env:OPENAI_API_KEY: the environment variable is not set or is empty` {
		t.Errorf("reload of an empty variable: %d %v", rec.Code, body)
	}
	// A value with whitespace is refused without being echoed.
	f.env.set("OPENAI_API_KEY", "sk-SECRET with-space")
	if rec, body := do(t, f.h, http.MethodPost, "/admin/v1/credentials/upstream/reload", opsKey); rec.Code != http.StatusInternalServerError {
		t.Errorf("reload of a bad value: %d %v", rec.Code, body)
	}
	if !strings.Contains(f.log.String(), "env:OPENAI_API_KEY") || strings.Contains(f.log.String(), "SECRET") {
		t.Errorf("log:\n%s", f.log)
	}
	_, body = do(t, f.h, http.MethodGet, "/admin/v1/credentials", "")
	if cred := body["credentials"].([]any)[0].(map[string]any); cred["revision"] != float64(1) {
		t.Errorf("a failed reload changed the credential: %v", cred)
	}
}

func TestCredentialEndpointsWithoutAStore(t *testing.T) {
	h := adminapi.Handler(fleet.New(fleet.Options{}), func() error { return nil }, adminapi.Options{OpenReads: true})
	for _, tt := range []struct{ method, path string }{
		{http.MethodGet, "/admin/v1/credentials"},
		{http.MethodPost, "/admin/v1/credentials/upstream/revoke"},
		{http.MethodPost, "/admin/v1/profiles/chat/disable"},
	} {
		rec, body := do(t, h, tt.method, tt.path, opsKey)
		if rec.Code != http.StatusNotFound || !strings.Contains(body["error"].(string), "no credential store") {
			t.Errorf("%s %s = %d %v", tt.method, tt.path, rec.Code, body)
		}
	}
}

func TestChangesNeedAnAuthenticator(t *testing.T) {
	cfg := edgeConfig(false)
	store, err := credentials.New(cfg, credentials.Options{Getenv: func(string) string { return upstreamSecret }})
	if err != nil {
		t.Fatal(err)
	}
	h := adminapi.Handler(fleet.New(fleet.Options{}), func() error { return nil }, adminapi.Options{Credentials: store, OpenReads: true})
	if rec, body := do(t, h, http.MethodPost, "/admin/v1/credentials/upstream/revoke", opsKey); rec.Code != http.StatusForbidden {
		t.Errorf("without an authenticator: %d %v", rec.Code, body)
	}
	if rec, _ := do(t, h, http.MethodGet, "/admin/v1/credentials", ""); rec.Code != http.StatusOK {
		t.Errorf("GET without an authenticator: %d", rec.Code)
	}
}

func TestChangesArePostOnly(t *testing.T) {
	f := newFixture(t, false)
	rec, _ := do(t, f.h, http.MethodGet, "/admin/v1/credentials/upstream/revoke", opsKey)
	if rec.Code != http.StatusMethodNotAllowed {
		t.Errorf("GET of a change = %d, want 405", rec.Code)
	}
}
