package credentials_test

import (
	"errors"
	"testing"

	"github.com/iop-dev/iop/internal/edge/credentials"
	"github.com/iop-dev/iop/internal/edge/edgeconfig"
)

// changed reports whether ch is closed.
func changed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// A config reload: unchanged credentials keep value, revision and state; one whose source
// changed is read again at a higher revision; a removed one that comes back starts above its
// last revision; profiles follow the new file.
func TestApplyCarriesStateOverAndRaisesChangedSources(t *testing.T) {
	s, src := newStore(t)
	if _, err := s.Revoke("backup"); err != nil { // backup at revision 2, revoked
		t.Fatal(err)
	}
	if err := s.DisableProfile("chat"); err != nil {
		t.Fatal(err)
	}
	ch := s.Changed()
	if err := s.Apply(managedConfig()); err != nil {
		t.Fatal(err)
	}
	if changed(ch) {
		t.Error("applying the same configuration fired Changed")
	}
	if v, _ := s.View("backup"); v.Revision != 2 || !v.Revoked {
		t.Errorf("backup after an unchanged reload: %+v; want revision 2, still revoked", v)
	}
	if _, _, err := s.Grant("chat"); !errors.Is(err, credentials.ErrProfileDisabled) {
		t.Errorf("chat after an unchanged reload: %v; want still disabled", err)
	}
	if g := mustGrant(t, s, "code"); string(g.Secret) != upstreamSecret || g.Revision != 1 {
		t.Errorf("code after an unchanged reload: %v %q", g, g.Secret)
	}

	// upstream moves to another variable; batch now uses upstream; backup is removed.
	src.setEnv("OPENAI_KEY_2", rotatedSecret)
	next := managedConfig()
	next.Credentials = next.Credentials[:1]
	next.Credentials[0].Env = "OPENAI_KEY_2"
	next.Profiles[2].Credential = "upstream"
	ch = s.Changed()
	if err := s.Apply(next); err != nil {
		t.Fatal(err)
	}
	if !changed(ch) {
		t.Error("a reload that changed credentials did not fire Changed")
	}
	if g := mustGrant(t, s, "batch"); string(g.Secret) != rotatedSecret || g.Revision != 2 || g.Credential != "upstream" {
		t.Errorf("batch after the reload: %v; want upstream's new value at revision 2", g)
	}
	if _, err := s.View("backup"); !errors.Is(err, credentials.ErrUnknown) {
		t.Errorf("removed backup: %v; want unknown", err)
	}
	if n := s.Notice(); n.CredentialRevisions["upstream"] != 2 || len(n.CredentialRevisions) != 1 {
		t.Errorf("notice %v", n)
	}

	// backup comes back: above the revision Nodes last saw for it (2).
	if err := s.Apply(managedConfig()); err != nil {
		t.Fatal(err)
	}
	if v, _ := s.View("backup"); v.Revision != 3 || v.Revoked {
		t.Errorf("backup added back: %+v; want revision 3, not revoked", v)
	}
	if g := mustGrant(t, s, "batch"); string(g.Secret) != backupSecret {
		t.Errorf("batch after backup came back: %v", g)
	}
}

// All or nothing: a credential that cannot be read refuses the whole reload, and a profile
// that the running store serves keeps being served.
func TestApplyRefusesAnUnreadableCredentialAndChangesNothing(t *testing.T) {
	s, _ := newStore(t)
	next := managedConfig()
	next.Credentials = append(next.Credentials, edgeconfig.Credential{Name: "extra", Env: "NOT_SET", Kind: edgeconfig.CredentialKindBearer})
	next.Profiles[3].Credential = "extra"
	next.Credentials[0].Env = "ALSO_NOT_SET"
	ch := s.Changed()
	err := s.Apply(next)
	var se *credentials.SourceError
	if !errors.As(err, &se) {
		t.Fatalf("Apply = %v; want a *SourceError", err)
	}
	noSecret(t, "the error", err.Error())
	if changed(ch) {
		t.Error("a refused reload fired Changed")
	}
	if g := mustGrant(t, s, "chat"); string(g.Secret) != upstreamSecret || g.Revision != 1 {
		t.Errorf("chat after a refused reload: %v", g)
	}
	if _, ok, err := s.Grant("local"); ok || err != nil {
		t.Errorf("local after a refused reload: %v, %v; want still no credential", ok, err)
	}
	if _, err := s.View("extra"); !errors.Is(err, credentials.ErrUnknown) {
		t.Errorf("extra after a refused reload: %v; want unknown", err)
	}

	bad := managedConfig()
	bad.Profiles[0].Credential = "nowhere"
	if err := s.Apply(bad); !errors.Is(err, credentials.ErrUnknown) {
		t.Errorf("Apply with a profile naming no credential: %v", err)
	}
}
