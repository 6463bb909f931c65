package registrar

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/iop-dev/iop/internal/pgtest"
)

// Issue 22: every enrollment action is in the cluster's audit log, written
// with the action (a refused one writes nothing), and others add theirs
// with Audit; the log is read newest first, a page at a time.
func TestEnrollmentActionsAreAudited(t *testing.T) {
	f := newFixtureOn(t, newPGEnv(t, pgtest.Start(t), "edge-1"))
	ctx := t.Context()
	tok, _, err := f.svc.NewToken("gpu-1", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	leaf := f.joinLeaf(tok)
	f.now = f.now.Add(time.Hour)
	if _, err := f.svc.Renew("gpu-1", csr(t)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := f.svc.RemoveBy(ctx, "admin-api:alice", "gpu-1"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.svc.Restore("gpu-1"); err != nil {
		t.Fatal(err)
	}
	// Refused: nothing written.
	if _, _, err := f.svc.Remove("nobody"); !errors.Is(err, ErrUnknownNode) {
		t.Fatal(err)
	}
	if resp := f.join(tok); resp.GetRefusal() == 0 {
		t.Fatal("a used token joined")
	}
	if err := f.svc.Audit(ctx, "edged (SIGHUP)", "config.reloaded", "edge-1", map[string]any{"changed": []string{"routes"}}); err != nil {
		t.Fatal(err)
	}

	want := []struct{ actor, action, subject string }{
		{"edged (SIGHUP)", "config.reloaded", "edge-1"},
		{ActorAdminSocket, ActionNodeRestored, "gpu-1"},
		{"admin-api:alice", ActionNodeRemoved, "gpu-1"},
		{"node gpu-1", ActionNodeRenewed, "gpu-1"},
		{"join from test", ActionNodeJoined, "gpu-1"},
		{ActorAdminSocket, ActionTokenIssued, "gpu-1"},
	}
	var got []AuditEntry
	for before := int64(0); ; {
		page, err := f.svc.AuditLog(ctx, before, 4)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, page...)
		if len(page) < 4 {
			break
		}
		before = page[len(page)-1].ID
	}
	if len(got) != len(want) {
		t.Fatalf("%d entries, want %d: %+v", len(got), len(want), got)
	}
	for i, w := range want {
		e := got[i]
		if e.Actor != w.actor || e.Action != w.action || e.Subject != w.subject || e.EdgeID != "edge-1" {
			t.Errorf("entry %d: %s %s %s on %s, want %s %s %s on edge-1", i, e.Actor, e.Action, e.Subject, e.EdgeID, w.actor, w.action, w.subject)
		}
	}
	var joined struct {
		Serial string `json:"serial"`
		Token  string `json:"token"`
	}
	if err := json.Unmarshal(got[4].Detail, &joined); err != nil || joined.Serial != Serial(leaf) || joined.Token != tok.ID {
		t.Errorf("the join's detail %s (%v), want serial %s and token %s", got[4].Detail, err, Serial(leaf), tok.ID)
	}
	var removed struct {
		Revoked []string `json:"revoked_serials"`
	}
	if err := json.Unmarshal(got[2].Detail, &removed); err != nil || len(removed.Revoked) != 2 {
		t.Errorf("the removal's detail %s (%v), want its two revoked serials", got[2].Detail, err)
	}
}

// A single Edge keeps no audit log, and says so; Audit is not an error.
func TestASingleEdgeKeepsNoAuditLog(t *testing.T) {
	f := newFixture(t)
	if err := f.svc.Audit(context.Background(), "x", "config.reloaded", "edge-1", nil); err != nil {
		t.Errorf("Audit: %v", err)
	}
	if _, err := f.svc.AuditLog(context.Background(), 0, 10); !errors.Is(err, ErrNoAuditLog) {
		t.Errorf("AuditLog: %v, want ErrNoAuditLog", err)
	}
}

// The admin socket serves the audit log a page at a time, and says when
// there is none; a cluster Edge whose database is gone refuses a removal
// on the socket with ErrDatabaseUnreachable, which the client matches.
func TestTheAdminSocketServesTheAuditLog(t *testing.T) {
	srv := pgtest.NewServer(t)
	f := newFixtureOn(t, newPGEnv(t, srv.CreateDatabase(t), "edge-1"))
	c := serveSocket(t, f)
	for _, id := range []string{"gpu-1", "gpu-2", "gpu-3"} {
		if _, err := c.AddToken(id, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	page, err := c.AuditLog(0, 2)
	if err != nil || len(page) != 2 || page[0].Subject != "gpu-3" || page[1].Subject != "gpu-2" {
		t.Fatalf("first page: %+v %v", page, err)
	}
	page, err = c.AuditLog(page[1].ID, 2)
	if err != nil || len(page) != 1 || page[0].Subject != "gpu-1" || page[0].Action != ActionTokenIssued {
		t.Fatalf("second page: %+v %v", page, err)
	}
	if _, err := c.AuditLog(0, MaxAuditPage+1); err == nil {
		t.Error("a page over the bound was served")
	}

	srv.Stop(t)
	if _, err := c.Remove("gpu-1"); !errors.Is(err, ErrDatabaseUnreachable) || !strings.Contains(err.Error(), "joins and removals need it") {
		t.Errorf("remove with the database stopped: %v", err)
	}

	single := newFixture(t)
	if _, err := serveSocket(t, single).AuditLog(0, 10); !errors.Is(err, ErrNoAuditLog) {
		t.Errorf("a single Edge's audit log: %v, want ErrNoAuditLog", err)
	}
}
