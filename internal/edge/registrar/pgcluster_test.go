package registrar

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/iop-dev/iop/internal/edge/fleet"
	"github.com/iop-dev/iop/internal/pgtest"
	"github.com/iop-dev/iop/quicwire"
	wireenroll "github.com/iop-dev/iop/quicwire/enroll"
	"github.com/iop-dev/iop/quicwire/pki"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// clusterEdge is one Edge of a test cluster: its Service over its own
// pool and PGStore, its fleet registry, and the removals it was told of.
type clusterEdge struct {
	env     *pgEnv
	svc     *Service
	reg     *fleet.Registry
	removed chan string
}

// newClusterEdges starts n Edges over the database at dsn, sharing ca.
func newClusterEdges(t *testing.T, dsn string, ca *pki.CA, n int) []*clusterEdge {
	t.Helper()
	var edges []*clusterEdge
	for i := range n {
		e := &clusterEdge{env: newPGEnv(t, dsn, fmt.Sprintf("edge-%d", i+1)), reg: fleet.New(fleet.Options{}), removed: make(chan string, 16)}
		st := e.env.open(t)
		e.svc = New(st, Options{EdgeID: e.env.edgeID, TrustDomain: "iop.test", CACert: ca.Cert, CA: ca, Lifetime: time.Hour,
			Registry: e.reg, OnRemoved: func(id string) { e.removed <- id }})
		edges = append(edges, e)
	}
	return edges
}

