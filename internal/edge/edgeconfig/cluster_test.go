package edgeconfig

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// Issue 22: the cluster section and shutdown_grace.
func TestClusterSection(t *testing.T) {
	c := mustParse(t, loopbackFile)
	if c.Cluster.Enabled() || c.Grace() != DefaultShutdownGrace || c.Advertised() != "127.0.0.1:7443" {
		t.Fatalf("defaults: cluster %+v, grace %v, advertised %q", c.Cluster, c.Grace(), c.Advertised())
	}
	c = mustParse(t, loopbackFile+`cluster:
  database_url: postgres://iop@db.internal:5432/iop?sslmode=verify-full
  advertise_quic: edge-a.internal:7443
shutdown_grace: 30m
`)
	if !c.Cluster.Enabled() || c.Advertised() != "edge-a.internal:7443" || c.Grace() != 30*time.Minute {
		t.Fatalf("cluster %+v, grace %v", c.Cluster, c.Grace())
	}
	if dsn, err := c.Cluster.DSN(); err != nil || !strings.HasPrefix(dsn, "postgres://iop@db.internal") {
		t.Fatalf("DSN %q, %v", dsn, err)
	}
	if c := mustParse(t, loopbackFile+"shutdown_grace: 0s\n"); c.Grace() != 0 {
		t.Errorf("shutdown_grace 0s: grace %v, want 0 (stop at once)", c.Grace())
	}
}

func TestClusterSectionErrors(t *testing.T) {
	for _, tc := range []struct {
		name, yaml, path string
	}{
		{"both", "cluster:\n  database_url: postgres://h/db\n  database_url_file: /run/secrets/db\n", "cluster.database_url_file"},
		{"not a url", "cluster:\n  database_url: mysql\n", "cluster.database_url"},
		{"bad url", "cluster:\n  database_url: postgres://iop:hunter2@[::1/db\n", "cluster.database_url"},
		{"no host", "cluster:\n  database_url: postgres:///iop\n", "cluster.database_url"},
		{"bad advertise", "cluster:\n  database_url: postgres://h/db\n  advertise_quic: nowhere\n", "cluster.advertise_quic"},
		{"negative grace", "shutdown_grace: -1s\n", "shutdown_grace"},
		{"long grace", "shutdown_grace: 48h\n", "shutdown_grace"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(loopbackFile + tc.yaml))
			if !slices.Contains(paths(err), tc.path) {
				t.Fatalf("got %v, want a problem with %s", err, tc.path)
			}
			if strings.Contains(err.Error(), "hunter2") {
				t.Errorf("the error repeats the password: %v", err)
			}
		})
	}
	// Every address: advertise_quic is required.
	c := mtlsConfig()
	c.Cluster.DatabaseURL = "postgres://h/db"
	if err := c.Validate(); !slices.Contains(paths(err), "cluster.advertise_quic") {
		t.Errorf("cluster on 0.0.0.0 without advertise_quic: %v", err)
	}
}

func TestClusterDatabaseURLFile(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "db"), []byte("postgres://iop:secret@h/db\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "edge.yaml")
	if err := os.WriteFile(cfg, []byte(loopbackFile+"cluster:\n  database_url_file: db\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Load(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if dsn, err := c.Cluster.DSN(); err != nil || dsn != "postgres://iop:secret@h/db" {
		t.Fatalf("DSN %q, %v", dsn, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "db"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Cluster.DSN(); err == nil {
		t.Error("an empty database_url_file accepted")
	}
}
