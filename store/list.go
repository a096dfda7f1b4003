package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerkeeper/ledgerkeeper/ledger"
)

// KeyFilter selects keys for a listing (the console's keys page). Every
// field is optional; values are always sent as parameters.
type KeyFilter struct {
	// Tool is the keys' tool, exactly.
	Tool string
	// Status is processing, completed or failed_retryable.
	Status string
	// Prefix selects keys that start with it.
	Prefix string
	// Held: true only held keys, false only keys not held, nil both.
	Held *bool
	// Stuck selects processing keys past Window (the tool's window + grace)
	// whose heartbeat, if any, is older than Heartbeat, and not held: what
	// StatsWith counts as stuck. It needs Tool.
	Stuck             bool
	Window, Heartbeat time.Duration
	// OlderThan selects keys claimed at least this long ago (by the
	// database's clock); 0 any.
	OlderThan time.Duration
	// MinAttempts selects keys whose current attempt the reconciler has
	// probed at least this many times (reconcile_state); 0 any.
	MinAttempts int
}

// narrow reports whether f selects from a small population of the ledger
// (keys not completed, held, or probed): a listing then reads every match
// past the cursor and sorts them, instead of walking the primary key in
// order, which on a large ledger crosses millions of completed rows to find
// a page of matches that sort late.
func (f KeyFilter) narrow() bool {
	return f.Status == ledger.StatusProcessing || f.Status == ledger.StatusFailedRetryable || f.Stuck ||
		(f.Held != nil && *f.Held) || f.MinAttempts > 0
}

// ListedKey is one row of a listing: the key without its bodies, and
// whether it is held.
type ListedKey struct {
	Key         string     `json:"key"`
	Tool        string     `json:"tool"`
	Status      string     `json:"status"`
	ClaimedAt   time.Time  `json:"claimed_at"`
	UpdatedAt   time.Time  `json:"updated_at"`
	HeartbeatAt *time.Time `json:"heartbeat_at,omitempty"`
	Held        bool       `json:"held"`
}

// KeyCount is how many keys a filter selects: exact up to the listing's
// threshold, otherwise the planner's estimate.
type KeyCount struct {
	N         int64 `json:"n"`
	Estimated bool  `json:"estimated"`
}

// where builds the filter's WHERE clause over idempotency_keys k, its
// values as parameters from $1 (never spliced into the text).
func (f KeyFilter) where() (string, []any, error) {
	var conds []string
	var args []any
	param := func(v any) string {
		args = append(args, v)
		return fmt.Sprintf("$%d", len(args))
	}
	if f.Tool != "" {
		conds = append(conds, "k.tool = "+param(f.Tool))
	}
	switch f.Status {
	case "":
	case ledger.StatusProcessing, ledger.StatusCompleted, ledger.StatusFailedRetryable:
		conds = append(conds, "k.status = "+param(f.Status))
	default:
		return "", nil, fmt.Errorf("%w: status %q is not processing, completed or failed_retryable", ledger.ErrInvalid, f.Status)
	}
	if f.Prefix != "" {
		// A range on the primary key's order plus the exact test: no
		// LIKE pattern, so % and _ in a key mean themselves.
		conds = append(conds, "k.key >= "+param(f.Prefix), "starts_with(k.key, "+param(f.Prefix)+")")
	}
	if f.Stuck {
		if f.Tool == "" {
			return "", nil, fmt.Errorf("%w: stuck keys are listed per tool (its window says what stuck means)", ledger.ErrInvalid)
		}
		w, hb := param(f.Window.Seconds()), param(f.Heartbeat.Seconds())
		conds = append(conds, "k.status = 'processing'",
			"k.claimed_at <= now() - make_interval(secs => "+w+")",
			"(k.heartbeat_at IS NULL OR k.heartbeat_at <= now() - make_interval(secs => "+hb+"))",
			"NOT EXISTS (SELECT 1 FROM key_holds h WHERE h.key = k.key)")
	}
	if f.OlderThan > 0 {
		conds = append(conds, "k.claimed_at <= now() - make_interval(secs => "+param(f.OlderThan.Seconds())+")")
	}
	if f.MinAttempts > 0 {
		conds = append(conds, "EXISTS (SELECT 1 FROM reconcile_state s WHERE s.key = k.key AND s.claimed_at = k.claimed_at AND s.attempts >= "+param(f.MinAttempts)+")")
	}
	if f.Held != nil {
		not := "NOT "
		if *f.Held {
			not = ""
		}
		conds = append(conds, not+"EXISTS (SELECT 1 FROM key_holds h WHERE h.key = k.key)")
	}
	if len(conds) == 0 {
		return "TRUE", args, nil
	}
	return strings.Join(conds, " AND "), args, nil
}

