package store

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/ledgerkeeper/ledgerkeeper/ledger"
)

// The per-shard shapes of the reads that find work, used on Citus when
// the statement across shards failed because a worker is unreachable
// (shards.go). Each is the same predicate as its statement across shards,
// on one shard's tables; the coordinator merges the shards' answers in
// the statement's order and keeps its limit.

// processingToolsByShard is ProcessingTools shard by shard.
func processingToolsByShard(ctx context.Context, db ledger.DBTX) ([]string, error) {
	const tmpl = `SELECT coalesce(json_agg(DISTINCT tool), '[]') FROM %1$s WHERE status = 'processing'`
	tools, faults, err := shardwise[string](ctx, db, tmpl)
	if err != nil {
		return nil, err
	}
	slices.Sort(tools)
	return slices.Compact(tools), partial("list tools with processing keys", faults)
}

// dueRow is a due key read shard by shard, with the bookkeeping PeekDue
// shows.
type dueRow struct {
	ledger.Key
	Attempts        int        `json:"attempts"`
	FirstNotFoundAt *time.Time `json:"first_not_found_at"`
	Now             time.Time  `json:"now"`
}

// dueByShard is leaseCandidates (and peekDue) shard by shard: the oldest
// due keys after (afterAt, afterKey), at most want.
func dueByShard(ctx context.Context, db ledger.DBTX, p LeaseParams, keys []string, want int, afterAt any, afterKey string, from *time.Time) ([]dueRow, []ShardFault, error) {
	tmpl := `SELECT coalesce(json_agg(c), '[]') FROM (
	SELECT ` + keyColumnsOf("k") + `,
	       CASE WHEN s.claimed_at = k.claimed_at THEN s.attempts ELSE 0 END AS attempts,
	       CASE WHEN s.claimed_at = k.claimed_at THEN s.first_not_found_at END AS first_not_found_at,
	       now() AS now
	FROM %1$s k LEFT JOIN %2$s s ON s.key = k.key
	WHERE k.status = 'processing'
	  AND k.tool = %5$L
	  AND k.claimed_at <= now() - %6$L::interval
	  AND (k.heartbeat_at IS NULL OR k.heartbeat_at <= now() - %7$L::interval)
	  AND (%8$L::json IS NULL OR k.key IN (SELECT json_array_elements_text(%8$L::json)))
	  AND NOT EXISTS (SELECT 1 FROM %3$s h WHERE h.key = k.key)
	  AND (s.key IS NULL OR s.claimed_at <> k.claimed_at OR (
	        (s.lease_expires_at IS NULL OR s.lease_expires_at <= now())
	        AND (%9$L::bool OR s.next_probe_at IS NULL OR s.next_probe_at <= now())))
	  AND (%13$L::timestamptz IS NULL OR k.claimed_at >= %13$L::timestamptz)
	  AND (k.claimed_at, k.key) > (%11$L::timestamptz, %12$L::text)
	ORDER BY k.claimed_at, k.key
	LIMIT %10$L::int) c`
	var keysJSON, fromText *string
	if keys != nil {
		keysJSON = ptr(jsonText(keys))
	}
	if from != nil {
		fromText = ptr(timestamp(*from))
	}
	afterText := "-infinity"
	if t, ok := afterAt.(time.Time); ok {
		afterText = timestamp(t)
	}
	cands, faults, err := shardwise[dueRow](ctx, db, tmpl,
		ptr(p.Tool), ptr(interval(p.Window)), ptr(interval(p.HeartbeatTimeout)), keysJSON, ptr(fmt.Sprint(p.IgnoreBackoff)),
		ptr(fmt.Sprint(want)), ptr(afterText), ptr(afterKey), fromText)
	if err != nil {
		return nil, nil, err
	}
	slices.SortFunc(cands, func(a, b dueRow) int {
		return cmp.Or(a.ClaimedAt.Compare(b.ClaimedAt), strings.Compare(a.Key.Key, b.Key.Key))
	})
	if len(cands) > want {
		cands = cands[:want]
	}
	return cands, faults, nil
}

func ptr(s string) *string { return &s }

// leaseCandidatesByShard is dueByShard's keys, for the lease.
func leaseCandidatesByShard(ctx context.Context, db ledger.DBTX, p LeaseParams, keys []string, want int, afterAt any, afterKey string, from *time.Time) ([]ledger.Key, []ShardFault, error) {
	rows, faults, err := dueByShard(ctx, db, p, keys, want, afterAt, afterKey, from)
	out := make([]ledger.Key, len(rows))
	for i, r := range rows {
		out[i] = r.Key
	}
	return out, faults, err
}

// peekDueByShard is PeekDue shard by shard.
func peekDueByShard(ctx context.Context, db ledger.DBTX, p LeaseParams, keys []string, afterAt any, afterKey string) ([]Leased, error) {
	rows, faults, err := dueByShard(ctx, db, p, keys, p.Limit, afterAt, afterKey, nil)
	if err != nil {
		return nil, err
	}
	out := make([]Leased, len(rows))
	for i, r := range rows {
		out[i] = Leased{Key: r.Key, Attempts: r.Attempts, FirstNotFoundAt: r.FirstNotFoundAt, Now: r.Now}
	}
	return out, partial(fmt.Sprintf("list due keys of tool %q", p.Tool), faults)
}

