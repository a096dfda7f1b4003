package store

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/ledgerkeeper/ledgerkeeper/internal/engine"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
)

// ToolStats is one tool's line in `ledgerkeeper status`.
type ToolStats struct {
	Tool string `json:"tool"`
	// InWindow: processing and still inside window + grace, or with a
	// fresh heartbeat (in flight, hands off).
	InWindow int `json:"processing_in_window"`
	// Stuck: processing past window + grace without a fresh heartbeat, and
	// not on hold.
	Stuck int `json:"stuck"`
	// OldestStuckClaimedAt is the claimed_at of the oldest stuck key.
	OldestStuckClaimedAt *time.Time `json:"oldest_stuck_claimed_at,omitempty"`
	// OldestStuckAge is now - OldestStuckClaimedAt, in seconds.
	OldestStuckAgeSeconds float64 `json:"oldest_stuck_age_seconds,omitempty"`
	FailedRetryable       int     `json:"failed_retryable"`
	Completed             int     `json:"completed"`
	// CompletedEstimated: Completed is an estimate from PostgreSQL's
	// planner statistics (StatsWith), not a count.
	CompletedEstimated bool `json:"completed_estimated"`
	Held               int  `json:"held"`
}

// Windows returns, for a tool, its processing window + grace and its
// heartbeat timeout.
type Windows func(tool string) (window, heartbeat time.Duration)

// Stats counts keys per tool and status: StatsWith with the default
// options (completed keys estimated on a large ledger, every other figure
// exact).
func Stats(ctx context.Context, db ledger.DBTX, windows Windows) ([]ToolStats, error) {
	c, err := StatsWith(ctx, db, windows, StatsOptions{})
	return c.Tools, err
}

// exactStats counts every row per tool and status: a scan of the whole
// table (`status --exact`, or a ledger small enough for it); stuck keys
// are found through the partial index.
func exactStats(ctx context.Context, db ledger.DBTX, windows Windows) ([]ToolStats, error) {
	rows, err := db.Query(ctx, `SELECT tool, status, count(*) FROM idempotency_keys GROUP BY tool, status`)
	if err != nil {
		return nil, wrap("count keys", err)
	}
	byTool := map[string]*ToolStats{}
	get := func(tool string) *ToolStats {
		s, ok := byTool[tool]
		if !ok {
			s = &ToolStats{Tool: tool}
			byTool[tool] = s
		}
		return s
	}
	processing := map[string]int{}
	var tool, status string
	var n int
	_, err = pgx.ForEachRow(rows, []any{&tool, &status, &n}, func() error {
		s := get(tool)
		switch status {
		case ledger.StatusProcessing:
			processing[tool] = n
		case ledger.StatusCompleted:
			s.Completed = n
		case ledger.StatusFailedRetryable:
			s.FailedRetryable = n
		}
		return nil
	})
	if err != nil {
		return nil, wrap("count keys", err)
	}
	stuck, _, err := stuckStats(ctx, db, windows)
	if err != nil {
		return nil, err
	}
	for _, st := range stuck {
		s := get(st.Tool)
		s.InWindow, s.Stuck, s.OldestStuckClaimedAt, s.OldestStuckAgeSeconds = st.InWindow, st.Stuck, st.OldestStuckClaimedAt, st.OldestStuckAgeSeconds
		delete(processing, st.Tool)
	}
	for tool, n := range processing { // claimed since stuckStats looked
		get(tool).InWindow = n
	}
	if err := countHolds(ctx, db, get); err != nil {
		return nil, err
	}
	return sortedStats(byTool), nil
}

// StuckStats counts processing keys per tool, in flight and stuck, through
// the partial index only: its cost follows the number of processing keys,
// not the table's size, so the daemon can export it as metrics. It sends two
// statements whatever the number of tools: one finds the tools with
// processing keys, the other counts every tool's stuck keys against its own
// windows, passed as arrays.
func StuckStats(ctx context.Context, db ledger.DBTX, windows Windows) ([]ToolStats, error) {
	engine.Ensure(ctx, db)
	out, _, err := stuckStats(ctx, db, windows)
	return out, err
}

