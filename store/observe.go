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

// The sample ProcessingP99 draws: `since` is cut into p99Slices slices of
// creation time, and up to p99PerSlice completed keys are read from the
// start of each (1,200 keys per tool at most, 12 above the p99; each costs
// a random heap read, so 6,000 took a second on 20 million keys under
// load: BENCHMARKS.md, "Big ledgers"). Spread over the whole look-back,
// the sample is not biased towards the newest keys, of which the slow ones
// have not completed yet.
const (
	p99Slices   = 30
	p99PerSlice = 40
)

// ProcessingP99 measures, per tool, the p99 of completion time (updated_at
// - claimed_at) of keys first claimed within the last `since` that the
// tool side completed itself: the deadline rule's "p99 processing" as the
// ledger saw it. Keys resolved by the reconciler or an operator are left
// out (their updated_at is the repair's time, not the tool's), and so are
// keys whose processing took longer than `since`. It reads a bounded
// sample (p99Slices, p99PerSlice) through idempotency_keys_tool_created_idx,
// so its cost follows the number of tools, not the ledger's size or rate:
// Samples is the sample's size, not every completion.
func ProcessingP99(ctx context.Context, db ledger.DBTX, since time.Duration) ([]ToolLatency, error) {
	rows, err := db.Query(ctx, distinctTools+`
		SELECT t.tool, count(*)::int,
			percentile_cont(0.99) WITHIN GROUP (ORDER BY x.secs)::float8
		FROM tools t
		CROSS JOIN generate_series(0, $2::int - 1) AS sl(i)
		CROSS JOIN LATERAL (
			SELECT extract(epoch FROM k.updated_at - k.claimed_at) AS secs
			FROM idempotency_keys k
			WHERE k.tool = t.tool
			  AND k.created_at >= now() - $1::interval + sl.i * ($1::interval / $2::int)
			  AND k.created_at < now() - $1::interval + (sl.i + 1) * ($1::interval / $2::int)
			  AND k.status = 'completed'
			  AND NOT EXISTS (SELECT 1 FROM reconcile_state s WHERE s.key = k.key AND s.claimed_at = k.claimed_at)
			ORDER BY k.created_at
			LIMIT $3) x
		WHERE t.tool IS NOT NULL
		GROUP BY t.tool ORDER BY t.tool`, since, p99Slices, p99PerSlice)
	if err != nil {
		return nil, wrap("measure processing times", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[ToolLatency])
	return out, wrap("measure processing times", err)
}