// selfCheckSamplesByShard is SelfCheckSamples shard by shard.
func selfCheckSamplesByShard(ctx context.Context, db ledger.DBTX, tool string, maxAge time.Duration, limit int) ([]ledger.Key, error) {
	const tmpl = `SELECT coalesce(json_agg(c), '[]') FROM (
	SELECT ` + ledger.KeyColumns + `
	FROM %1$s k
	WHERE k.tool = %5$L
	  AND k.created_at > now() - %6$L::interval
	  AND k.status = 'completed'
	  AND k.updated_at > now() - %6$L::interval
	  AND NOT EXISTS (SELECT 1 FROM %4$s a
	                  WHERE a.key = k.key AND a.action IN (SELECT json_array_elements_text(%7$L::json)))
	ORDER BY k.created_at DESC
	LIMIT %8$L::int) c`
	out, faults, err := shardwise[ledger.Key](ctx, db, tmpl,
		ptr(tool), ptr(interval(maxAge)), ptr(jsonText(notGroundTruthActions)), ptr(fmt.Sprint(limit)))
	if err != nil {
		return nil, err
	}
	slices.SortFunc(out, func(a, b ledger.Key) int {
		return cmp.Or(b.CreatedAt.Compare(a.CreatedAt), strings.Compare(a.Key, b.Key))
	})
	if len(out) > limit {
		out = out[:limit]
	}
	return out, partial(fmt.Sprintf("draw self-check samples of tool %q", tool), faults)
}

// countExpiredProcessingByShard is CountExpiredProcessing shard by shard.
func countExpiredProcessingByShard(ctx context.Context, db ledger.DBTX) (total, held int64, err error) {
	const tmpl = `SELECT json_build_array(json_build_object('total', count(*), 'held', count(h.key)))
	FROM %1$s k LEFT JOIN %3$s h ON h.key = k.key
	WHERE k.status = 'processing' AND k.expires_at < now()`
	type counts struct {
		Total int64 `json:"total"`
		Held  int64 `json:"held"`
	}
	cs, faults, err := shardwise[counts](ctx, db, tmpl)
	if err != nil {
		return 0, 0, err
	}
	for _, c := range cs {
		total += c.Total
		held += c.Held
	}
	return total, held, partial("count expired processing keys", faults)
}

// expiredProcessingPageByShard is ExpiredProcessingPage shard by shard.
func expiredProcessingPageByShard(ctx context.Context, db ledger.DBTX, after PurgeCursor, limit int) ([]ExpiredKey, error) {
	const tmpl = `SELECT coalesce(json_agg(c), '[]') FROM (
	SELECT k.key, k.tool, k.created_at, k.claimed_at, k.expires_at
	FROM %1$s k
	WHERE k.status = 'processing' AND k.expires_at < now()
	  AND (k.expires_at, k.key) > (%5$L::timestamptz, %6$L::text)
	  AND NOT EXISTS (SELECT 1 FROM %3$s h WHERE h.key = k.key)
	ORDER BY k.expires_at, k.key
	LIMIT %7$L::int) c`
	out, faults, err := shardwise[ExpiredKey](ctx, db, tmpl, ptr(cursorText(after)), ptr(after.Key), ptr(fmt.Sprint(limit)))
	if err != nil {
		return nil, err
	}
	slices.SortFunc(out, func(a, b ExpiredKey) int {
		return cmp.Or(a.ExpiresAt.Compare(b.ExpiresAt), strings.Compare(a.Key, b.Key))
	})
	if len(out) > limit {
		out = out[:limit]
	}
	return out, partial("list expired processing keys", faults)
}

// cursorText is a purge cursor's position as a timestamptz literal's text.
func cursorText(c PurgeCursor) string {
	if c.ExpiresAt.IsZero() {
		return "-infinity"
	}
	return timestamp(c.ExpiresAt)
}

// purgeCandidatesByShard chooses a purge batch shard by shard: up to limit
// purgeable keys after the cursor, in (expires_at, key) order, with the
// floors as cut-offs (tool → cut-off, and the default).
func purgeCandidatesByShard(ctx context.Context, db ledger.DBTX, tools []string, cuts []time.Time, def time.Time, after PurgeCursor, limit int) ([]PurgeCursor, []ShardFault, error) {
	const tmpl = `SELECT coalesce(json_agg(c), '[]') FROM (
	SELECT k.expires_at, k.key
	FROM %1$s k
	WHERE k.expires_at >= %5$L::timestamptz AND (k.expires_at, k.key) > (%5$L::timestamptz, %6$L::text)
	  AND k.expires_at < now()
	  AND k.status IN ('completed', 'failed_retryable')
	  AND k.created_at < coalesce((%8$L::jsonb ->> k.tool::text)::timestamptz, %9$L::timestamptz)
	  AND k.key NOT IN (SELECT h.key FROM %3$s h)
	ORDER BY k.expires_at, k.key
	LIMIT %7$L::int) c`
	floors := make(map[string]string, len(tools))
	for i, t := range tools {
		floors[t] = timestamp(cuts[i])
	}
	out, faults, err := shardwise[PurgeCursor](ctx, db, tmpl, ptr(cursorText(after)), ptr(after.Key), ptr(fmt.Sprint(limit)),
		ptr(jsonText(floors)), ptr(timestamp(def)))
	if err != nil {
		return nil, nil, err
	}
	slices.SortFunc(out, func(a, b PurgeCursor) int {
		return cmp.Or(a.ExpiresAt.Compare(b.ExpiresAt), strings.Compare(a.Key, b.Key))
	})
	if len(out) > limit {
		out = out[:limit]
	}
	return out, faults, nil
}

