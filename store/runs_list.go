package store

import (
	"context"
	"math"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerkeeper/ledgerkeeper/ledger"
)

// Reads for the web console's runs and alerts pages, keyset-paged so that
// they cost the same on a big ledger as on a small one.

// ListedRun is a pass of ledgerkeeper_runs with its id (the page's cursor).
type ListedRun struct {
	ID int64 `json:"id"`
	Run
}

// ListRuns lists up to limit passes of the given kinds (reconcile, purge,
// alerts) with an id below before (0: from the newest), newest first.
func ListRuns(ctx context.Context, db ledger.DBTX, kinds []string, before int64, limit int) ([]ListedRun, error) {
	if before <= 0 {
		before = math.MaxInt64
	}
	rows, err := db.Query(ctx, `SELECT id, kind, actor, started_at, finished_at, stats, coalesce(error, '')
		FROM ledgerkeeper_runs WHERE kind = ANY($1) AND id < $2 ORDER BY id DESC LIMIT $3`, kinds, before, limit)
	if err != nil {
		return nil, wrap("list runs", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (ListedRun, error) {
		var r ListedRun
		err := row.Scan(&r.ID, &r.Kind, &r.Actor, &r.StartedAt, &r.FinishedAt, &r.Stats, &r.Error)
		return r, err
	})
	return out, wrap("list runs", err)
}

// AuditAct is one audit row of an operator's act on a key.
type AuditAct struct {
	Key    string    `json:"key"`
	Actor  string    `json:"actor"`
	Action string    `json:"action"`
	At     time.Time `json:"at"`
}

// ActsSince lists the audit rows of keys[i] written since since[i] by an
// actor whose name starts with actorPrefix (e.g. "slack:"), by key then
// oldest first, at most limit in all: one statement on the audit trail's
// (key, id) index for a page of keys.
func ActsSince(ctx context.Context, db ledger.DBTX, actorPrefix string, keys []string, since []time.Time, limit int) ([]AuditAct, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	rows, err := db.Query(ctx, `SELECT a.key, a.actor, a.action, a.created_at
		FROM unnest($1::text[], $2::timestamptz[]) f(key, since)
		JOIN reconcile_audit a ON a.key = f.key AND a.created_at >= f.since
		WHERE starts_with(a.actor, $3)
		ORDER BY a.key, a.id LIMIT $4`, keys, since, actorPrefix, limit)
	if err != nil {
		return nil, wrap("list acts on keys", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[AuditAct])
	return out, wrap("list acts on keys", err)
}
