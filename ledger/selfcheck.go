package ledger

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// SelfCheckSamples returns up to limit keys of tool that are ground truth
// for a probe's self-check: completed, first claimed and last updated within
// maxAge, and whose outcome the tool server stored itself (no reconciler
// "completed" decision and no operator resolution in the audit trail; a key
// the original attempt completed while the reconciler probed it counts).
// Newest first claim first.
//
// Cost: a backward scan of the (tool, created_at) index that stops after
// limit matching rows, so a ledger of any size answers in a few reads.
func SelfCheckSamples(ctx context.Context, db DBTX, tool string, maxAge time.Duration, limit int) ([]Key, error) {
	const q = `SELECT ` + keyColumns + `
FROM idempotency_keys k
WHERE k.tool = $1
  AND k.created_at > now() - $2::interval
  AND k.status = 'completed'
  AND k.updated_at > now() - $2::interval
  AND NOT EXISTS (SELECT 1 FROM reconcile_audit a
                  WHERE a.key = k.key AND a.action = ANY($4::text[]))
ORDER BY k.created_at DESC
LIMIT $3`
	rows, err := db.Query(ctx, q, tool, maxAge, limit, notGroundTruthActions)
	if err != nil {
		return nil, wrap(fmt.Sprintf("draw self-check samples of tool %q", tool), err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Key, error) { return scanKey(r) })
	return out, wrap(fmt.Sprintf("draw self-check samples of tool %q", tool), err)
}

// notGroundTruthActions are the audit actions after which a completed key's
// outcome did not come from its tool server: the reconciler's own
// completion (its outcome came from the probe being checked) and an
// operator's resolution.
var notGroundTruthActions = []string{"completed", "operator_completed", "operator_marked_retryable"}
