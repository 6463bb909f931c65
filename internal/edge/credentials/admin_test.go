package credentials_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/iop-dev/iop/internal/edge/credentials"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

func TestRevokeAndReloadRevisions(t *testing.T) {
	s, src := newStore(t)
	steps := []struct {
		op       string // revoke or reload
		revision uint64
		revoked  bool
	}{
		{"revoke", 2, true},  // raises and stops leases
		{"reload", 2, false}, // after a revoke: keeps the raised revision
		{"reload", 3, false}, // without a revoke: raises, the value may have changed
		{"revoke", 4, true},
		{"revoke", 5, true}, // again: raises again
		{"reload", 5, false},
	}
	for i, st := range steps {
		if st.op == "reload" {
			src.setEnv("OPENAI_API_KEY", fmt.Sprintf("%s-%d", rotatedSecret, i))
		}
		var rev uint64
		var err error
		if st.op == "revoke" {
			rev, err = s.Revoke("upstream")
		} else {
			rev, err = s.Reload("upstream")
		}
		if err != nil || rev != st.revision {
			t.Fatalf("step %d: %s = %d, %v; want revision %d", i, st.op, rev, err, st.revision)
		}
		g, ok, err := s.Grant("chat")
		switch {
		case st.revoked && (ok || !errors.Is(err, credentials.ErrCredentialRevoked)):
			t.Errorf("step %d: Grant after %s = %v, %v; want revoked", i, st.op, ok, err)
		case !st.revoked && (err != nil || g.Revision != st.revision || string(g.Secret) != fmt.Sprintf("%s-%d", rotatedSecret, i)):
			t.Errorf("step %d: Grant after %s = %v %q, %v; want the reloaded value at revision %d", i, st.op, g, g.Secret, err, st.revision)
		}
		if v, _ := s.View("upstream"); v.Revision != st.revision || v.Revoked != st.revoked {
			t.Errorf("step %d: view %+v", i, v)
		}
	}
	// The other credential is untouched.
	if g := mustGrant(t, s, "batch"); g.Revision != 1 {
		t.Errorf("backup revision %d", g.Revision)
	}
}

func TestFailedReloadChangesNothing(t *testing.T) {
	s, src := newStore(t)
	src.setEnv("OPENAI_API_KEY", "")
	changed := s.Changed()
	rev, err := s.Reload("upstream")
	var se *credentials.SourceError
	if rev != 0 || !errors.As(err, &se) || se.Source != "env:OPENAI_API_KEY" || se.Credential != "upstream" {
		t.Fatalf("Reload = %d, %v; want a *SourceError", rev, err)
	}
	if g := mustGrant(t, s, "chat"); g.Revision != 1 || string(g.Secret) != upstreamSecret {
		t.Errorf("after a failed reload: %v %q; want the old value at revision 1", g, g.Secret)
	}
	select {
	case <-changed:
		t.Error("a failed reload closed Changed")
	default:
	}

	if _, err := s.Revoke("upstream"); err != nil {
		t.Fatal(err)
	}
	changed = s.Changed()
	if _, err := s.Reload("upstream"); err == nil {
		t.Fatal("Reload of an empty variable succeeded")
	}
	if _, _, err := s.Grant("chat"); !errors.Is(err, credentials.ErrCredentialRevoked) {
		t.Errorf("after a failed reload of a revoked credential: %v; want still revoked", err)
	}
	select {
	case <-changed:
		t.Error("a failed reload closed Changed")
	default:
	}
	src.setEnv("OPENAI_API_KEY", rotatedSecret)
	if rev, err := s.Reload("upstream"); err != nil || rev != 2 {
		t.Errorf("Reload = %d, %v; want revision 2", rev, err)
	}
}

