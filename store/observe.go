package store

import (
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/ledgerkeeper/ledgerkeeper/internal/engine"
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
	engine.Ensure(ctx, db)
	if engine.Citus() {
		return processingP99Citus(ctx, db, since)
	}
	rows, err := db.Query(ctx, distinctTools()+`
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

// processingP99Citus is ProcessingP99 on Citus, which cannot push a
// LATERAL join over slices and tools down to the shards: the tools with
// completed keys in the look-back, then one batch (one round trip) of a
// bounded read per tool and slice (the same sample: p99PerSlice keys from
// the start of each of p99Slices slices, each read a per-shard backward
// walk of idempotency_keys_tool_created_idx merged by the coordinator), and
// the percentile computed here as percentile_cont computes it.
func processingP99Citus(ctx context.Context, db ledger.DBTX, since time.Duration) ([]ToolLatency, error) {
	var now time.Time
	var tools []string
	rows, err := db.Query(ctx, `SELECT DISTINCT tool, now() FROM idempotency_keys
		WHERE status = 'completed' AND created_at >= now() - $1::interval ORDER BY tool, now()`, since)
	if err == nil {
		var tool string
		// now() is each shard's: a tool may come once per shard.
		_, err = pgx.ForEachRow(rows, []any{&tool, &now}, func() error {
			if len(tools) == 0 || tools[len(tools)-1] != tool {
				tools = append(tools, tool)
			}
			return nil
		})
	}
	if err != nil || len(tools) == 0 {
		return nil, wrap("measure processing times", err)
	}
	const sample = `SELECT extract(epoch FROM k.updated_at - k.claimed_at)::float8 FROM idempotency_keys k
		WHERE k.tool = $1 AND k.created_at >= $2 AND k.created_at < $3 AND k.status = 'completed'
		  AND NOT EXISTS (SELECT 1 FROM reconcile_state s WHERE s.key = k.key AND s.claimed_at = k.claimed_at)
		ORDER BY k.created_at LIMIT $4`
	secs := make([][]float64, len(tools))
	batch := &pgx.Batch{}
	from, slice := now.Add(-since), since/p99Slices
	for i, tool := range tools {
		for sl := range p99Slices {
			lo := from.Add(time.Duration(sl) * slice)
			batch.Queue(sample, tool, lo, lo.Add(slice), p99PerSlice).Query(func(rows pgx.Rows) error {
				got, err := pgx.CollectRows(rows, pgx.RowTo[float64])
				secs[i] = append(secs[i], got...)
				return err
			})
		}
	}
	sender, ok := db.(interface {
		SendBatch(context.Context, *pgx.Batch) pgx.BatchResults
	})
	if !ok {
		return nil, fmt.Errorf("measure processing times: %T cannot send a batch", db)
	}
	if err := sender.SendBatch(ctx, batch).Close(); err != nil {
		return nil, wrap("measure processing times", err)
	}
	var out []ToolLatency
	for i, tool := range tools {
		if len(secs[i]) == 0 {
			continue
		}
		out = append(out, ToolLatency{Tool: tool, Samples: len(secs[i]), P99Seconds: percentileCont(secs[i], 0.99)})
	}
	return out, nil
}

// percentileCont is PostgreSQL's percentile_cont(p) of xs: the value at
// position p*(n-1) of the sorted values, interpolated linearly.
func percentileCont(xs []float64, p float64) float64 {
	slices.Sort(xs)
	pos := p * float64(len(xs)-1)
	lo := int(math.Floor(pos))
	hi := int(math.Ceil(pos))
	return xs[lo] + (xs[hi]-xs[lo])*(pos-float64(lo))
}