func newTestCA(t *testing.T) *pki.CA {
	t.Helper()
	ca, err := pki.NewCA("iop.test", pki.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func (e *clusterEdge) join(t *testing.T, tok wireenroll.Token) *wirepb.JoinResponse {
	return e.svc.join(&wirepb.JoinRequest{TokenId: tok.ID, Secret: tok.Secret, Csr: csr(t)}, "test")
}

// Issue 22: a join token is single-use across the cluster. Two Edges
// redeeming the same token at the same instant: one joins, the other is
// told the token is used, and one certificate is recorded.
func TestATokenRedeemedAtOnceOnTwoEdgesJoinsOnce(t *testing.T) {
	ca := newTestCA(t)
	edges := newClusterEdges(t, pgtest.Start(t), ca, 2)
	const tokens = 30
	for i := range tokens {
		node := fmt.Sprintf("gpu-%d", i)
		tok, _, err := edges[0].svc.NewToken(node, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		resps := make([]*wirepb.JoinResponse, len(edges))
		start := make(chan struct{})
		for j, e := range edges {
			req := &wirepb.JoinRequest{TokenId: tok.ID, Secret: tok.Secret, Csr: csr(t)}
			wg.Go(func() { <-start; resps[j] = e.svc.join(req, "test") })
		}
		close(start)
		wg.Wait()
		joined, used := 0, 0
		for _, r := range resps {
			switch r.GetRefusal() {
			case wirepb.JoinRefusal_JOIN_REFUSAL_UNSPECIFIED:
				joined++
			case wirepb.JoinRefusal_JOIN_REFUSAL_USED_TOKEN:
				used++
			default:
				t.Fatalf("token %d: refused %v %s", i, r.GetRefusal(), r.GetRefusalDetail())
			}
		}
		if joined != 1 || used != 1 {
			t.Fatalf("token %d redeemed at once on two Edges: %d joined, %d told used; want 1 and 1", i, joined, used)
		}
		// A third try, on either Edge, is refused.
		if r := edges[i%2].join(t, tok); r.GetRefusal() != wirepb.JoinRefusal_JOIN_REFUSAL_USED_TOKEN {
			t.Fatalf("token %d, once more: %v", i, r.GetRefusal())
		}
	}
	content, err := edges[1].svc.store.Contents(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(content.Certs) != tokens {
		t.Errorf("%d certificates recorded for %d tokens", len(content.Certs), tokens)
	}
}

// waitRemoved waits for e to be told of nodeID's removal, and returns how
// long it took.
func (e *clusterEdge) waitRemoved(t *testing.T, nodeID string, start time.Time) time.Duration {
	t.Helper()
	// Generous for a loaded machine: the cluster's promise is about a
	// second, and the figure is logged.
	timeout := time.After(10 * time.Second)
	for {
		select {
		case id := <-e.removed:
			if id == nodeID {
				return time.Since(start)
			}
		case <-timeout:
			t.Fatalf("%s was not told of the removal of %s within 10s", e.env.edgeID, nodeID)
		}
	}
}

// Issue 22: a removal on one Edge reaches every Edge within about a
// second, and each fences its connection to the Node; the other Edges
// refuse the Node's certificate from then on.
func TestARemovalOnOneEdgeFencesTheNodeOnEveryEdge(t *testing.T) {
	ca := newTestCA(t)
	edges := newClusterEdges(t, pgtest.Start(t), ca, 3)
	tok, _, _ := edges[0].svc.NewToken("gpu-1", time.Hour)
	resp := edges[1].join(t, tok)
	leaf, err := x509.ParseCertificate(resp.GetChain()[0])
	if err != nil {
		t.Fatal(err)
	}
	var conns []*fleet.Conn
	for _, e := range edges {
		if err := e.svc.Admit("gpu-1", leaf); err != nil {
			t.Fatalf("%s: admit: %v", e.env.edgeID, err)
		}
		conns = append(conns, e.reg.Register(fleet.ConnInfo{NodeID: "gpu-1", Identity: "spiffe://iop.test/node/gpu-1"}))
	}

	start := time.Now()
	if _, fenced, err := edges[2].svc.Remove("gpu-1"); err != nil || !fenced {
		t.Fatalf("remove: fenced=%v err=%v", fenced, err)
	}
	for i, e := range edges {
		took := e.waitRemoved(t, "gpu-1", start)
		t.Logf("%s told of the removal after %v", e.env.edgeID, took)
		if code, _, _ := conns[i].FenceReason(); conns[i].State() != fleet.Fenced || code != quicwire.CloseUnauthenticated {
			t.Errorf("%s: connection %s (%s), want fenced unauthenticated", e.env.edgeID, conns[i].State(), code)
		}
		if err := e.svc.Check("gpu-1", leaf); !errors.Is(err, ErrNodeRemoved) {
			t.Errorf("%s: check after the removal: %v", e.env.edgeID, err)
		}
	}
}

// A removal made while an Edge was not listening (its connection lost) is
// found when it listens again, and fences the Node there too.
func TestARemovalMissedWhileNotListeningIsFoundOnReconnect(t *testing.T) {
	ca := newTestCA(t)
	edges := newClusterEdges(t, pgtest.Start(t), ca, 2)
	if _, err := edges[0].svc.Renew("gpu-1", csr(t)); err != nil {
		t.Fatal(err)
	}
	conn := edges[1].reg.Register(fleet.ConnInfo{NodeID: "gpu-1", Identity: "spiffe://iop.test/node/gpu-1"})
	// Edge 2 stops following; the removal's notification is lost to it.
	edges[1].env.cur.cancel()
	edges[1].env.cur.wg.Wait()
	start := time.Now()
	if _, _, err := edges[0].svc.Remove("gpu-1"); err != nil {
		t.Fatal(err)
	}
	edges[0].waitRemoved(t, "gpu-1", start)
	select {
	case id := <-edges[1].removed:
		t.Fatalf("edge-2 was told of %s while not listening", id)
	default:
	}
	// It listens again: the reload finds the removal.
	run, cancel := context.WithCancel(context.Background())
	edges[1].env.cur.cancel = cancel
	edges[1].env.cur.wg.Go(func() { edges[1].env.cur.listen(run, nil) })
	edges[1].waitRemoved(t, "gpu-1", start)
	if conn.State() != fleet.Fenced {
		t.Errorf("edge-2's connection is %s after it found the removal", conn.State())
	}
}

// Issue 22, fail static: with the database stopped, an Edge admits the
// Nodes it knew and refuses the ones it knew removed, at once; joins,
// renewals, tokens, removals and restores are refused with a named error,
// within the operation's deadline. When the database is back, so is all
// of it.
func TestWithTheDatabaseStoppedTheEdgeFailsStatic(t *testing.T) {
	srv := pgtest.NewServer(t)
	ca := newTestCA(t)
	edges := newClusterEdges(t, srv.CreateDatabase(t), ca, 2)
	a, b := edges[0], edges[1]
	tok, _, _ := a.svc.NewToken("gpu-1", time.Hour)
	kept, err := x509.ParseCertificate(a.join(t, tok).GetChain()[0])
	if err != nil {
		t.Fatal(err)
	}
	tok, _, _ = a.svc.NewToken("gpu-2", time.Hour)
	gone, err := x509.ParseCertificate(a.join(t, tok).GetChain()[0])
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := a.svc.Remove("gpu-2"); err != nil {
		t.Fatal(err)
	}
	b.waitRemoved(t, "gpu-2", time.Now())
	pending, _, _ := a.svc.NewToken("gpu-3", time.Hour)

	srv.Stop(t)

	for _, e := range edges {
		start := time.Now()
		if err := e.svc.Admit("gpu-1", kept); err != nil {
			t.Errorf("%s: a Node known good, database stopped: %v", e.env.edgeID, err)
		}
		if err := e.svc.Check("gpu-2", gone); !errors.Is(err, ErrNodeRemoved) {
			t.Errorf("%s: a Node known removed, database stopped: %v", e.env.edgeID, err)
		}
		t.Logf("%s: checks with the database stopped took %v", e.env.edgeID, time.Since(start))

		start = time.Now()
		resp := e.join(t, pending)
		if resp.GetRefusal() != wirepb.JoinRefusal_JOIN_REFUSAL_UNAVAILABLE || !strings.Contains(resp.GetRefusalDetail(), "cluster database unreachable") ||
			!strings.Contains(resp.GetRefusalDetail(), "joins and removals need it") {
			t.Errorf("%s: join with the database stopped: %v %q", e.env.edgeID, resp.GetRefusal(), resp.GetRefusalDetail())
		}
		if _, _, err := e.svc.Remove("gpu-1"); !errors.Is(err, ErrDatabaseUnreachable) {
			t.Errorf("%s: remove: %v", e.env.edgeID, err)
		}
		if _, err := e.svc.Restore("gpu-2"); !errors.Is(err, ErrDatabaseUnreachable) {
			t.Errorf("%s: restore: %v", e.env.edgeID, err)
		}
		if _, _, err := e.svc.NewToken("gpu-4", time.Hour); !errors.Is(err, ErrDatabaseUnreachable) {
			t.Errorf("%s: new token: %v", e.env.edgeID, err)
		}
		_, err := e.svc.Renew("gpu-1", csr(t))
		var later interface{ RetryTime() time.Time }
		if !errors.Is(err, ErrDatabaseUnreachable) || !errors.As(err, &later) || !later.RetryTime().After(time.Now()) {
			t.Errorf("%s: renew: %v, want ErrDatabaseUnreachable with a retry time", e.env.edgeID, err)
		}
		if took := time.Since(start); took > 5*opTimeout {
			t.Errorf("%s: the refused writes took %v", e.env.edgeID, took)
		}
		t.Logf("%s: refused writes with the database stopped took %v", e.env.edgeID, time.Since(start))
	}

	srv.Start(t)
	// Back: the token that was refused joins now (on the first try that
	// finds the database; the pools reconnect on their own).
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp := b.join(t, pending)
		if resp.GetRefusal() == wirepb.JoinRefusal_JOIN_REFUSAL_UNSPECIFIED {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("30s after the database is back, the join is refused: %v %s", resp.GetRefusal(), resp.GetRefusalDetail())
		}
		time.Sleep(50 * time.Millisecond)
	}
	// And removals are told again.
	start := time.Now()
	if _, _, err := a.svc.Remove("gpu-1"); err != nil {
		t.Fatal(err)
	}
	t.Logf("after the restart, edge-2 told of a removal in %v", b.waitRemoved(t, "gpu-1", start))
	if err := b.svc.Check("gpu-1", kept); !errors.Is(err, ErrNodeRemoved) {
		t.Errorf("after the restart, a removed Node: %v", err)
	}
}