func TestDisableAndEnable(t *testing.T) {
	s, _ := newStore(t)
	if err := s.DisableCredential("upstream"); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"chat", "code"} {
		if _, _, err := s.Grant(p); !errors.Is(err, credentials.ErrCredentialDisabled) {
			t.Errorf("Grant(%s) with upstream disabled = %v", p, err)
		}
	}
	mustGrant(t, s, "batch")
	if err := s.EnableCredential("upstream"); err != nil {
		t.Fatal(err)
	}
	if g := mustGrant(t, s, "chat"); g.Revision != 1 {
		t.Errorf("disable and enable changed the revision to %d", g.Revision)
	}

	if err := s.DisableProfile("batch"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Grant("batch"); !errors.Is(err, credentials.ErrProfileDisabled) {
		t.Errorf("Grant(batch) disabled = %v", err)
	}
	if err := s.EnableProfile("batch"); err != nil {
		t.Fatal(err)
	}
	mustGrant(t, s, "batch")

	// A profile without a credential has no lease to stop.
	if err := s.DisableProfile("local"); !errors.Is(err, credentials.ErrNoCredential) ||
		err.Error() != `profile "local" uses no credential, so it has no lease to disable` {
		t.Errorf("DisableProfile(local) = %v", err)
	}
	if err := s.EnableProfile("local"); err != nil {
		t.Errorf("EnableProfile(local) = %v", err)
	}
}

func TestUnknownNames(t *testing.T) {
	s, _ := newStore(t)
	ops := map[string]func() error{
		"Revoke":            func() error { _, err := s.Revoke("nope"); return err },
		"Reload":            func() error { _, err := s.Reload("nope"); return err },
		"DisableCredential": func() error { return s.DisableCredential("nope") },
		"EnableCredential":  func() error { return s.EnableCredential("nope") },
		"DisableProfile":    func() error { return s.DisableProfile("nope") },
		"EnableProfile":     func() error { return s.EnableProfile("nope") },
		"View":              func() error { _, err := s.View("nope"); return err },
		"ProfileView":       func() error { _, err := s.ProfileView("nope"); return err },
		"Grant":             func() error { _, _, err := s.Grant("nope"); return err },
	}
	for name, op := range ops {
		err := op()
		var e *credentials.Error
		if !errors.Is(err, credentials.ErrUnknown) || !errors.As(err, &e) || e.Name != "nope" {
			t.Errorf("%s(nope) = %v; want ErrUnknown", name, err)
		}
	}
	_, err := s.Revoke("nope")
	if want := `no credential named "nope"; configured: upstream, backup`; err.Error() != want {
		t.Errorf("message %q, want %q", err, want)
	}
}

func TestNoticeIsTheFullState(t *testing.T) {
	s, _ := newStore(t)
	want := &wirepb.CredentialNotice{CredentialRevisions: map[string]uint64{"upstream": 1, "backup": 1}}
	if got := s.Notice(); !noticeEqual(got, want) {
		t.Errorf("initial notice %v, want %v", got, want)
	}
	_, _ = s.Revoke("backup")
	_ = s.DisableCredential("upstream")
	_ = s.DisableCredential("backup")
	_ = s.DisableProfile("code")
	_ = s.DisableProfile("batch")
	want = &wirepb.CredentialNotice{
		CredentialRevisions: map[string]uint64{"upstream": 1, "backup": 2},
		DisabledProfiles:    []string{"batch", "code"},
		DisabledCredentials: []string{"backup", "upstream"},
	}
	if got := s.Notice(); !noticeEqual(got, want) {
		t.Errorf("notice %v, want %v", got, want)
	}
	// Each notice is the caller's: changing it changes nothing here.
	n := s.Notice()
	n.CredentialRevisions["upstream"] = 99
	n.DisabledProfiles[0] = "x"
	if got := s.Notice(); !noticeEqual(got, want) {
		t.Errorf("after editing a notice: %v", got)
	}
}

func noticeEqual(a, b *wirepb.CredentialNotice) bool {
	return reflect.DeepEqual(a.GetCredentialRevisions(), b.GetCredentialRevisions()) &&
		reflect.DeepEqual(a.GetDisabledProfiles(), b.GetDisabledProfiles()) &&
		reflect.DeepEqual(a.GetDisabledCredentials(), b.GetDisabledCredentials())
}