// stuckStats is StuckStats, also returning each tool's processing keys
// (in flight, stuck and held).
func stuckStats(ctx context.Context, db ledger.DBTX, windows Windows) ([]ToolStats, map[string]int, error) {
	rows, err := db.Query(ctx, `SELECT tool, count(*) FROM idempotency_keys WHERE status = 'processing' GROUP BY tool ORDER BY tool`)
	if err != nil {
		return nil, nil, wrap("count processing keys", err)
	}
	var out []ToolStats
	processing := map[string]int{}
	var tool string
	var n int
	_, err = pgx.ForEachRow(rows, []any{&tool, &n}, func() error {
		out = append(out, ToolStats{Tool: tool, InWindow: n})
		processing[tool] = n
		return nil
	})
	if err != nil {
		return nil, nil, wrap("count processing keys", err)
	}
	if len(out) == 0 {
		return out, processing, nil
	}
	tools := make([]string, len(out))
	wins := make([]time.Duration, len(out))
	hbs := make([]time.Duration, len(out))
	for i, s := range out {
		tools[i] = s.Tool
		wins[i], hbs[i] = windows(s.Tool)
	}
	// One range scan of the partial index per tool (the LATERAL join),
	// in one statement. A held key is parked by an operator: not stuck,
	// not in flight. The hold is a join (key_holds' key is its primary
	// key: at most one per key), read once per key: an EXISTS in the
	// inner select was inlined into each of the four aggregates and ran
	// four times per key (151 ms against 11 ms for 1,540 stuck keys of a
	// 20M-key ledger).
	q := `SELECT w.ord, s.stuck, s.oldest, s.age, s.held
		FROM unnest($1::text[], $2::interval[], $3::interval[]) WITH ORDINALITY AS w(tool, win, hb, ord)
		CROSS JOIN LATERAL (
			SELECT count(*) FILTER (WHERE h.key IS NULL) AS stuck, min(k.claimed_at) FILTER (WHERE h.key IS NULL) AS oldest,
				extract(epoch FROM now() - min(k.claimed_at) FILTER (WHERE h.key IS NULL))::float8 AS age,
				count(h.key) AS held
			FROM idempotency_keys k LEFT JOIN key_holds h ON h.key = k.key
			WHERE k.status = 'processing' AND k.tool = w.tool AND k.claimed_at <= now() - w.win
			  AND (k.heartbeat_at IS NULL OR k.heartbeat_at <= now() - w.hb)
		) s`
	if engine.Citus() {
		q = stuckStatsCitus
	}
	rows, err = db.Query(ctx, q, tools, wins, hbs)
	if err != nil {
		return nil, nil, wrap("count stuck keys", err)
	}
	var (
		ord       int
		stuck     int
		oldest    *time.Time
		age       *float64
		heldStuck int
	)
	_, err = pgx.ForEachRow(rows, []any{&ord, &stuck, &oldest, &age, &heldStuck}, func() error {
		if ord < 1 || ord > len(out) {
			return fmt.Errorf("stuck count for tool number %d of %d", ord, len(out))
		}
		s := &out[ord-1]
		s.Stuck, s.OldestStuckClaimedAt = stuck, oldest // pgx allocates a new *time.Time per row
		s.InWindow = max(s.InWindow-stuck-heldStuck, 0)
		if age != nil {
			s.OldestStuckAgeSeconds = *age
		}
		return nil
	})
	if err != nil {
		return nil, nil, wrap("count stuck keys", err)
	}
	return out, processing, nil
}

// Run is a record of one pass (reconcile, purge, alerts).
type Run struct {
	Kind       string          `json:"kind"`
	Actor      string          `json:"actor"`
	StartedAt  time.Time       `json:"started_at"`
	FinishedAt time.Time       `json:"finished_at"`
	Stats      json.RawMessage `json:"stats"`
	Error      string          `json:"error,omitempty"`
}

// RecordRun stores a pass's summary.
func RecordRun(ctx context.Context, db ledger.DBTX, r Run) error {
	var errText *string
	if r.Error != "" {
		errText = &r.Error
	}
	stats := r.Stats
	if stats == nil {
		stats = json.RawMessage(`{}`)
	}
	_, err := db.Exec(ctx, `INSERT INTO ledgerkeeper_runs (kind, actor, started_at, stats, error) VALUES ($1, $2, $3, $4, $5)`,
		r.Kind, r.Actor, r.StartedAt, string(stats), errText)
	return wrap("record run", err)
}

// LastRuns returns the newest run of each kind.
func LastRuns(ctx context.Context, db ledger.DBTX) ([]Run, error) {
	rows, err := db.Query(ctx, `SELECT DISTINCT ON (kind) kind, actor, started_at, finished_at, stats, coalesce(error, '')
		FROM ledgerkeeper_runs ORDER BY kind, id DESC`)
	if err != nil {
		return nil, wrap("read last runs", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[Run])
	return out, wrap("read last runs", err)
}

// stuckStatsCitus is StuckStats's per-tool count on Citus, which cannot
// push a LATERAL join from a list of tools down to the shards: one
// grouped scan of the processing keys of those tools (the partial index,
// per shard), each row judged against its tool's window by its position
// in the arrays. Same parameters and columns as the PostgreSQL statement.
const stuckStatsCitus = `SELECT array_position($1::text[], k.tool::text)::bigint AS ord,
		count(*) FILTER (WHERE h.key IS NULL) AS stuck, min(k.claimed_at) FILTER (WHERE h.key IS NULL) AS oldest,
		extract(epoch FROM now() - min(k.claimed_at) FILTER (WHERE h.key IS NULL))::float8 AS age,
		count(h.key) AS held
	FROM idempotency_keys k LEFT JOIN key_holds h ON h.key = k.key
	WHERE k.status = 'processing' AND k.tool = ANY($1::text[])
	  AND k.claimed_at <= now() - ($2::interval[])[array_position($1::text[], k.tool::text)]
	  AND (k.heartbeat_at IS NULL OR k.heartbeat_at <= now() - ($3::interval[])[array_position($1::text[], k.tool::text)])
	GROUP BY k.tool`
