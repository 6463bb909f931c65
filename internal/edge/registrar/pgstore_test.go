package registrar

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/iop-dev/iop/internal/edge/clusterdb"
	"github.com/iop-dev/iop/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// fixturePG, when set, makes newFixture's Service run over a PGStore in
// its database (TestServiceBehavioursOnPostgreSQL).
var fixturePG *pgEnv

// pgEnv is one Edge's view of a cluster database: its pool and its
// PGStore, opened again by a fixture's restart.
type pgEnv struct {
	edgeID string
	pool   *pgxpool.Pool
	cur    *PGStore
}

// newPGEnv opens dsn as edgeID; the pool closes when the test ends.
func newPGEnv(t testing.TB, dsn, edgeID string) *pgEnv {
	t.Helper()
	pool, err := clusterdb.Open(context.Background(), dsn, edgeID, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return &pgEnv{edgeID: edgeID, pool: pool}
}

// open returns the Edge's PGStore, opening it if closed: fixtures made one
// after the other in a test share it, as Services on one Edge would.
func (e *pgEnv) open(t testing.TB) *PGStore {
	t.Helper()
	if e.cur != nil {
		return e.cur
	}
	st, err := OpenPG(context.Background(), e.pool, PGOptions{EdgeID: e.edgeID})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	e.cur = st
	return st
}

// close closes the PGStore, as an Edge's stop does.
func (e *pgEnv) close() {
	if e.cur != nil {
		e.cur.Close()
		e.cur = nil
	}
}

// The Service's behaviour does not depend on its backend: the tests
// written for the bbolt store pass on PostgreSQL.
func TestServiceBehavioursOnPostgreSQL(t *testing.T) {
	for _, tc := range []struct {
		name string
		run  func(*testing.T)
	}{
		{"TokenJoinsOnce", TestATokenJoinsOnceAndIssuesTheNodesIdentity},
		{"RefusedJoinsKeepTheToken", TestRefusedJoinsIssueNothingAndKeepTheToken},
		{"ExpiredToken", TestAnExpiredTokenIsRefused},
		{"NoCAKey", TestAnEdgeWithoutTheCAKeyRefusesJoinsSayingWhy},
		{"SurvivesARestart", TestTokensAndRevocationsSurviveARestart},
		{"Renew", TestRenewIssuesTheConnectionsIdentity},
		{"RemoveHandMadeConnected", TestRemovingAConnectedHandMadeNodeFencesAndRefusesIt},
		{"NoTokenWhileRemoved", TestARemovedNodeGetsNoTokenUntilItsRemovalIsLifted},
		{"RemovedWhateverSerial", TestACertificateOfARemovedNodeIsRefusedWhateverItsSerial},
		{"RenewalRacingRemoval", TestARenewalRacingARemovalLeavesNoUnrevokedCertificate},
		{"RenewalsRateLimited", TestRenewalsAreRateLimitedPerNode},
		{"Prune", TestPruneDropsExpiredAndSupersededRecords},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fixturePG = newPGEnv(t, pgtest.Start(t), "edge-1")
			t.Cleanup(func() { fixturePG = nil })
			tc.run(t)
		})
	}
}
