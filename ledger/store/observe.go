package store

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
)

// ToolLatency is the observed processing time of a tool's keys.
type ToolLatency struct {
	Tool       string  `json:"tool"`
	Samples    int     `json:"samples"`
	P99Seconds float64 `json:"p99_seconds"`
}

// ProcessingP99 measures, per tool, the p99 of completion time (updated_at
// - claimed_at) of keys the tool side completed itself within the last
// `since`: the deadline rule's "p99 processing" as the ledger saw it. Keys
// resolved by the reconciler or an operator are left out (their updated_at
// is the repair's time, not the tool's). It scans recent rows: an operator
// and low-frequency metric query, not a hot path.
func ProcessingP99(ctx context.Context, db ledger.DBTX, since time.Duration) ([]ToolLatency, error) {
	rows, err := db.Query(ctx, `SELECT k.tool, count(*)::int,
			percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM k.updated_at - k.claimed_at))::float8
		FROM idempotency_keys k
		WHERE k.status = 'completed' AND k.updated_at >= now() - $1::interval
		  AND NOT EXISTS (SELECT 1 FROM reconcile_state s WHERE s.key = k.key AND s.claimed_at = k.claimed_at)
		GROUP BY k.tool ORDER BY k.tool`, since)
	if err != nil {
		return nil, wrap("measure processing times", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[ToolLatency])
	return out, wrap("measure processing times", err)
}
