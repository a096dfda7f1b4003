package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
)

// Hold is an operator's hold on a key: it is neither probed, resolved nor
// purged until released (invariant 10).
type Hold struct {
	Key       string    `json:"key"`
	Tool      string    `json:"tool,omitempty"`
	Status    string    `json:"status,omitempty"`
	Reason    string    `json:"reason"`
	Actor     string    `json:"actor"`
	CreatedAt time.Time `json:"created_at"`
}

// HeldError is PutHold's refusal to hold a key that is already on hold: it
// carries the hold in force, so the operator sees whose it is and why
// before deciding to replace it. It matches ErrHeld.
type HeldError struct {
	Hold Hold
}

func (e *HeldError) Error() string {
	return fmt.Sprintf("key %q is already on hold (by %s since %s: %s)",
		e.Hold.Key, e.Hold.Actor, e.Hold.CreatedAt.UTC().Format(time.RFC3339), e.Hold.Reason)
}

// Unwrap makes errors.Is(err, ErrHeld) true.
func (e *HeldError) Unwrap() error { return ErrHeld }

// PutHold puts an existing key on hold and audits it. A key already on hold
// is refused with a *HeldError and nothing changes: one operator's hold is
// never silently overwritten by another's (ReplaceHold does that on
// purpose). ErrNotFound if the key is not in the ledger.
func PutHold(ctx context.Context, tx pgx.Tx, key, reason, actor string) error {
	_, err := putHold(ctx, tx, key, reason, actor, false)
	return err
}

// ReplaceHold puts an existing key on hold as PutHold does, replacing the
// hold it already has (reason, actor and since-when become the new ones).
// It returns the replaced hold, nil if the key was not held. The audit
// entry is a hold like PutHold's, its evidence naming the replaced hold.
func ReplaceHold(ctx context.Context, tx pgx.Tx, key, reason, actor string) (*Hold, error) {
	return putHold(ctx, tx, key, reason, actor, true)
}

func putHold(ctx context.Context, tx pgx.Tx, key, reason, actor string, replace bool) (*Hold, error) {
	// The key's row lock orders concurrent holds of one key (and the purge
	// that waits on it, see PurgeExpiredBatch).
	k, err := getForUpdate(ctx, tx, key)
	if err != nil {
		return nil, err
	}
	var prev *Hold
	old, err := GetHold(ctx, tx, key)
	switch {
	case err == nil:
		if !replace {
			return nil, &HeldError{Hold: old}
		}
		prev = &old
	case !errors.Is(err, ledger.ErrNotFound):
		return nil, err
	}
	// created_at from excluded (its default, now()): Citus refuses now()
	// in DO UPDATE SET.
	_, err = tx.Exec(ctx, `INSERT INTO key_holds (key, reason, actor) VALUES ($1, $2, $3)
		ON CONFLICT (key) DO UPDATE SET reason = excluded.reason, actor = excluded.actor, created_at = excluded.created_at`, key, reason, actor)
	if err != nil {
		return nil, wrap("hold key", err)
	}
	attempts, err := currentAttempts(ctx, tx, k)
	if err != nil {
		return nil, err
	}
	var evidence json.RawMessage
	if prev != nil {
		evidence, err = json.Marshal(map[string]any{"replaced": map[string]any{
			"reason": prev.Reason, "actor": prev.Actor, "since": prev.CreatedAt,
		}})
		if err != nil {
			return nil, fmt.Errorf("hold key: encode the replaced hold: %w", err)
		}
	}
	err = InsertAudit(ctx, tx, AuditEntry{Key: key, Tool: k.Tool, Attempt: attempts, Verdict: "operator", Action: "hold", Evidence: evidence, Error: reason, Actor: actor})
	return prev, err
}

// ReleaseHold lifts a hold and audits it. ErrNotFound if the key is not held.
func ReleaseHold(ctx context.Context, tx pgx.Tx, key, actor string) error {
	return ReleaseHoldNoted(ctx, tx, key, actor, "")
}

