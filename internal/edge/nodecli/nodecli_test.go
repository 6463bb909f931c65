package nodecli

import (
	"bytes"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

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
