package reload_test

import (
	"errors"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/iop-dev/iop/internal/edge/auth"
	"github.com/iop-dev/iop/internal/edge/edgeconfig"
	"github.com/iop-dev/iop/internal/edge/reload"
)

const file = `
edge_id: edge-test
listen: {quic: '127.0.0.1:7443', http: '127.0.0.1:%d'}
identity: {mode: loopback}
api:
  keys: [%s]
principals: [{name: alice, routes: ['*'], admin: true}, {name: bob, routes: [llama]}]
routes: [{name: llama, model: llama3.2}]
`

func key(principal, k string) string {
	return fmt.Sprintf("{principal: %s, sha256: %s}", principal, auth.HashKey(k))
}

// fakeCreds records what it was given and fails when told to.
type fakeCreds struct {
	applied []*edgeconfig.Config
	fail    error
}

func (f *fakeCreds) Apply(cfg *edgeconfig.Config) error {
	if f.fail != nil {
		return f.fail
	}
	f.applied = append(f.applied, cfg)
	return nil
}

type fakeDispatcher struct{ cfg *edgeconfig.Config }

func (f *fakeDispatcher) SetConfig(cfg *edgeconfig.Config) { f.cfg = cfg }

type fixture struct {
	path   string
	r      *reload.Reloader
	authn  *auth.Authenticator
	creds  *fakeCreds
	gw     *fakeDispatcher
	counts map[string]int
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	f := &fixture{path: filepath.Join(t.TempDir(), "edge.yaml"), creds: &fakeCreds{}, gw: &fakeDispatcher{}, counts: map[string]int{}}
	f.write(t, 8080, key("alice", "sk-alice"))
	cfg, err := edgeconfig.Load(f.path)
	if err != nil {
		t.Fatal(err)
	}
	if f.authn, err = auth.New(cfg); err != nil {
		t.Fatal(err)
	}
	f.r = reload.New(cfg, reload.Options{Path: f.path, Auth: f.authn, Credentials: f.creds, Dispatcher: f.gw,
		Count: func(result string) { f.counts[result]++ }})
	return f
}

func (f *fixture) write(t *testing.T, port int, keys ...string) {
	t.Helper()
	if err := os.WriteFile(f.path, fmt.Appendf(nil, file, port, strings.Join(keys, ", ")), 0o600); err != nil {
		t.Fatal(err)
	}
}

func (f *fixture) who(key string) string {
	r := httptest.NewRequest("GET", "/v1/models", nil)
	r.Header.Set("Authorization", "Bearer "+key)
	p, err := f.authn.Authenticate(r)
	if err != nil {
		return err.Error()
	}
	return p.Name
}

func TestReloadAddsAKey(t *testing.T) {
	f := newFixture(t)
	before := f.r.Running()
	f.write(t, 8080, key("alice", "sk-alice"), key("bob", "sk-bob"))
	if got := f.who("sk-bob"); got != auth.ErrInvalidKey.Error() {
		t.Fatalf("bob before the reload: %s", got)
	}
	res, err := f.r.Reload("test")
	if err != nil || !res.Applied || len(res.RestartRequired) != 0 {
		t.Fatalf("Reload = %+v, %v", res, err)
	}
	if !slices.Equal(res.Changes, []string{"api.keys: 1 -> 2"}) {
		t.Errorf("changes %q", res.Changes)
	}
	if f.who("sk-bob") != "bob" || f.who("sk-alice") != "alice" {
		t.Errorf("after the reload: bob is %q, alice %q", f.who("sk-bob"), f.who("sk-alice"))
	}
	now := f.r.Running()
	if now == before || f.authn.Config() != now || f.gw.cfg != now || len(f.creds.applied) != 1 || f.creds.applied[0] != now {
		t.Error("the new configuration was not given to every part")
	}
	if f.counts[reload.ResultApplied] != 1 || f.counts[reload.ResultRefused] != 0 {
		t.Errorf("counts %v", f.counts)
	}
}