// ListKeys returns at most limit keys that f selects, in key order, after
// the key after ("" from the first): keyset pagination, so a page costs
// the same however deep it is. more says whether another page follows.
func ListKeys(ctx context.Context, db ledger.DBTX, f KeyFilter, after string, limit int) (keys []ListedKey, more bool, err error) {
	if limit <= 0 {
		limit = 50
	}
	cond, args, err := f.where()
	if err != nil {
		return nil, false, err
	}
	args = append(args, after, limit+1)
	q := fmt.Sprintf(`SELECT k.key, k.tool, k.status, k.claimed_at, k.updated_at, k.heartbeat_at,
			EXISTS (SELECT 1 FROM key_holds h WHERE h.key = k.key)
		FROM idempotency_keys k WHERE %s AND k.key > $%d ORDER BY k.key LIMIT $%d`, cond, len(args)-1, len(args))
	if f.narrow() {
		// OFFSET 0 fences the inner select: the planner reads the matches
		// by the filter's own indexes, then sorts them.
		q = fmt.Sprintf(`SELECT * FROM (SELECT k.key, k.tool, k.status, k.claimed_at, k.updated_at, k.heartbeat_at,
				EXISTS (SELECT 1 FROM key_holds h WHERE h.key = k.key)
			FROM idempotency_keys k WHERE %s AND k.key > $%d OFFSET 0) m ORDER BY 1 LIMIT $%d`, cond, len(args)-1, len(args))
	}
	rows, err := db.Query(ctx, q, args...)
	if err != nil {
		return nil, false, wrap("list keys", err)
	}
	keys, err = pgx.CollectRows(rows, pgx.RowToStructByPos[ListedKey])
	if err != nil {
		return nil, false, wrap("list keys", err)
	}
	if len(keys) > limit {
		return keys[:limit], true, nil
	}
	return keys, false, nil
}

// CountKeys counts the keys f selects exactly while they are at most
// exactBelow (a count that stops there), and otherwise returns the
// planner's estimate for the same statement, marked Estimated: a filter
// matching most of a large ledger is never counted row by row.
func CountKeys(ctx context.Context, db ledger.DBTX, f KeyFilter, exactBelow int64) (KeyCount, error) {
	cond, args, err := f.where()
	if err != nil {
		return KeyCount{}, err
	}
	var n int64
	err = db.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM (SELECT 1 FROM idempotency_keys k WHERE %s LIMIT $%d) c`, cond, len(args)+1),
		append(args, exactBelow+1)...).Scan(&n)
	if err != nil {
		return KeyCount{}, wrap("count keys", err)
	}
	if n <= exactBelow {
		return KeyCount{N: n}, nil
	}
	var plan []struct {
		Plan struct {
			Rows float64 `json:"Plan Rows"`
		} `json:"Plan"`
	}
	var raw []byte
	if err := db.QueryRow(ctx, `EXPLAIN (FORMAT JSON) SELECT 1 FROM idempotency_keys k WHERE `+cond, args...).Scan(&raw); err != nil {
		return KeyCount{}, wrap("estimate keys", err)
	}
	if err := json.Unmarshal(raw, &plan); err != nil {
		return KeyCount{}, fmt.Errorf("estimate keys: unreadable plan: %w", err)
	}
	if len(plan) == 0 {
		return KeyCount{}, errors.New("estimate keys: an empty plan")
	}
	// Never below what was just counted.
	return KeyCount{N: max(int64(plan[0].Plan.Rows), exactBelow+1), Estimated: true}, nil
}
