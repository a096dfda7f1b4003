package migrations

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerkeeper/ledgerkeeper/internal/engine"
)

// On a Citus coordinator the numbered migrations create plain tables, as on
// PostgreSQL; then the layout step (Distribute) gives each table the shape
// its use needs, once, and records what it did in LayoutTable. The choices
// and their reasons are ARCHITECTURE.md's "Running on Citus".

// LayoutTable records the layout step's work on Citus: one row per table it
// distributed or changed.
const LayoutTable = "ledgerkeeper_citus_layout"

// Shapes of a table on Citus.
const (
	// ShapeDistributed: sharded by its key column, co-located with
	// idempotency_keys (a key's rows in every such table on one shard).
	ShapeDistributed = "distributed"
	// ShapeLocal: a plain table on the coordinator, which every
	// ledgerkeeper connection goes through.
	ShapeLocal = "coordinator"
)

// Placement is one table's shape on Citus.
type Placement struct {
	Table string `json:"table"`
	Shape string `json:"shape"`
	// Column is the distribution column of a distributed table.
	Column string `json:"column,omitempty"`
	// ColocateWith names the table a distributed table is co-located with.
	ColocateWith string `json:"colocate_with,omitempty"`
	// Before are statements run, on Citus only, before the table is
	// distributed: what Citus refuses on a distributed table, replaced.
	Before []string `json:"-"`
	// Why is the reason for the shape, for `migrate` and ARCHITECTURE.md.
	Why string `json:"why"`
}

// Layout is every table's shape on Citus. A table the migrations create
// and Layout does not name stays on the coordinator; a test fails until
// it is named here, so each new table's shape is a decision.
var Layout = []Placement{
	{Table: "idempotency_keys", Shape: ShapeDistributed, Column: "key",
		Why: "the ledger: every tool-side statement names one key, so claims and completions stay on one shard"},
	{Table: "reconcile_state", Shape: ShapeDistributed, Column: "key", ColocateWith: "idempotency_keys",
		Why: "per-key lease and bookkeeping: a decision's compare-and-set and its state commit on the key's shard"},
	{Table: "key_holds", Shape: ShapeDistributed, Column: "key", ColocateWith: "idempotency_keys",
		Why: "per-key hold: the lease's and the purge's hold checks join it on the key, shard by shard"},
	{Table: "reconcile_audit", Shape: ShapeDistributed, Column: "key", ColocateWith: "idempotency_keys",
		// Citus refuses a primary key without the distribution column:
		// (key, id) is as unique as id (id alone still comes from one
		// sequence), and no statement looks a row up by id alone.
		Before: []string{`ALTER TABLE reconcile_audit DROP CONSTRAINT IF EXISTS reconcile_audit_pkey,
			ADD CONSTRAINT reconcile_audit_pkey PRIMARY KEY (key, id)`},
		Why: "every decision's audit row: commits with the decision on the key's shard; primary key (key, id) instead of (id)"},
	{Table: "tool_breakers", Shape: ShapeLocal, Why: "one row per tool, read and locked (FOR UPDATE) by every pass"},
	{Table: "probe_self_checks", Shape: ShapeLocal, Why: "one row per tool"},
	{Table: "probe_canaries", Shape: ShapeLocal, Why: "a handful of operator-marked rows per tool, looked up by tool"},
	{Table: "alert_outbox", Shape: ShapeLocal, Why: "key is null for tool-wide alerts (no distribution column); the dispatcher claims rows FOR UPDATE SKIP LOCKED"},
	{Table: "alert_state", Shape: ShapeLocal, Why: "one row per open alert subject, upserted with the decision that raises it"},
	{Table: "ledgerkeeper_runs", Shape: ShapeLocal, Why: "one row per pass"},
	{Table: "slack_seen", Shape: ShapeLocal, Why: "short-lived Slack delivery ids, not keys"},
	{Table: "stuck_samples", Shape: ShapeLocal, Why: "about 288 rows per tool, written by one replica's observe job"},
	{Table: VersionTable, Shape: ShapeLocal, Why: "goose's bookkeeping"},
	{Table: LayoutTable, Shape: ShapeLocal, Why: "this layout's record"},
}

