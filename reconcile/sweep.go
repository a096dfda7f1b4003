package reconcile

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerkeeper/ledgerkeeper/alerts"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
)

// sweepLimit bounds the open alerts examined per pass.
const sweepLimit = 1000

// sweepSettled resolves open per-key alerts whose key is no longer
// processing. The reconciler resolves the keys it decides itself in the
// decision's transaction; this catches the rest (the original attempt
// completed, an operator resolved it, a retry re-claimed it, purge).
func sweepSettled(ctx context.Context, pool *pgxpool.Pool) (int, error) {
	rows, err := pool.Query(ctx, `SELECT DISTINCT key, coalesce(tool, '') FROM alert_state
		WHERE resolved_at IS NULL AND key IS NOT NULL LIMIT $1`, sweepLimit)
	if err != nil {
		return 0, fmt.Errorf("list open alerts: %w", err)
	}
	type openAlert struct{ Key, Tool string }
	open, err := pgx.CollectRows(rows, pgx.RowToStructByPos[openAlert])
	if err != nil {
		return 0, fmt.Errorf("list open alerts: %w", err)
	}
	resolved := 0
	done := map[string]bool{}
	for _, a := range open {
		if done[a.Key] {
			continue
		}
		done[a.Key] = true
		k, err := ledger.Get(ctx, pool, a.Key)
		var how string
		switch {
		case errors.Is(err, ledger.ErrNotFound):
			how = "the key is no longer in the ledger"
		case err != nil:
			return resolved, err
		case k.Status == ledger.StatusCompleted:
			how = "completed (by the original attempt or an operator)"
		case k.Status == ledger.StatusFailedRetryable:
			how = "marked failed_retryable"
		default:
			continue
		}
		err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			n, err := alerts.ResolveKey(ctx, tx, a.Tool, a.Key, how)
			resolved += n
			return err
		})
		if err != nil {
			return resolved, fmt.Errorf("resolve alerts of key %q: %w", a.Key, err)
		}
	}
	return resolved, nil
}
