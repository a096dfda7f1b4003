package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerkeeper/ledgerkeeper/ledger"
)

// BulkSet says which of a filter's keys a bulk action applies to: the
// keys the operator's act on one key would not refuse by their state.
type BulkSet string

// The sets.
const (
	// BulkNotHeld: the keys not on hold (what a hold applies to).
	BulkNotHeld BulkSet = "not_held"
	// BulkHeld: the keys on hold (what a release applies to). Read from
	// key_holds, the small table, joined to their rows.
	BulkHeld BulkSet = "held"
	// BulkStuck: processing keys past the tool's window + grace whose
	// heartbeat, if any, is older than its timeout, not on hold: what
	// marking retryable applies to (operator.Resolve refuses the others:
	// settled, held, in flight). It needs KeyFilter.Tool, Window and
	// Heartbeat.
	BulkStuck BulkSet = "stuck"
)

// BulkKeys returns the keys f selects that set admits, in key order, at
// most limit+1 of them: more than limit says the set is larger than a bulk
// action may take, without counting the rest (and which limit+1 keys are
// returned then is unspecified). now is the database's clock before the
// read (a key claimed after it was claimed since this listing). The
// filter is the listing's (ListKeys: the same conditions, the same index
// shapes) under LIMIT limit+1, so the statement stops as soon as it has
// enough; the release set is driven from key_holds.
func BulkKeys(ctx context.Context, db ledger.DBTX, f KeyFilter, set BulkSet, limit int) (keys []ListedKey, now time.Time, err error) {
	if limit <= 0 {
		return nil, time.Time{}, fmt.Errorf("%w: a bulk listing needs a positive limit, got %d", ledger.ErrInvalid, limit)
	}
	if err := db.QueryRow(ctx, `SELECT now()`).Scan(&now); err != nil {
		return nil, time.Time{}, wrap("bulk keys: clock", err)
	}
	from, held := "idempotency_keys k", "false"
	switch set {
	case BulkNotHeld:
		if f.Held != nil && *f.Held {
			return nil, now, nil
		}
		notHeld := false
		f.Held = &notHeld
	case BulkHeld:
		if (f.Held != nil && !*f.Held) || f.Stuck {
			// Stuck keys are not held (StatsWith's meaning).
			return nil, now, nil
		}
		f.Held = nil
		from, held = "key_holds h JOIN idempotency_keys k ON k.key = h.key", "true"
	case BulkStuck:
		if (f.Held != nil && *f.Held) || (f.Status != "" && f.Status != ledger.StatusProcessing) {
			return nil, now, nil
		}
		if f.Tool == "" || f.Window <= 0 {
			return nil, time.Time{}, fmt.Errorf("%w: the keys to mark retryable are chosen per tool, by its window (tool %q, window %s)", ledger.ErrInvalid, f.Tool, f.Window)
		}
		f.Stuck, f.Held = true, nil
	default:
		return nil, time.Time{}, fmt.Errorf("%w: unknown bulk set %q", ledger.ErrInvalid, set)
	}
	cond, args, err := f.where()
	if err != nil {
		return nil, time.Time{}, err
	}
	args = append(args, limit+1)
	// Any limit+1 rows, then sorted: with ORDER BY k.key under the LIMIT
	// the planner may walk the primary key hoping to meet enough rows soon
	// (processing keys, 1% of a ledger, sit wherever their keys sort: 1.3 s
	// on 2M rows when they sort last), where the partial index finds them
	// at once (4 ms). Which limit+1 keys a set above the limit yields does
	// not matter: it is refused.
	q := fmt.Sprintf(`SELECT * FROM (SELECT k.key, k.tool, k.status, k.claimed_at, k.updated_at, k.heartbeat_at, %s AS held
		FROM %s WHERE %s LIMIT $%d) s ORDER BY key`, held, from, cond, len(args))
	rows, err := db.Query(ctx, q, args...)
	if err != nil {
		return nil, time.Time{}, wrap("bulk keys", err)
	}
	keys, err = pgx.CollectRows(rows, pgx.RowToStructByName[ListedKey])
	if err != nil {
		return nil, time.Time{}, wrap("bulk keys", err)
	}
	return keys, now, nil
}
