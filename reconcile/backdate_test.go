package reconcile_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
)

// backdateFirstNotFound moves the first not_found of keys (every key with
// reconcile state when none is named) back by d and makes them due now: as
// if d had passed. The
// new time is computed here and bound, because Citus refuses date
// arithmetic on a column in an UPDATE.
func backdateFirstNotFound(t *testing.T, db *pgtest.DB, d time.Duration, keys ...string) {
	t.Helper()
	ctx := context.Background()
	var only []string
	if len(keys) > 0 {
		only = keys
	}
	rows, err := db.Pool.Query(ctx, `SELECT key, first_not_found_at FROM reconcile_state
		WHERE $1::text[] IS NULL OR key = ANY($1)`, only)
	if err != nil {
		t.Fatal(err)
	}
	type row struct {
		key string
		at  *time.Time
	}
	got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) {
		var x row
		return x, r.Scan(&x.key, &x.at)
	})
	if err != nil || len(got) == 0 {
		t.Fatalf("no reconcile state to move back (%v)", err)
	}
	for _, x := range got {
		var at *time.Time // a key without a first not_found keeps none
		if x.at != nil {
			moved := x.at.Add(-d)
			at = &moved
		}
		db.Exec(t, `UPDATE reconcile_state SET first_not_found_at = $2, next_probe_at = now() - interval '1 second' WHERE key = $1`,
			x.key, at)
	}
}
