// Package storecli adds `edged store migrate`: the one command that moves a
// single Edge's enrollment (the bbolt store in its data_dir: join tokens,
// issued certificates, Nodes and their removals) into the cluster's
// PostgreSQL, so that the Edge, and others beside it, can run as a cluster
// (issue 22).
//
// The store is read while no Edge runs on it: a running Edge holds its
// lock, and the command says so rather than copy a store that is still
// changing. The copy is one transaction and idempotent: run it again and it
// copies nothing, saying what the database had already.
package storecli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/alecthomas/kingpin/v2"

	"github.com/iop-dev/iop/internal/edge/clusterdb"
	"github.com/iop-dev/iop/internal/edge/edgeconfig"
	"github.com/iop-dev/iop/internal/edge/registrar"
)

// lockWait is how long migrate waits for the store's lock before it
// decides an Edge holds it.
const lockWait = 2 * time.Second

// actor is the audit log's actor of a migration.
const actor = "edged store migrate"

type cli struct {
	out         io.Writer
	configPath  string
	dataDir     string
	databaseURL string
}

// ErrEdgeRunning is migrate's error when an Edge holds the store.
var ErrEdgeRunning = errors.New("an Edge is running on this data_dir (it holds the enrollment store's lock)")

// Register adds `store migrate` to app; its report goes to out. The
// returned Run runs the command app.Parse chose if it is this one, and
// otherwise hands it to next (the Run of another package's commands), so
// that edged's main needs one line for it.
func Register(app *kingpin.Application, out io.Writer, next func(cmd string) (bool, error)) (Run func(cmd string) (ok bool, err error)) {
	c := &cli{out: out}
	store := app.Command("store", "The Edge's enrollment store.")
	migrate := store.Command("migrate", "Copy a single Edge's enrollment store (data_dir/"+registrar.StoreFile+": tokens, certificates, Nodes, removals) into the cluster's PostgreSQL. Stop the Edge first; running it again copies nothing twice.")
	migrate.Flag("config", "Edge configuration file (YAML): its data_dir and cluster.database_url (or database_url_file).").Short('c').StringVar(&c.configPath)
	migrate.Flag("data-dir", "The Edge's data_dir (instead of, or over, the configuration's).").StringVar(&c.dataDir)
	migrate.Flag("database-url", "The cluster's PostgreSQL (postgres://...; instead of, or over, the configuration's).").Envar("IOP_DATABASE_URL").StringVar(&c.databaseURL)
	return func(cmd string) (bool, error) {
		if cmd == migrate.FullCommand() {
			return true, c.migrate(context.Background())
		}
		if next == nil {
			return false, nil
		}
		return next(cmd)
	}
}

// source resolves the data_dir, the database URL and the Edge's id from the
// flags and the configuration file.
func (c *cli) source() (dir, dsn, edgeID string, err error) {
	dir, dsn, edgeID = c.dataDir, c.databaseURL, "migrate"
	if c.configPath != "" {
		cfg, err := edgeconfig.Load(c.configPath)
		if err != nil {
			return "", "", "", err
		}
		edgeID = cfg.EdgeID
		if dir == "" {
			dir = cfg.DataDir
		}
		if dsn == "" && cfg.Cluster.Enabled() {
			if dsn, err = cfg.Cluster.DSN(); err != nil {
				return "", "", "", err
			}
		}
	}
	switch {
	case dir == "":
		return "", "", "", errors.New("no data_dir: give --data-dir, or --config with a data_dir")
	case dsn == "":
		return "", "", "", errors.New("no database: give --database-url, or --config with a cluster section (database_url or database_url_file)")
	}
	return dir, dsn, edgeID, nil
}

func (c *cli) migrate(ctx context.Context) error {
	dir, dsn, edgeID, err := c.source()
	if err != nil {
		return err
	}
	path := filepath.Join(dir, registrar.StoreFile)
	// OpenStore makes a store where there is none: a migration of nothing
	// is a mistake (a wrong data_dir), not an empty copy.
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("no enrollment store in %s (%s is not there): is it the Edge's data_dir?", dir, registrar.StoreFile)
	}
	st, err := registrar.OpenStore(dir, lockWait, time.Now())
	if errors.Is(err, registrar.ErrStoreLocked) {
		return fmt.Errorf("%w: %s. Stop it first, so that nothing changes the store while it is copied; then migrate, add the cluster section to its configuration, and start it again", ErrEdgeRunning, path)
	}
	if err != nil {
		return err
	}
	defer st.Close()
	contents, err := st.Contents(ctx)
	if err != nil {
		return err
	}
	pool, err := clusterdb.Open(ctx, dsn, edgeID, nil)
	if err != nil {
		return err
	}
	defer pool.Close()
	res, err := registrar.Import(ctx, pool, contents, edgeID, actor)
	if err != nil {
		return err
	}
	fmt.Fprintf(c.out, "copied %s to the cluster database: %s\n", path, counts(res.Copied))
	if res.Present != (registrar.ImportCounts{}) {
		fmt.Fprintf(c.out, "already in the database, left as they are: %s\n", counts(res.Present))
	}
	if res.Copied == (registrar.ImportCounts{}) {
		fmt.Fprintln(c.out, "nothing new to copy: the database has this store already")
	}
	fmt.Fprintln(c.out, "next: set the cluster section (database_url or database_url_file) in each Edge's configuration and start them; the file stays as it was, unused by a cluster Edge")
	return nil
}

func counts(n registrar.ImportCounts) string {
	return fmt.Sprintf("%d nodes, %d certificates, %d tokens", n.Nodes, n.Certs, n.Tokens)
}
