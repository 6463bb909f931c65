package storecli

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/alecthomas/kingpin/v2"

	"github.com/iop-dev/iop/internal/edge/clusterdb"
	"github.com/iop-dev/iop/internal/edge/registrar"
	"github.com/iop-dev/iop/internal/pgtest"
	"github.com/iop-dev/iop/quicwire/pki"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// run runs edged's command line with args, as main does.
func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	app := kingpin.New("edged", "")
	var out bytes.Buffer
	cmd := Register(app, &out, nil)
	chosen, err := app.Parse(args)
	if err != nil {
		t.Fatal(err)
	}
	ok, err := cmd(chosen)
	if !ok {
		t.Fatalf("%v: not this package's command", args)
	}
	return out.String(), err
}

func newCSR(t *testing.T) []byte {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	if err != nil {
		t.Fatal(err)
	}
	return der
}

// singleEdge makes a single Edge's store in dir: gpu-1 enrolled, gpu-2
// removed, a pending token for gpu-3. It returns gpu-2's certificate.
func singleEdge(t *testing.T, dir string) *x509.Certificate {
	t.Helper()
	ca, err := pki.NewCA("iop.test", pki.Options{})
	if err != nil {
		t.Fatal(err)
	}
	st, err := registrar.OpenStore(dir, time.Second, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	svc := registrar.New(st, registrar.Options{EdgeID: "edge-1", TrustDomain: "iop.test", CACert: ca.Cert, CA: ca, Lifetime: time.Hour})
	if _, err := svc.Renew("gpu-1", newCSR(t)); err != nil {
		t.Fatal(err)
	}
	chain, err := svc.Renew("gpu-2", newCSR(t))
	if err != nil {
		t.Fatal(err)
	}
	removed, _ := x509.ParseCertificate(chain[0])
	if _, _, err := svc.Remove("gpu-2"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := svc.NewToken("gpu-3", time.Hour); err != nil {
		t.Fatal(err)
	}
	return removed
}

// Issue 22: one command moves a single Edge's enrollment into the cluster
// database; the cluster then refuses what the Edge refused. Run again, it
// copies nothing twice.
func TestMigrateCopiesTheStoreOnce(t *testing.T) {
	dir := t.TempDir()
	removed := singleEdge(t, dir)
	dsn := pgtest.Start(t)

	out, err := run(t, "store", "migrate", "--data-dir", dir, "--database-url", dsn)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "2 nodes, 2 certificates, 1 tokens") {
		t.Errorf("output:\n%s\nwant the counts copied", out)
	}

	pool, err := clusterdb.Open(context.Background(), dsn, "edge-1", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	pg, err := registrar.OpenPG(context.Background(), pool, registrar.PGOptions{EdgeID: "edge-1"})
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Close()
	svc := registrar.New(pg, registrar.Options{EdgeID: "edge-1", TrustDomain: "iop.test"})
	if err := svc.Check("gpu-2", removed); !errors.Is(err, registrar.ErrNodeRemoved) {
		t.Errorf("the removed Node on the cluster: %v", err)
	}
	list, err := svc.List()
	if err != nil || len(list) != 3 || len(list[2].Tokens) != 1 {
		t.Errorf("the cluster's list: %+v %v", list, err)
	}
	log, err := svc.AuditLog(context.Background(), 0, 10)
	if err != nil || len(log) != 1 || log[0].Action != registrar.ActionStoreImported || log[0].Actor != actor {
		t.Errorf("audit log: %+v %v, want the import", log, err)
	}

	out, err = run(t, "store", "migrate", "--data-dir", dir, "--database-url", dsn)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "copied "+filepath.Join(dir, registrar.StoreFile)+" to the cluster database: 0 nodes, 0 certificates, 0 tokens") ||
		!strings.Contains(out, "left as they are: 2 nodes, 2 certificates, 1 tokens") || !strings.Contains(out, "nothing new to copy") {
		t.Errorf("second run:\n%s", out)
	}
}

// The configuration file gives the data_dir and the database.
func TestMigrateReadsTheEdgeConfiguration(t *testing.T) {
	dir := t.TempDir()
	singleEdge(t, dir)
	dsn := pgtest.Start(t)
	cfg := filepath.Join(t.TempDir(), "edge.yaml")
	yaml := "edge_id: edge-7\nlisten:\n  http: 127.0.0.1:8080\n  quic: 127.0.0.1:7443\nidentity:\n  mode: loopback\n" +
		"data_dir: " + dir + "\ncluster:\n  database_url: " + dsn + "\n"
	if err := os.WriteFile(cfg, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := run(t, "store", "migrate", "--config", cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "2 nodes, 2 certificates, 1 tokens") {
		t.Errorf("output:\n%s", out)
	}
}

// A running Edge holds the store: migrate says so and copies nothing.
func TestMigrateRefusesWhileTheEdgeRuns(t *testing.T) {
	dir := t.TempDir()
	singleEdge(t, dir)
	st, err := registrar.OpenStore(dir, time.Second, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	dsn := pgtest.Start(t)
	_, err = run(t, "store", "migrate", "--data-dir", dir, "--database-url", dsn)
	if !errors.Is(err, ErrEdgeRunning) || !strings.Contains(err.Error(), "Stop it first") {
		t.Fatalf("with the Edge running: %v", err)
	}
}

func TestMigrateRefusesADataDirWithoutAStore(t *testing.T) {
	dir := t.TempDir()
	_, err := run(t, "store", "migrate", "--data-dir", dir, "--database-url", "postgres://u@127.0.0.1:1/x")
	if err == nil || !strings.Contains(err.Error(), "no enrollment store") {
		t.Fatalf("err = %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, registrar.StoreFile)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("migrate made a store in %s", dir)
	}
	if _, err := run(t, "store", "migrate", "--data-dir", dir); err == nil || !strings.Contains(err.Error(), "no database") {
		t.Errorf("without a database: %v", err)
	}
}
