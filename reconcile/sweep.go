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
//
// It examines at most sweepLimit open alerts per pass, resuming where the
// previous pass stopped (wrapping around), so alerts that stay open never
// hide the ones after them.
func (e *Engine) sweepSettled(ctx context.Context, pool *pgxpool.Pool) (int, error) {
	e.sweepMu.Lock()
	defer e.sweepMu.Unlock()
	var open []alerts.OpenAlert
	after := e.sweepCursor
	for len(open) < sweepLimit {
		page, err := alerts.OpenKeyAlertsAfter(ctx, pool, after, 200)
		if err != nil {
			return 0, err
		}
		open = append(open, page...)
		if len(page) < 200 {
			after = alerts.OpenAlert{} // end reached: next pass starts over
			break
		}
		after = page[len(page)-1]
	}
	e.sweepCursor = after
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
