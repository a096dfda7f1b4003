package ledger

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
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

// PutHold puts an existing key on hold and audits it. Holding a held key
// again updates the reason.
func PutHold(ctx context.Context, tx pgx.Tx, key, reason, actor string) error {
	k, err := getForUpdate(ctx, tx, key)
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `INSERT INTO key_holds (key, reason, actor) VALUES ($1, $2, $3)
		ON CONFLICT (key) DO UPDATE SET reason = excluded.reason, actor = excluded.actor, created_at = now()`, key, reason, actor)
	if err != nil {
		return wrap("hold key", err)
	}
	attempts, err := currentAttempts(ctx, tx, k)
	if err != nil {
		return err
	}
	return InsertAudit(ctx, tx, AuditEntry{Key: key, Tool: k.Tool, Attempt: attempts, Verdict: "operator", Action: "hold", Error: reason, Actor: actor})
}

// ReleaseHold lifts a hold and audits it. ErrNotFound if the key is not held.
func ReleaseHold(ctx context.Context, tx pgx.Tx, key, actor string) error {
	tag, err := tx.Exec(ctx, `DELETE FROM key_holds WHERE key = $1`, key)
	if err != nil {
		return wrap("release hold", err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("release hold of %q: %w", key, ErrNotFound)
	}
	k, err := Get(ctx, tx, key)
	if errors.Is(err, ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	attempts, err := currentAttempts(ctx, tx, k)
	if err != nil {
		return err
	}
	return InsertAudit(ctx, tx, AuditEntry{Key: key, Tool: k.Tool, Attempt: attempts, Verdict: "operator", Action: "release", Actor: actor})
}

// ListHolds returns every hold, oldest first.
func ListHolds(ctx context.Context, db DBTX) ([]Hold, error) {
	rows, err := db.Query(ctx, `SELECT h.key, coalesce(k.tool, ''), coalesce(k.status, ''), h.reason, h.actor, h.created_at
		FROM key_holds h LEFT JOIN idempotency_keys k ON k.key = h.key ORDER BY h.created_at, h.key`)
	if err != nil {
		return nil, wrap("list holds", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[Hold])
	return out, wrap("list holds", err)
}

// GetHold returns the key's hold, or ErrNotFound.
func GetHold(ctx context.Context, db DBTX, key string) (Hold, error) {
	var h Hold
	err := db.QueryRow(ctx, `SELECT h.key, coalesce(k.tool, ''), coalesce(k.status, ''), h.reason, h.actor, h.created_at
		FROM key_holds h LEFT JOIN idempotency_keys k ON k.key = h.key WHERE h.key = $1`, key).
		Scan(&h.Key, &h.Tool, &h.Status, &h.Reason, &h.Actor, &h.CreatedAt)
	return h, wrap("get hold", err)
}

func isHeld(ctx context.Context, db DBTX, key string) (bool, error) {
	var held bool
	err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM key_holds WHERE key = $1)`, key).Scan(&held)
	return held, wrap("check hold", err)
}

func currentAttempts(ctx context.Context, db DBTX, k Key) (int, error) {
	var n int
	err := db.QueryRow(ctx, `SELECT coalesce((SELECT attempts FROM reconcile_state WHERE key = $1 AND claimed_at = $2), 0)`, k.Key, k.ClaimedAt).Scan(&n)
	return n, wrap("read attempts", err)
}
