package credentials_test

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/iop-dev/iop/internal/edge/credentials"
	"github.com/iop-dev/iop/internal/edge/edgeconfig"
	"github.com/iop-dev/iop/internal/yamlconf"
	"github.com/iop-dev/iop/quicwire/lease"
)

// The values the fake sources hold. Every one contains "SECRET", so a test can check that no
// error, view or log carries any of them.
const (
	upstreamSecret = "sk-upstream-SECRET-0001"
	rotatedSecret  = "sk-upstream-SECRET-0002"
	backupSecret   = "sk-backup-SECRET-0003"
)

// sources is a fake environment and file system for New's getenv and readFile.
type sources struct {
	mu    sync.Mutex
	env   map[string]string
	files map[string][]byte
	errs  map[string]error // readFile fails with this for the path
}

func newSources() *sources {
	return &sources{
		env:   map[string]string{"OPENAI_API_KEY": upstreamSecret},
		files: map[string][]byte{"/run/secrets/backup": []byte(backupSecret + "\r\n\n")},
		errs:  map[string]error{},
	}
}

func (s *sources) getenv(k string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.env[k]
}

func (s *sources) readFile(p string) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.errs[p]; err != nil {
		return nil, &fs.PathError{Op: "open", Path: p, Err: err}
	}
	data, ok := s.files[p]
	if !ok {
		return nil, &fs.PathError{Op: "open", Path: p, Err: fs.ErrNotExist}
	}
	return bytes.Clone(data), nil
}

func (s *sources) setEnv(k, v string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.env[k] = v
}

// managedConfig has two credentials: upstream (env) used by the chat and code profiles, backup
// (file) used by batch; the local profile uses none, and default is left to the store.
func managedConfig() *edgeconfig.Config {
	c := edgeconfig.Default()
	c.Identity.CAFile, c.Identity.CertFile, c.Identity.KeyFile = "/ca.pem", "/edge.pem", "/edge-key.pem"
	c.Credentials = []edgeconfig.Credential{
		{Name: "upstream", Env: "OPENAI_API_KEY", Kind: edgeconfig.CredentialKindBearer},
		{Name: "backup", File: "/run/secrets/backup", Kind: edgeconfig.CredentialKindBearer},
	}
	for _, p := range []struct{ name, cred string }{{"chat", "upstream"}, {"code", "upstream"}, {"batch", "backup"}, {"local", ""}} {
		prof := edgeconfig.DefaultProfile()
		prof.Name, prof.Credential = p.name, p.cred
		c.Profiles = append(c.Profiles, prof)
	}
	return c
}

func newStore(t *testing.T) (*credentials.Store, *sources) {
	t.Helper()
	src := newSources()
	s, err := credentials.New(managedConfig(), credentials.Options{Getenv: src.getenv, ReadFile: src.readFile})
	if err != nil {
		t.Fatal(err)
	}
	return s, src
}

// noSecret fails when text carries any of the test values.
func noSecret(t *testing.T, what, text string) {
	t.Helper()
	if strings.Contains(text, "SECRET") {
		t.Errorf("%s carries a secret: %s", what, text)
	}
}

func mustGrant(t *testing.T, s *credentials.Store, profile string) credentials.Grant {
	t.Helper()
	g, ok, err := s.Grant(profile)
	if err != nil || !ok {
		t.Fatalf("Grant(%s) = %v, %v, %v; want a grant", profile, g, ok, err)
	}
	return g
}

