package store

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
)

// Statuses returns the status of each of keys still in the ledger, in one
// statement whatever their number (a key absent from the map is not in the
// ledger). The reconciler's alert sweep asks it for a page of alerted keys.
func Statuses(ctx context.Context, db ledger.DBTX, keys []string) (map[string]string, error) {
	out := make(map[string]string, len(keys))
	if len(keys) == 0 {
		return out, nil
	}
	rows, err := db.Query(ctx, `SELECT key, status FROM idempotency_keys WHERE key = ANY($1::text[])`, keys)
	if err != nil {
		return nil, wrap("read key statuses", err)
	}
	var key, status string
	_, err = pgx.ForEachRow(rows, []any{&key, &status}, func() error {
		out[key] = status
		return nil
	})
	if err != nil {
		return nil, wrap("read key statuses", err)
	}
	return out, nil
}