// IsCitus reports whether the database has the citus extension: whether
// pool is connected to a Citus coordinator (or worker).
func IsCitus(ctx context.Context, pool *pgxpool.Pool) (bool, error) {
	return engine.Detect(ctx, pool)
}

// Distribute gives every table its Layout shape on a Citus coordinator and
// returns the placements it applied: none when the layout is already in
// place (a second run is a no-op). It holds the migration lock while it
// works, so replicas migrating at once do not distribute a table twice.
func Distribute(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger) ([]Placement, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("citus layout: %w", err)
	}
	defer conn.Release()
	var coordinator bool
	if err := conn.QueryRow(ctx, `SELECT citus_is_coordinator()`).Scan(&coordinator); err != nil {
		return nil, fmt.Errorf("citus layout: %w", err)
	}
	if !coordinator {
		return nil, errors.New("citus layout: this database is a Citus worker's, not the coordinator's: run migrate against the coordinator")
	}
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1)`, lockID); err != nil {
		return nil, fmt.Errorf("citus layout: take the migration lock: %w", err)
	}
	defer func() { _, _ = conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1)`, lockID) }()

	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+LayoutTable+` (
		table_name     text        PRIMARY KEY,
		shape          text        NOT NULL,
		dist_column    text        NULL,
		colocate_with  text        NULL,
		applied_at     timestamptz NOT NULL DEFAULT now())`); err != nil {
		return nil, fmt.Errorf("citus layout: create %s: %w", LayoutTable, err)
	}
	var applied []Placement
	for _, p := range Layout {
		if p.Shape != ShapeDistributed {
			continue
		}
		did, err := distribute(ctx, conn.Conn(), p)
		if err != nil {
			return applied, fmt.Errorf("citus layout: %s: %w", p.Table, err)
		}
		if did {
			if logger != nil {
				logger.Info("citus layout", "table", p.Table, "shape", p.Shape, "column", p.Column, "colocate_with", p.ColocateWith)
			}
			applied = append(applied, p)
		}
	}
	if err := checkForeignKeys(ctx, conn.Conn()); err != nil {
		return applied, err
	}
	return applied, nil
}

// distribute makes one table distributed, in one transaction with its
// record; it reports false when the table is already distributed (or does
// not exist yet: a layout newer than the schema).
func distribute(ctx context.Context, conn *pgx.Conn, p Placement) (bool, error) {
	var exists, done bool
	if err := conn.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL,
		EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = to_regclass($1))`, p.Table).Scan(&exists, &done); err != nil {
		return false, err
	}
	if !exists || done {
		return false, nil
	}
	if p.ColocateWith != "" {
		// Co-location needs the same distribution column type; say which
		// column differs rather than pass Citus's error on.
		var got, want string
		err := conn.QueryRow(ctx, `SELECT
			(SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = to_regclass($1) AND attname = $2),
			(SELECT format_type(a.atttypid, a.atttypmod) FROM pg_attribute a JOIN pg_dist_partition d ON d.logicalrelid = a.attrelid
			  WHERE a.attrelid = to_regclass($3) AND a.attnum = (SELECT attnum FROM pg_attribute WHERE attrelid = to_regclass($3)
			    AND attname = column_to_column_name(d.logicalrelid, d.partkey)))`,
			p.Table, p.Column, p.ColocateWith).Scan(&got, &want)
		if err != nil {
			return false, fmt.Errorf("compare distribution column types: %w", err)
		}
		if got != want {
			return false, fmt.Errorf("column %s is %s, but %s's distribution column is %s: co-location needs the same type", p.Column, got, p.ColocateWith, want)
		}
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		return false, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	for _, s := range p.Before {
		if _, err := tx.Exec(ctx, s); err != nil {
			return false, fmt.Errorf("%s: %w", s, err)
		}
	}
	colocate := "default"
	if p.ColocateWith != "" {
		colocate = p.ColocateWith
	}
	if _, err := tx.Exec(ctx, `SELECT create_distributed_table($1::regclass, $2, colocate_with => $3)`, p.Table, p.Column, colocate); err != nil {
		return false, fmt.Errorf("create_distributed_table: %w", err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO `+LayoutTable+` (table_name, shape, dist_column, colocate_with)
		VALUES ($1, $2, $3, nullif($4, '')) ON CONFLICT (table_name) DO NOTHING`, p.Table, p.Shape, p.Column, p.ColocateWith); err != nil {
		return false, err
	}
	return true, tx.Commit(ctx)
}