func TestReloadRefusesAnInvalidFileAndKeepsTheRunningConfig(t *testing.T) {
	f := newFixture(t)
	before := f.r.Running()
	if err := os.WriteFile(f.path, []byte("api: {keys: [{principal: nobody, sha256: xyz}]}\nidentity: {mode: loopback}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	res, err := f.r.Reload("test")
	if err == nil || res.Applied || !strings.Contains(res.Error, "api.keys[0]") {
		t.Fatalf("Reload = %+v, %v; want refused naming api.keys[0]", res, err)
	}
	if f.r.Running() != before || f.authn.Config() != before || f.gw.cfg != nil || len(f.creds.applied) != 0 {
		t.Error("a refused reload changed something")
	}
	if f.who("sk-alice") != "alice" {
		t.Error("the running keys stopped working")
	}
	if f.counts[reload.ResultRefused] != 1 {
		t.Errorf("counts %v", f.counts)
	}
}

// Credentials are checked before anything is replaced: an unreadable one refuses the reload
// and the keys stay as they were.
func TestReloadRefusedByTheCredentialsReplacesNothing(t *testing.T) {
	f := newFixture(t)
	f.creds.fail = errors.New("credential \"upstream\" (env:X): not set")
	f.write(t, 8080, key("alice", "sk-alice"), key("bob", "sk-bob"))
	if _, err := f.r.Reload("test"); err == nil || !strings.Contains(err.Error(), "upstream") {
		t.Fatalf("Reload = %v; want the credential's error", err)
	}
	if got := f.who("sk-bob"); got == "bob" {
		t.Error("the key was applied although the credentials refused the reload")
	}
}

// A field only a restart applies is named, and not applied; the rest of the file is.
func TestReloadNamesWhatNeedsARestartAndKeepsIt(t *testing.T) {
	f := newFixture(t)
	f.write(t, 9999, key("alice", "sk-alice"), key("bob", "sk-bob"))
	res, err := f.r.Reload("test")
	if err != nil || !res.Applied || !slices.Equal(res.RestartRequired, []string{"listen"}) {
		t.Fatalf("Reload = %+v, %v; want applied with listen named", res, err)
	}
	if f.r.Running().Listen.HTTP != "127.0.0.1:8080" {
		t.Errorf("listen.http became %s without a restart", f.r.Running().Listen.HTTP)
	}
	if f.who("sk-bob") != "bob" {
		t.Error("the reloadable part was not applied")
	}
}

// A file valid only with a value that needs a restart is refused, saying so.
func TestReloadRefusesAFileValidOnlyAfterARestart(t *testing.T) {
	f := newFixture(t)
	if err := os.WriteFile(f.path, []byte(`
edge_id: edge-test
listen: {quic: '127.0.0.1:7443', http: '127.0.0.1:8080'}
identity: {mode: loopback}
api: {allow_anonymous: true}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	f.r.Running().Listen.HTTP = "0.0.0.0:8080" // as if the Edge had started on a public address
	res, err := f.r.Reload("test")
	if err == nil || !strings.Contains(err.Error(), "with the running listen") || !strings.Contains(err.Error(), "api.allow_anonymous") {
		t.Errorf("Reload = %+v, %v; want refused, naming the running listen and api.allow_anonymous", res, err)
	}
}

func TestReloadWithoutAFile(t *testing.T) {
	cfg := edgeconfig.Default()
	a, err := auth.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r := reload.New(cfg, reload.Options{Auth: a})
	if _, err := r.Reload("test"); !errors.Is(err, reload.ErrNoFile) {
		t.Errorf("Reload = %v, want ErrNoFile", err)
	}
}

// P5, issue 24: a reload that would leave no admin key while the running configuration has one is
// refused, whoever asks (SIGHUP too): nothing changes and the admin key keeps working.
func TestReloadRefusesToDropTheLastAdminKey(t *testing.T) {
	f := newFixture(t)
	before := f.r.Running()
	f.write(t, 8080, key("bob", "sk-bob")) // alice, the admin, has no key any more
	res, err := f.r.Reload("SIGHUP")
	if !errors.Is(err, edgeconfig.ErrLastAdminKey) || res.Applied || !strings.Contains(res.Error, "admin") {
		t.Fatalf("Reload = %+v, %v; want refused with ErrLastAdminKey", res, err)
	}
	if f.r.Running() != before || f.authn.Config() != before || f.gw.cfg != nil || len(f.creds.applied) != 0 {
		t.Error("a refused reload changed something")
	}
	if f.who("sk-alice") != "alice" || f.who("sk-bob") == "bob" {
		t.Errorf("after the refused reload: alice is %q, bob %q", f.who("sk-alice"), f.who("sk-bob"))
	}
	if f.counts[reload.ResultRefused] != 1 {
		t.Errorf("counts %v", f.counts)
	}

	// Rotating the admin key is a reload like any other.
	f.write(t, 8080, key("alice", "sk-alice-2"), key("bob", "sk-bob"))
	if _, err := f.r.Reload("test"); err != nil {
		t.Fatalf("rotating the admin key: %v", err)
	}
	if f.who("sk-alice-2") != "alice" || f.who("sk-alice") == "alice" {
		t.Error("the rotated admin key was not applied")
	}
}

// P5, issue 24, decided: a key removed by a reload refuses every request from then on, and a request
// it authenticated before keeps running to its end. The request holds the principal it was
// authenticated as, and with it the configuration of that moment (auth.Principal.Config), so its
// route and profile, and the profile's deadline that bounds it, stay what they were.
func TestAKeyRemovedByReloadKeepsTheRequestsItStarted(t *testing.T) {
	f := newFixture(t)
	f.write(t, 8080, key("alice", "sk-alice"), key("bob", "sk-bob"))
	if _, err := f.r.Reload("test"); err != nil {
		t.Fatal(err)
	}
	r := httptest.NewRequest("POST", "/v1/chat/completions", nil)
	r.Header.Set("Authorization", "Bearer sk-bob")
	running, err := f.authn.Authenticate(r) // a request of bob's, in flight
	if err != nil {
		t.Fatal(err)
	}
	under := f.r.Running()

	f.write(t, 8080, key("alice", "sk-alice")) // bob's key removed
	if _, err := f.r.Reload("test"); err != nil {
		t.Fatal(err)
	}
	if got := f.who("sk-bob"); got != auth.ErrInvalidKey.Error() {
		t.Errorf("bob's next request: %s, want %v", got, auth.ErrInvalidKey)
	}
	if running.Name != "bob" || running.Config != under || !running.MayUse("llama") {
		t.Errorf("the request in flight lost what it was authenticated under: %+v", running)
	}
	if len(under.API.Keys) != 2 {
		t.Error("the reload modified the configuration a request in flight holds")
	}
}