func TestNewLoadsFromEnvAndFile(t *testing.T) {
	s, _ := newStore(t)
	tests := []struct {
		profile  string
		cred     string
		secret   string
		leasable bool
	}{
		{"chat", "upstream", upstreamSecret, true},
		{"code", "upstream", upstreamSecret, true},
		{"batch", "backup", backupSecret, true}, // the file's trailing "\r\n\n" is not part of it
		{"local", "", "", false},
		{edgeconfig.DefaultProfileName, "", "", false}, // not in the file, but always a profile
	}
	for _, tt := range tests {
		g, ok, err := s.Grant(tt.profile)
		if err != nil || ok != tt.leasable {
			t.Errorf("Grant(%s) = %v, %v; want ok %v", tt.profile, ok, err, tt.leasable)
			continue
		}
		want := credentials.Grant{}
		if tt.leasable {
			want = credentials.Grant{Credential: tt.cred, Kind: edgeconfig.CredentialKindBearer, Revision: 1, Secret: []byte(tt.secret)}
		}
		if !reflect.DeepEqual(g, want) {
			t.Errorf("Grant(%s) = %#v (secret %q), want %#v", tt.profile, g, g.Secret, want)
		}
	}
}

func TestNewReadsTheRealEnvironmentAndFiles(t *testing.T) {
	path := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(path, []byte(backupSecret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("IOP_TEST_UPSTREAM_KEY", upstreamSecret)
	c := managedConfig()
	c.Credentials[0].Env, c.Credentials[1].File = "IOP_TEST_UPSTREAM_KEY", path
	s, err := credentials.New(c, credentials.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if g := mustGrant(t, s, "chat"); string(g.Secret) != upstreamSecret {
		t.Errorf("env secret %q", g.Secret)
	}
	if g := mustGrant(t, s, "batch"); string(g.Secret) != backupSecret {
		t.Errorf("file secret %q", g.Secret)
	}
}

func TestNewRefusesUnusableSourcesNamingThemWithoutTheValue(t *testing.T) {
	tests := []struct {
		name   string
		change func(src *sources)
		want   []string // in the message
		is     error
	}{
		{"env not set", func(src *sources) { delete(src.env, "OPENAI_API_KEY") },
			[]string{`credential "upstream" from env:OPENAI_API_KEY: the environment variable is not set or is empty`}, nil},
		{"env empty", func(src *sources) { src.env["OPENAI_API_KEY"] = "" }, []string{"env:OPENAI_API_KEY", "not set or is empty"}, nil},
		{"file missing", func(src *sources) { delete(src.files, "/run/secrets/backup") },
			[]string{`credential "backup" from file:/run/secrets/backup: open: file does not exist`}, fs.ErrNotExist},
		{"file unreadable", func(src *sources) { src.errs["/run/secrets/backup"] = fs.ErrPermission },
			[]string{`credential "backup" from file:/run/secrets/backup: open: permission denied`}, fs.ErrPermission},
		{"file of newlines", func(src *sources) { src.files["/run/secrets/backup"] = []byte("\n\r\n") },
			[]string{`credential "backup" from file:/run/secrets/backup: the file is empty`}, nil},
		{"space inside", func(src *sources) { src.env["OPENAI_API_KEY"] = "sk-SECRET with-space" },
			[]string{`credential "upstream" from env:OPENAI_API_KEY: the value has whitespace or a control character at byte 9 of 20`}, nil},
		{"leading space in a file", func(src *sources) { src.files["/run/secrets/backup"] = []byte(" " + backupSecret) },
			[]string{"file:/run/secrets/backup", "at byte 0"}, nil},
		{"control character", func(src *sources) { src.env["OPENAI_API_KEY"] = "SECRET\x00" }, []string{"control character at byte 6"}, nil},
		{"too large for a lease", func(src *sources) { src.env["OPENAI_API_KEY"] = "SECRET" + strings.Repeat("k", lease.MaxSecretSize) },
			[]string{fmt.Sprintf("the value is %d bytes, over the limit of %d a lease carries", lease.MaxSecretSize+6, lease.MaxSecretSize)}, nil},
		{"every problem at once", func(src *sources) { src.env = map[string]string{}; src.files = map[string][]byte{} },
			[]string{`credential "upstream" from env:OPENAI_API_KEY`, `credential "backup" from file:/run/secrets/backup`}, fs.ErrNotExist},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := newSources()
			tt.change(src)
			s, err := credentials.New(managedConfig(), credentials.Options{Getenv: src.getenv, ReadFile: src.readFile})
			var se *credentials.SourceError
			if s != nil || !errors.As(err, &se) {
				t.Fatalf("New = %v, %v; want a *SourceError", s, err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q\nwant it to contain %q", err, w)
				}
			}
			if tt.is != nil && !errors.Is(err, tt.is) {
				t.Errorf("error %v is not %v", err, tt.is)
			}
			noSecret(t, "the error", err.Error())
		})
	}
}

func TestNewRefusesWhatValidateRefuses(t *testing.T) {
	tests := []struct {
		name   string
		change func(c *edgeconfig.Config)
		want   string
	}{
		{"duplicate credential", func(c *edgeconfig.Config) { c.Credentials[1].Name = "upstream" }, `credentials[1].name: duplicate credential "upstream"`},
		{"both sources", func(c *edgeconfig.Config) { c.Credentials[0].File = "/k" }, "set exactly one of env and file"},
		{"no source", func(c *edgeconfig.Config) { c.Credentials[0].Env = "" }, "set exactly one of env and file"},
		{"bad kind", func(c *edgeconfig.Config) { c.Credentials[0].Kind = "basic" }, `kind must be "bearer", got "basic"`},
		{"bad name", func(c *edgeconfig.Config) { c.Credentials[0].Name = "up stream" }, "credentials[0]: name: must be 1 to 128"},
		{"unknown credential", func(c *edgeconfig.Config) { c.Profiles[0].Credential = "openai" },
			`profiles[0].credential: no credential named "openai"; configured: upstream, backup`},
		{"duplicate profile", func(c *edgeconfig.Config) { c.Profiles[1].Name = "chat" }, `profiles[1].name: duplicate profile "chat"`},
		{"loopback mode", func(c *edgeconfig.Config) { c.Identity = yamlconf.Identity{Mode: yamlconf.ModeLoopback} },
			"profiles[0].credential: credential leases need identity.mode mtls (managed mode)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := managedConfig()
			tt.change(c)
			src := newSources()
			if _, err := credentials.New(c, credentials.Options{Getenv: src.getenv, ReadFile: src.readFile}); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("New = %v, want an error containing %q", err, tt.want)
			}
		})
	}
	if _, err := credentials.New(nil, credentials.Options{}); err == nil {
		t.Error("New(nil) succeeded")
	}
}