// checkForeignKeys refuses a foreign key between a coordinator table and a
// distributed one: Citus accepts one from a coordinator table to a
// distributed table and then fails every insert into it, and refuses a
// coordinator table that references both a reference and a distributed
// table. None exists today; this keeps a future migration from adding one.
func checkForeignKeys(ctx context.Context, conn *pgx.Conn) error {
	rows, err := conn.Query(ctx, `SELECT c.conname, c.conrelid::regclass::text, c.confrelid::regclass::text
		FROM pg_constraint c
		WHERE c.contype = 'f'
		  AND (EXISTS (SELECT 1 FROM pg_dist_partition d WHERE d.logicalrelid = c.conrelid AND d.partmethod = 'h')
		       <> EXISTS (SELECT 1 FROM pg_dist_partition d WHERE d.logicalrelid = c.confrelid AND d.partmethod = 'h'))`)
	if err != nil {
		return fmt.Errorf("citus layout: list foreign keys: %w", err)
	}
	type fk struct{ name, from, to string }
	bad, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (fk, error) {
		var f fk
		return f, r.Scan(&f.name, &f.from, &f.to)
	})
	if err != nil {
		return fmt.Errorf("citus layout: list foreign keys: %w", err)
	}
	if len(bad) > 0 {
		return fmt.Errorf("citus layout: foreign key %s from %s to %s crosses a distributed and a coordinator table: drop it or give both tables one shape (migrations/citus.go)", bad[0].name, bad[0].from, bad[0].to)
	}
	return nil
}

// Placed is a table's shape as Citus's metadata reports it.
type Placed struct {
	Table  string `json:"table"`
	Shape  string `json:"shape"`
	Column string `json:"column,omitempty"`
	Shards int    `json:"shards,omitempty"`
	// Colocation is Citus's co-location group id (same id, same shards).
	Colocation int `json:"colocation_id,omitempty"`
}

// Placements reports the shape of every table of the public schema as
// Citus's metadata has it (for `migrate status` on Citus).
func Placements(ctx context.Context, pool *pgxpool.Pool) ([]Placed, error) {
	rows, err := pool.Query(ctx, `SELECT c.relname::text,
		CASE d.partmethod WHEN 'h' THEN 'distributed' WHEN 'n' THEN CASE WHEN d.repmodel = 't' THEN 'reference' ELSE 'citus-local' END ELSE 'coordinator' END,
		coalesce(column_to_column_name(d.logicalrelid, d.partkey), ''),
		(SELECT count(*) FROM pg_dist_shard s WHERE s.logicalrelid = c.oid)::int,
		coalesce(d.colocationid, 0)
		FROM pg_class c
		LEFT JOIN pg_dist_partition d ON d.logicalrelid = c.oid
		WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p')
		ORDER BY 1`)
	if err != nil {
		return nil, fmt.Errorf("citus placements: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Placed, error) {
		var p Placed
		return p, r.Scan(&p.Table, &p.Shape, &p.Column, &p.Shards, &p.Colocation)
	})
	if err != nil {
		return nil, fmt.Errorf("citus placements: %w", err)
	}
	return out, nil
}
