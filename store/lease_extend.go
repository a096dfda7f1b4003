package store

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerkeeper/ledgerkeeper/ledger"
)

// ExtendLeases renews, to now() + lease, the leases owner still holds on
// keys, and returns the keys renewed. A key another holder has leased since
// (its lease lapsed and it was taken) or that was given back is not
// renewed: it is no longer owner's to write. The reconciler extends the
// leases of a batch whose answers wait for a closing self-check that would
// otherwise outlast them.
func ExtendLeases(ctx context.Context, db ledger.DBTX, keys []string, owner string, lease time.Duration) ([]string, error) {
	rows, err := db.Query(ctx, `UPDATE reconcile_state SET lease_expires_at = now() + $3::interval, updated_at = now()
		WHERE key = ANY($1::text[]) AND lease_owner = $2
		RETURNING key`, keys, owner, lease)
	if err != nil {
		return nil, wrap("extend leases", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	return out, wrap("extend leases", err)
}