func TestNewAcceptsUnusedCredentialsInLoopbackMode(t *testing.T) {
	c := managedConfig()
	c.Identity = yamlconf.Identity{Mode: yamlconf.ModeLoopback}
	c.Profiles = nil
	src := newSources()
	s, err := credentials.New(c, credentials.Options{Getenv: src.getenv, ReadFile: src.readFile})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok, err := s.Grant(edgeconfig.DefaultProfileName); ok || err != nil {
		t.Errorf("Grant(default) = %v, %v; want nothing to lease", ok, err)
	}
}

func TestGrantReturnsACopyTheCallerMayWipe(t *testing.T) {
	s, _ := newStore(t)
	g := mustGrant(t, s, "chat")
	clear(g.Secret)
	if g := mustGrant(t, s, "chat"); string(g.Secret) != upstreamSecret {
		t.Errorf("after wiping a grant the store holds %q", g.Secret)
	}
}

// SPEC S4: a revoked or disabled credential, or a disabled profile, fails closed; a profile's
// refusal never falls back to another credential.
func TestGrantRefusals(t *testing.T) {
	tests := []struct {
		name    string
		change  func(s *credentials.Store) error
		profile string
		is      error
		reason  string
		message string
	}{
		{"profile disabled", func(s *credentials.Store) error { return s.DisableProfile("chat") }, "chat",
			credentials.ErrProfileDisabled, credentials.ReasonProfileDisabled, `profile "chat" is disabled`},
		{"credential disabled", func(s *credentials.Store) error { return s.DisableCredential("upstream") }, "code",
			credentials.ErrCredentialDisabled, credentials.ReasonCredentialDisabled, `credential "upstream" is disabled`},
		{"credential revoked", func(s *credentials.Store) error { _, err := s.Revoke("upstream"); return err }, "chat",
			credentials.ErrCredentialRevoked, credentials.ReasonCredentialRevoked, `credential "upstream" is revoked (revision 2): reload it with a new secret`},
		{"profile disabled wins over a revoked credential", func(s *credentials.Store) error {
			_, err := s.Revoke("upstream")
			return errors.Join(err, s.DisableProfile("chat"))
		}, "chat", credentials.ErrProfileDisabled, credentials.ReasonProfileDisabled, ""},
		{"credential disabled wins over revoked", func(s *credentials.Store) error {
			_, err := s.Revoke("backup")
			return errors.Join(err, s.DisableCredential("backup"))
		}, "batch", credentials.ErrCredentialDisabled, credentials.ReasonCredentialDisabled, ""},
		{"unknown profile", func(*credentials.Store) error { return nil }, "fast",
			credentials.ErrUnknown, credentials.ReasonUnknown, `no profile named "fast"; configured: batch, chat, code, default, local`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, _ := newStore(t)
			if err := tt.change(s); err != nil {
				t.Fatal(err)
			}
			g, ok, err := s.Grant(tt.profile)
			var e *credentials.Error
			if ok || g.Secret != nil || !errors.Is(err, tt.is) || !errors.As(err, &e) || e.Reason != tt.reason {
				t.Fatalf("Grant(%s) = %v, %v, %v; want an *Error %s", tt.profile, g, ok, err, tt.reason)
			}
			if !strings.Contains(err.Error(), tt.message) {
				t.Errorf("message %q, want it to contain %q", err, tt.message)
			}
			for _, other := range []error{credentials.ErrProfileDisabled, credentials.ErrCredentialDisabled, credentials.ErrCredentialRevoked, credentials.ErrUnknown} {
				if other != tt.is && errors.Is(err, other) {
					t.Errorf("%v also matches %v", err, other)
				}
			}
		})
	}
}

