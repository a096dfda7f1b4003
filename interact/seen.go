package interact

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// SeenTTL is how long a delivery's identity is remembered: longer than the
// 5 minutes a signed request's timestamp may be off in either direction,
// and than Slack keeps a click's or a submission's delivery alive.
const SeenTTL = 15 * time.Minute

// maxSeenPurge bounds the expired identities one Claim deletes.
const maxSeenPurge = 100

const (
	// purgeSeen deletes a bounded batch of expired identities,
	// re-checking the condition on the rows it deletes.
	purgeSeen = `DELETE FROM slack_seen WHERE id IN (
		SELECT id FROM slack_seen WHERE expires_at < now() ORDER BY expires_at LIMIT $1)
		AND expires_at < now()`
	// claimSeen inserts an identity, or takes over an expired one; it
	// returns a row only then. Concurrent claims of one id: the primary
	// key lets exactly one insert, the other waits and finds it fresh.
	claimSeen = `INSERT INTO slack_seen (id, expires_at) VALUES ($1, now() + $2::interval)
		ON CONFLICT (id) DO UPDATE SET expires_at = excluded.expires_at WHERE slack_seen.expires_at < now()
		RETURNING id`
)

// Claim records a delivery's identity in the seen-set shared by replicas
// through the database; false when already seen (and not expired). ttl 0
// means SeenTTL. Expired identities are deleted opportunistically, a
// bounded batch per call. The database's clock decides expiry.
func (h *Handler) Claim(ctx context.Context, id string, ttl time.Duration) (bool, error) {
	if ttl <= 0 {
		ttl = SeenTTL
	}
	if _, err := h.seen.Exec(ctx, purgeSeen, maxSeenPurge); err != nil {
		return false, fmt.Errorf("purge expired Slack deliveries: %w", err)
	}
	var got string
	err := h.seen.QueryRow(ctx, claimSeen, id, ttl).Scan(&got)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("record Slack delivery: %w", err)
	}
	return true, nil
}