// ReleaseHoldNoted is ReleaseHold with a note in the audit row's error
// column, where a hold keeps its reason ("" for none): a binding that
// acts for a named person (Slack) says who there.
func ReleaseHoldNoted(ctx context.Context, tx pgx.Tx, key, actor, note string) error {
	tag, err := tx.Exec(ctx, `DELETE FROM key_holds WHERE key = $1`, key)
	if err != nil {
		return wrap("release hold", err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("release hold of %q: %w", key, ledger.ErrNotFound)
	}
	k, err := ledger.Get(ctx, tx, key)
	if errors.Is(err, ledger.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	attempts, err := currentAttempts(ctx, tx, k)
	if err != nil {
		return err
	}
	return InsertAudit(ctx, tx, AuditEntry{Key: key, Tool: k.Tool, Attempt: attempts, Verdict: "operator", Action: "release", Error: note, Actor: actor})
}

// ListHolds returns every hold, oldest first.
func ListHolds(ctx context.Context, db ledger.DBTX) ([]Hold, error) {
	rows, err := db.Query(ctx, `SELECT h.key, coalesce(k.tool, ''), coalesce(k.status, ''), h.reason, h.actor, h.created_at
		FROM key_holds h LEFT JOIN idempotency_keys k ON k.key = h.key ORDER BY h.created_at, h.key`)
	if err != nil {
		return nil, wrap("list holds", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[Hold])
	return out, wrap("list holds", err)
}

// GetHold returns the key's hold, or ErrNotFound.
func GetHold(ctx context.Context, db ledger.DBTX, key string) (Hold, error) {
	var h Hold
	err := db.QueryRow(ctx, `SELECT h.key, coalesce(k.tool, ''), coalesce(k.status, ''), h.reason, h.actor, h.created_at
		FROM key_holds h LEFT JOIN idempotency_keys k ON k.key = h.key WHERE h.key = $1`, key).
		Scan(&h.Key, &h.Tool, &h.Status, &h.Reason, &h.Actor, &h.CreatedAt)
	return h, wrap("get hold", err)
}

func currentAttempts(ctx context.Context, db ledger.DBTX, k ledger.Key) (int, error) {
	var n int
	err := db.QueryRow(ctx, `SELECT coalesce((SELECT attempts FROM reconcile_state WHERE key = $1 AND claimed_at = $2), 0)`, k.Key, k.ClaimedAt).Scan(&n)
	return n, wrap("read attempts", err)
}

// ToolHolds is one tool's holds, for the daemon's gauges.
type ToolHolds struct {
	// Tool is the held key's tool; "" for holds on keys that are no longer
	// in the ledger (deleted by hand: purge never deletes a held key). Such
	// a hold still matters: it would apply to a key of the same name
	// claimed again, so it is counted, not dropped.
	Tool string `json:"tool"`
	// Held is the number of holds.
	Held int `json:"held"`
	// OldestAgeSeconds is the age of the oldest hold (since it was put or
	// last replaced), by the database's clock.
	OldestAgeSeconds float64 `json:"oldest_age_seconds"`
}

// HoldStats counts holds per tool with the age of each tool's oldest hold,
// in one aggregate statement (its cost follows the number of holds, which
// is small; no hold is loaded).
func HoldStats(ctx context.Context, db ledger.DBTX) ([]ToolHolds, error) {
	rows, err := db.Query(ctx, `SELECT coalesce(k.tool, ''), count(*), extract(epoch FROM now() - min(h.created_at))::float8
		FROM key_holds h LEFT JOIN idempotency_keys k ON k.key = h.key
		GROUP BY 1 ORDER BY 1`)
	if err != nil {
		return nil, wrap("count holds", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[ToolHolds])
	return out, wrap("count holds", err)
}

// HeldKeys says which of keys are on hold, in one statement (the alert
// dispatcher's Config.Held: a held key's alert offers Release).
func HeldKeys(ctx context.Context, db ledger.DBTX, keys []string) (map[string]bool, error) {
	rows, err := db.Query(ctx, `SELECT key FROM key_holds WHERE key = ANY($1)`, keys)
	if err != nil {
		return nil, wrap("held keys", err)
	}
	held, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, wrap("held keys", err)
	}
	out := make(map[string]bool, len(held))
	for _, k := range held {
		out[k] = true
	}
	return out, nil
}
