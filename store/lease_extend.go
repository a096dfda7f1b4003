package store

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerkeeper/ledgerkeeper/internal/engine"
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
	var out []string
	if err == nil {
		out, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	if err != nil && engine.Citus() && NodeUnreachable(err) {
		return extendLeasesOneByOne(ctx, db, keys, owner, lease)
	}
	return out, wrap("extend leases", err)
}

// extendLeasesOneByOne is ExtendLeases key by key, each statement on its
// key's shard: while a Citus worker is down (Citus runs the = ANY form on
// every shard). The leases of the keys on the unreachable worker are not
// renewed: their decisions cannot be written before it is back anyway.
func extendLeasesOneByOne(ctx context.Context, db ledger.DBTX, keys []string, owner string, lease time.Duration) ([]string, error) {
	var out []string
	for _, k := range keys {
		var got string
		err := db.QueryRow(ctx, `UPDATE reconcile_state SET lease_expires_at = now() + $3::interval, updated_at = now()
			WHERE key = $1 AND lease_owner = $2
			RETURNING key`, k, owner, lease).Scan(&got)
		switch {
		case err == nil:
			out = append(out, got)
		case errors.Is(err, pgx.ErrNoRows), NodeUnreachable(err):
		default:
			return out, wrap("extend leases", err)
		}
	}
	return out, nil
}