func TestRefusalsStayWithTheirProfileAndCredential(t *testing.T) {
	s, _ := newStore(t)
	if err := s.DisableProfile("chat"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Revoke("backup"); err != nil {
		t.Fatal(err)
	}
	// code shares chat's credential but not its profile; upstream is not backup.
	if g := mustGrant(t, s, "code"); g.Credential != "upstream" || g.Revision != 1 {
		t.Errorf("code = %v", g)
	}
}

func TestTheManagedExampleLeasesItsCredential(t *testing.T) {
	c, err := edgeconfig.Load("../../../configs/edge-managed.yaml")
	if err != nil {
		t.Fatal(err)
	}
	s, err := credentials.New(c, credentials.Options{Getenv: func(k string) string { return map[string]string{"OPENAI_API_KEY": upstreamSecret}[k] }})
	if err != nil {
		t.Fatal(err)
	}
	if g := mustGrant(t, s, "hosted"); g.Credential != "upstream" || string(g.Secret) != upstreamSecret {
		t.Errorf("Grant(hosted) = %v", g)
	}
}

func TestGrantNeverPrintsItsSecret(t *testing.T) {
	s, _ := newStore(t)
	g := mustGrant(t, s, "chat")
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x"} {
		out := fmt.Sprintf(verb, g)
		noSecret(t, verb, out)
		if !strings.Contains(out, "secret redacted") {
			t.Errorf("%s = %s", verb, out)
		}
	}
	var buf bytes.Buffer
	slog.New(slog.NewJSONHandler(&buf, nil)).Info("granted", "grant", g)
	noSecret(t, "the log", buf.String())
	if !strings.Contains(buf.String(), `"credential":"upstream"`) {
		t.Errorf("log %s", buf.String())
	}
}
