package clusterdb

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// migrateLock is the pg_advisory_xact_lock key every Edge takes to migrate: one migration at a
// time across the cluster, whatever the component ("iop_sch" in ASCII).
const migrateLock int64 = 0x696f705f736368

// schemaTable records, per component, how many of its steps the database holds.
const schemaTable = `CREATE TABLE IF NOT EXISTS iop_schema (
	component  text PRIMARY KEY,
	version    integer NOT NULL,
	applied_at timestamptz NOT NULL DEFAULT now()
)`

// Migrate brings component's tables in pool's database up to date with steps: steps[i] is
// version i+1, applied once, in order, never edited once released (a change is a new step). A
// step may hold several statements. Everything runs in one transaction under an advisory
// lock, so Edges starting at the same moment wait for each other instead of racing: the first
// applies the steps, the others find them applied. A failing step changes nothing.
//
// A database that holds more steps than given (a newer Edge migrated it) is accepted: steps
// only add, so an older Edge of a rolling upgrade keeps working.
func Migrate(ctx context.Context, pool *pgxpool.Pool, component string, steps []string) error {
	if component == "" {
		return errors.New("clusterdb: migrate: no component")
	}
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", migrateLock); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, schemaTable); err != nil {
			return err
		}
		var version int
		err := tx.QueryRow(ctx, "SELECT version FROM iop_schema WHERE component = $1", component).Scan(&version)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		for i := version; i < len(steps); i++ {
			if _, err := tx.Exec(ctx, steps[i]); err != nil {
				return fmt.Errorf("step %d: %w", i+1, err)
			}
		}
		if version >= len(steps) {
			return nil
		}
		_, err = tx.Exec(ctx, `INSERT INTO iop_schema (component, version) VALUES ($1, $2)
			ON CONFLICT (component) DO UPDATE SET version = excluded.version, applied_at = now()`,
			component, len(steps))
		return err
	})
	if err != nil {
		return fmt.Errorf("clusterdb: migrate %s: %w", component, err)
	}
	return nil
}

// Version returns how many of component's steps the database holds (0: none).
func Version(ctx context.Context, pool *pgxpool.Pool, component string) (int, error) {
	var version int
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var exists bool
		if err := tx.QueryRow(ctx, "SELECT to_regclass('iop_schema') IS NOT NULL").Scan(&exists); err != nil || !exists {
			return err
		}
		err := tx.QueryRow(ctx, "SELECT version FROM iop_schema WHERE component = $1", component).Scan(&version)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("clusterdb: schema version of %s: %w", component, err)
	}
	return version, nil
}