func TestChangedFiresOnEveryChange(t *testing.T) {
	s, src := newStore(t)
	changes := []struct {
		name    string
		op      func() error
		changes bool
	}{
		{"revoke", func() error { _, err := s.Revoke("upstream"); return err }, true},
		{"reload", func() error { _, err := s.Reload("upstream"); return err }, true},
		{"disable credential", func() error { return s.DisableCredential("backup") }, true},
		{"disable it again", func() error { return s.DisableCredential("backup") }, false},
		{"enable credential", func() error { return s.EnableCredential("backup") }, true},
		{"enable it again", func() error { return s.EnableCredential("backup") }, false},
		{"disable profile", func() error { return s.DisableProfile("chat") }, true},
		{"enable profile", func() error { return s.EnableProfile("chat") }, true},
		{"enable a profile without credential", func() error { return s.EnableProfile("local") }, false},
		{"grant", func() error { _, _, err := s.Grant("chat"); return err }, false},
		{"failed reload", func() error { src.setEnv("OPENAI_API_KEY", ""); _, _ = s.Reload("upstream"); return nil }, false},
	}
	for _, c := range changes {
		ch := s.Changed()
		if err := c.op(); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		select {
		case <-ch:
			if !c.changes {
				t.Errorf("%s closed Changed", c.name)
			}
		default:
			if c.changes {
				t.Errorf("%s did not close Changed", c.name)
			}
		}
	}
}

func TestViewsShowStateAndSourceNeverTheValue(t *testing.T) {
	s, _ := newStore(t)
	_, _ = s.Revoke("upstream")
	_ = s.DisableCredential("backup")
	_ = s.DisableProfile("chat")
	want := []credentials.View{
		{Name: "backup", Kind: "bearer", Source: "file:/run/secrets/backup", Revision: 1, Disabled: true, Profiles: []string{"batch"}},
		{Name: "upstream", Kind: "bearer", Source: "env:OPENAI_API_KEY", Revision: 2, Revoked: true, Profiles: []string{"chat", "code"}},
	}
	if got := s.Views(); !reflect.DeepEqual(got, want) {
		t.Errorf("Views:\n got %+v\nwant %+v", got, want)
	}
	wantProfiles := []credentials.ProfileView{
		{Name: "batch", Credential: "backup"}, {Name: "chat", Credential: "upstream", Disabled: true},
		{Name: "code", Credential: "upstream"}, {Name: "default"}, {Name: "local"},
	}
	if got := s.ProfileViews(); !reflect.DeepEqual(got, wantProfiles) {
		t.Errorf("ProfileViews:\n got %+v\nwant %+v", got, wantProfiles)
	}
	if v, err := s.ProfileView("chat"); err != nil || v != wantProfiles[1] {
		t.Errorf("ProfileView(chat) = %+v, %v", v, err)
	}
	_, _ = s.Reload("upstream")
	out, err := json.Marshal(struct {
		C []credentials.View
		P []credentials.ProfileView
	}{s.Views(), s.ProfileViews()})
	if err != nil {
		t.Fatal(err)
	}
	noSecret(t, "the views", string(out))
}

// Grant is called per dispatch while an operator revokes and reloads: every grant must be a
// consistent value and revision, and the revisions one caller sees never go down.
func TestConcurrentGrantRevokeReload(t *testing.T) {
	s, src := newStore(t)
	const rounds = 200
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var last uint64
			for {
				select {
				case <-stop:
					return
				default:
				}
				g, ok, err := s.Grant("chat")
				switch {
				case err != nil && !errors.Is(err, credentials.ErrCredentialRevoked) && !errors.Is(err, credentials.ErrCredentialDisabled):
					t.Errorf("Grant: %v", err)
					return
				case ok && g.Revision < last:
					t.Errorf("revision went from %d to %d", last, g.Revision)
					return
				case ok && !strings.HasPrefix(string(g.Secret), "sk-upstream-SECRET-"):
					t.Errorf("grant of revision %d has a torn value", g.Revision)
					return
				case ok:
					last = g.Revision
					clear(g.Secret)
				}
				_ = s.Notice()
				_ = s.Views()
			}
		}()
	}
	for i := range rounds {
		src.setEnv("OPENAI_API_KEY", fmt.Sprintf("%s-%d", rotatedSecret, i))
		switch i % 4 {
		case 0:
			_, _ = s.Revoke("upstream")
		case 1, 2:
			_, _ = s.Reload("upstream")
		case 3:
			_ = s.DisableCredential("upstream")
			_ = s.EnableCredential("upstream")
		}
	}
	close(stop)
	wg.Wait()
	// rounds/4 revokes and rounds/2 reloads, each raising by one except the reloads right after
	// a revoke.
	if v, _ := s.View("upstream"); v.Revision != 1+rounds/4+rounds/4 {
		t.Errorf("final revision %d, want %d", v.Revision, 1+rounds/4+rounds/4)
	}
}
