package alerts

import (
	"context"
	"fmt"
	"time"
)

// Retention of the alert tables: purge (package expiry) trims them by
// retention.audit_max_age through these, so every statement on alert_outbox
// and alert_state lives in this package. Each delete is one bounded
// statement that re-checks its condition on the rows it deletes, so a row
// that changed after it was chosen (an alert raised again) stays.

// Table names, as purge reports them.
const (
	// TableOutbox: sent alert_outbox rows older than the max age go.
	// Pending alerts are never deleted (invariant 8).
	TableOutbox = "alert_outbox"
	// TableState: alert_state rows resolved longer ago than the max age go.
	// Open alerts are kept: they drive renotify_after.
	TableState = "alert_state"
)

// PurgeSent deletes up to limit sent alert_outbox rows created more than
// maxAge ago, oldest first, in one statement: its own transaction when db
// is a pool or a bare connection. It returns how many it deleted.
func PurgeSent(ctx context.Context, db DBTX, maxAge time.Duration, limit int) (int64, error) {
	mustBound("PurgeSent", maxAge, limit)
	tag, err := db.Exec(ctx, `DELETE FROM alert_outbox WHERE id IN (
			SELECT id FROM alert_outbox WHERE status = 'sent' AND created_at < now() - $2::interval ORDER BY created_at LIMIT $1)
			AND status = 'sent' AND created_at < now() - $2::interval`, limit, maxAge)
	if err != nil {
		return 0, fmt.Errorf("purge %s: %w", TableOutbox, err)
	}
	return tag.RowsAffected(), nil
}

// CountPurgeableSent counts what PurgeSent would delete, all batches
// together.
func CountPurgeableSent(ctx context.Context, db DBTX, maxAge time.Duration) (int64, error) {
	var n int64
	err := db.QueryRow(ctx, `SELECT count(*) FROM alert_outbox WHERE status = 'sent' AND created_at < now() - $1::interval`, maxAge).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count purgeable %s: %w", TableOutbox, err)
	}
	return n, nil
}

// TrimState deletes up to limit alert_state rows resolved more than maxAge
// ago, in one statement: its own transaction when db is a pool or a bare
// connection. An alert raised again since (resolved_at NULL or newer) is
// kept. It returns how many rows it deleted.
func TrimState(ctx context.Context, db DBTX, maxAge time.Duration, limit int) (int64, error) {
	mustBound("TrimState", maxAge, limit)
	tag, err := db.Exec(ctx, `DELETE FROM alert_state WHERE (reason, subject) IN (
			SELECT reason, subject FROM alert_state WHERE resolved_at < now() - $2::interval LIMIT $1)
			AND resolved_at < now() - $2::interval`, limit, maxAge)
	if err != nil {
		return 0, fmt.Errorf("purge %s: %w", TableState, err)
	}
	return tag.RowsAffected(), nil
}

// CountTrimmableState counts what TrimState would delete, all batches
// together.
func CountTrimmableState(ctx context.Context, db DBTX, maxAge time.Duration) (int64, error) {
	var n int64
	err := db.QueryRow(ctx, `SELECT count(*) FROM alert_state WHERE resolved_at < now() - $1::interval`, maxAge).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count purgeable %s: %w", TableState, err)
	}
	return n, nil
}

// mustBound panics on a batch without bounds: only a programming error
// produces one (the purger fills in its defaults).
func mustBound(fn string, maxAge time.Duration, limit int) {
	if limit <= 0 || maxAge <= 0 {
		panic("alerts: " + fn + " needs a positive limit and max age")
	}
}