// purgeChosenKey is the purge's DELETE of one key chosen shard by shard:
// $1 the key, $2-$4 the floors as in purgeable, whose hold check it makes
// on the key alone, so that Citus routes it to the key's shard (it runs
// a DELETE of = ANY(...) on every shard, the unreachable ones too).
const purgeChosenKey = `DELETE FROM idempotency_keys k
	WHERE k.key = $1::text
	  AND ` + purgeableUnheld + `
	  AND NOT EXISTS (SELECT 1 FROM key_holds h WHERE h.key = $1::text)
	RETURNING k.key, k.tool, k.status, k.expires_at`

// deleteChosen is deletePurge and checkHoldsAndStates for a batch chosen
// shard by shard (a worker is down): the candidates are chosen among the
// shards that answer, then deleted, their holds checked and their
// reconcile_state rows deleted key by key, each statement on its key's
// shard, pipelined.
// It returns the shards that did not answer.
func deleteChosen(ctx context.Context, tx pgx.Tx, p PurgePolicy, after PurgeCursor, limit int) (PurgeBatchResult, []ShardFault, error) {
	now, err := TxNow(ctx, tx)
	if err != nil {
		return PurgeBatchResult{}, nil, err
	}
	tools, cuts, def := p.cutoffs(now)
	chosen, faults, err := purgeCandidatesByShard(ctx, tx, tools, cuts, def, after, limit)
	if err != nil {
		return PurgeBatchResult{}, nil, err
	}
	res := PurgeBatchResult{Next: after, Candidates: len(chosen), Done: len(chosen) < limit}
	if len(chosen) == 0 {
		return res, faults, nil
	}
	res.Next = chosen[len(chosen)-1]
	type gone struct {
		key, tool, status string
		expiresAt         time.Time
	}
	var deleted []gone
	batch := &pgx.Batch{}
	for _, c := range chosen {
		batch.Queue(purgeChosenKey, c.Key, tools, cuts, def).Query(func(rows pgx.Rows) error {
			var g gone
			_, err := pgx.ForEachRow(rows, []any{&g.key, &g.tool, &g.status, &g.expiresAt}, func() error {
				deleted = append(deleted, g)
				return nil
			})
			return err
		})
	}
	if err := tx.SendBatch(ctx, batch).Close(); err != nil {
		return PurgeBatchResult{}, nil, err
	}
	byToolStatus := map[[2]string]*PurgeCount{}
	keys := make([]string, len(deleted))
	for i, g := range deleted {
		keys[i] = g.key
		c := byToolStatus[[2]string{g.tool, g.status}]
		if c == nil {
			c = &PurgeCount{Tool: g.tool, Status: g.status, OldestExpiresAt: g.expiresAt}
			byToolStatus[[2]string{g.tool, g.status}] = c
		}
		c.Keys++
		if g.expiresAt.Before(c.OldestExpiresAt) {
			c.OldestExpiresAt = g.expiresAt
		}
	}
	for _, c := range byToolStatus {
		res.ByToolStatus = append(res.ByToolStatus, *c)
		res.Keys += c.Keys
	}
	slices.SortFunc(res.ByToolStatus, func(a, b PurgeCount) int {
		return cmp.Or(strings.Compare(a.Tool, b.Tool), strings.Compare(a.Status, b.Status))
	})
	if len(keys) == 0 {
		return res, faults, nil
	}
	// checkHoldsAndStates, key by key: a hold that committed after the
	// DELETE's snapshot rolls the batch back (errHoldRace).
	var held int
	batch = &pgx.Batch{}
	for _, k := range keys {
		batch.Queue(`SELECT count(*) FROM key_holds WHERE key = $1::text`, k).QueryRow(func(row pgx.Row) error {
			var n int
			err := row.Scan(&n)
			held += n
			return err
		})
	}
	if err := tx.SendBatch(ctx, batch).Close(); err != nil {
		return PurgeBatchResult{}, nil, err
	}
	if held > 0 {
		return PurgeBatchResult{}, nil, errHoldRace
	}
	batch = &pgx.Batch{}
	for _, k := range keys {
		batch.Queue(`DELETE FROM reconcile_state WHERE key = $1::text`, k).Exec(func(ct pgconn.CommandTag) error {
			res.States += ct.RowsAffected()
			return nil
		})
	}
	if err := tx.SendBatch(ctx, batch).Close(); err != nil {
		return PurgeBatchResult{}, nil, err
	}
	return res, faults, nil
}
