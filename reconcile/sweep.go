package reconcile

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerkeeper/ledgerkeeper/alerts"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/store"
)

// sweepLimit bounds the open alerts examined per pass; sweepPage is how
// many one batch examines.
const (
	sweepLimit = 1000
	sweepPage  = 200
)

// sweepSettled resolves open per-key alerts whose key is no longer
// processing. The reconciler resolves the keys it decides itself in the
// decision's transaction; this catches the rest (the original attempt
// completed, an operator resolved it, a retry re-claimed it, purge).
//
// It examines at most sweepLimit open alerts per pass, resuming where the
// previous pass stopped (wrapping around), so alerts that stay open never
// hide the ones after them. Each page of sweepPage alerts is one batch: one
// transaction of three statements whatever the page holds (list the page,
// read its keys' statuses, resolve the settled keys and enqueue their
// notices).
func (e *Engine) sweepSettled(ctx context.Context, pool store.Pool) (int, error) {
	e.sweepMu.Lock()
	defer e.sweepMu.Unlock()
	resolved, examined := 0, 0
	for examined < sweepLimit {
		var page []alerts.OpenAlert
		var n int
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			var err error
			page, err = alerts.OpenKeyAlertsAfter(ctx, tx, e.sweepCursor, sweepPage)
			if err != nil || len(page) == 0 {
				return err
			}
			settled, err := settledKeys(ctx, tx, page)
			if err != nil || len(settled) == 0 {
				return err
			}
			n, err = alerts.ResolveKeys(ctx, tx, settled)
			return err
		})
		if err != nil {
			return resolved, fmt.Errorf("resolve alerts of settled keys: %w", err)
		}
		resolved += n
		examined += len(page)
		if len(page) < sweepPage {
			e.sweepCursor = alerts.OpenAlert{} // end reached: next pass starts over
			break
		}
		e.sweepCursor = page[len(page)-1]
	}
	return resolved, nil
}

// settledKeys returns, for the distinct keys of page that are no longer
// processing, how they settled (the resolved notice's text), in page order
// and with the tool of each key's first alert.
func settledKeys(ctx context.Context, tx pgx.Tx, page []alerts.OpenAlert) ([]alerts.KeyResolution, error) {
	keys := make([]string, 0, len(page))
	first := map[string]alerts.OpenAlert{}
	for _, a := range page {
		if _, ok := first[a.Key]; !ok {
			first[a.Key] = a
			keys = append(keys, a.Key)
		}
	}
	statuses, err := store.Statuses(ctx, tx, keys)
	if err != nil {
		return nil, err
	}
	var out []alerts.KeyResolution
	for _, key := range keys {
		var how string
		switch status, ok := statuses[key]; {
		case !ok:
			how = "the key is no longer in the ledger"
		case status == ledger.StatusCompleted:
			how = "completed (by the original attempt or an operator)"
		case status == ledger.StatusFailedRetryable:
			how = "marked failed_retryable"
		default:
			continue
		}
		out = append(out, alerts.KeyResolution{Tool: first[key].Tool, Key: key, How: how})
	}
	return out, nil
}
