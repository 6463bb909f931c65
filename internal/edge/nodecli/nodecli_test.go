package nodecli

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/iop-dev/iop/internal/edge/datadir"
	"github.com/iop-dev/iop/internal/edge/registrar"
)

func TestTheJoinCommandNamesAReachableAddress(t *testing.T) {
	host, _ := os.Hostname()
	for in, want := range map[string]string{
		"edge.example.com:7443": "edge.example.com:7443",
		"10.0.0.5:7443":         "10.0.0.5:7443",
		"0.0.0.0:7443":          host + ":7443",
		"[::]:7443":             host + ":7443",
		":7443":                 host + ":7443",
	} {
		if got := joinAddr(in); got != want {
			t.Errorf("joinAddr(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestListShowsEachNodesNewestCertificateAndState(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	cert := func(serial string, nb time.Time) registrar.CertRecord {
		return registrar.CertRecord{Serial: serial, NotBefore: nb, NotAfter: nb.Add(time.Hour)}
	}
	var out bytes.Buffer
	err := printList(&out, []registrar.NodeStatus{
		{ID: "a", Identity: "spiffe://t/node/a", Connected: "ready", LastSeen: now,
			Certificates: []registrar.CertRecord{cert("old", now.Add(-2*time.Hour)), cert("new", now.Add(-time.Minute))}},
		{ID: "b", Identity: "spiffe://t/node/b", Removed: now, Certificates: []registrar.CertRecord{cert("rev", now)}},
		{ID: "c", Identity: "spiffe://t/node/c", Tokens: []registrar.PendingToken{{ID: "tok", Expires: now}}},
		{ID: "d", Identity: "spiffe://t/node/d", Certificates: []registrar.CertRecord{cert("gone", now.Add(-3*time.Hour))}},
	}, now)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	for i, want := range []string{"NODE", "a .* ready .* new .*2026-01-01T12:59:00Z .*2026-01-01T12:00:00Z", "b .* removed .* rev", "c .* token pending .* - ", "d .* expired .* gone"} {
		if i >= len(lines) || !matches(want, lines[i]) {
			t.Errorf("line %d: %q, want %q\n%s", i, lines, want, out.String())
		}
	}
}

func matches(pattern, s string) bool {
	return regexp.MustCompile(pattern).MatchString(s)
}

// Without a running Edge, `edged node` opens the store itself: it refuses a
// data_dir the Edge would refuse, and one of another user, whose store it
// would leave unreadable to the Edge (issue 24, gap 2).
func TestOfflineCommandsRunOnlyAsTheEdgesUserOnASafeDataDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	if err := offlineAllowed(dir); err != nil {
		t.Fatalf("a data_dir no Edge has made yet: %v", err)
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("data_dir made as %v (%v), want 0700", fi.Mode(), err)
	}
	if err := offlineAllowed(dir); err != nil {
		t.Fatalf("the Edge's own data_dir: %v", err)
	}
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := offlineAllowed(dir); !errors.Is(err, datadir.ErrUnsafe) {
		t.Errorf("a world-writable data_dir: %v, want ErrUnsafe", err)
	}
	if os.Geteuid() != 0 {
		t.Skip("changing data_dir's owner needs root")
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	err := offlineAllowed(dir)
	if !errors.Is(err, errNotOwner) || !strings.Contains(err.Error(), "sudo -u") {
		t.Errorf("root on uid 65534's data_dir: %v, want errNotOwner naming sudo -u", err)
	}
}
