package store

import (
	"context"
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/ledger"
)

// Standing is why a processing key may not be due, judged by the
// database's clock: what `reconcile --key` tells an operator about a key it
// did not decide.
type Standing struct {
	// InWindow: claimed less than window ago.
	InWindow bool
	// Beating: heartbeat younger than heartbeatTimeout.
	Beating bool
	// Leased by a reconciler right now.
	Leased bool
	// Held by an operator.
	Held bool
}

// KeyStanding reads a key's Standing (ErrNotFound if it is not in the
// ledger).
func KeyStanding(ctx context.Context, db ledger.DBTX, key string, window, heartbeatTimeout time.Duration) (Standing, error) {
	var s Standing
	err := db.QueryRow(ctx, `SELECT k.claimed_at > now() - $2::interval,
			coalesce(k.heartbeat_at > now() - $3::interval, false),
			coalesce((SELECT s.lease_expires_at > now() FROM reconcile_state s WHERE s.key = k.key AND s.claimed_at = k.claimed_at), false),
			EXISTS (SELECT 1 FROM key_holds h WHERE h.key = k.key)
		FROM idempotency_keys k WHERE k.key = $1`, key, window, heartbeatTimeout).Scan(&s.InWindow, &s.Beating, &s.Leased, &s.Held)
	return s, wrap("read key standing", err)
}
