package store

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerkeeper/ledgerkeeper/internal/engine"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
)

// Defaults of StatsOptions. A ledger the planner estimates at fewer than
// DefaultExactBelow rows is counted exactly (a sequential scan of 100,000
// rows takes tens of milliseconds); above it, the smallest tools are still
// counted while their rows add up to fewer than DefaultExactToolRows
// (through the (tool, created_at) index, one random heap read per row:
// 10,000 of them take tens of milliseconds too).
const (
	DefaultExactBelow    = 100_000
	DefaultExactToolRows = 10_000
)

// StatsOptions says how StatsWith counts.
type StatsOptions struct {
	// Exact counts every row of every status (`status --exact`): a scan
	// of the whole table, seconds on tens of millions of keys.
	Exact bool
	// ExactBelow is the estimated number of rows below which the whole
	// table is counted exactly. Default DefaultExactBelow.
	ExactBelow int64
	// ExactToolRows: above ExactBelow, the smallest tools are still
	// counted exactly while their estimated rows add up to fewer than
	// this. Default DefaultExactToolRows.
	ExactToolRows int64
}

// Counts is what StatsWith found, and how.
type Counts struct {
	// Tools are the tools' lines, sorted by tool.
	Tools []ToolStats
	// Estimated: at least one tool's Completed is an estimate
	// (ToolStats.CompletedEstimated); every other figure is exact.
	Estimated bool
	// AnalyzedAt is when PostgreSQL last gathered idempotency_keys'
	// statistics (ANALYZE or autovacuum), nil if never or not known.
	AnalyzedAt *time.Time
	// EstimatedKeys is the planner's estimate of the table's rows now
	// (its rows per page at the last ANALYZE times its pages now); -1
	// when the table was never analyzed.
	EstimatedKeys int64
}

// plannerStats is what PostgreSQL knows of idempotency_keys without
// reading it: the row estimate and the tool column's most common values
// with their frequencies (pg_stats, from the last ANALYZE's sample).
type plannerStats struct {
	rows       int64
	freq       map[string]float64
	analyzedAt *time.Time
}

// readPlannerStats reads pg_class (reltuples, relpages), the table's size
// now, the tool column's MCV list from pg_stats and the last analyze time:
// catalog reads, whatever the table's size. The row estimate scales the
// last ANALYZE's rows per page to the pages the table has now, as the
// planner does, so rows added since are counted.
func readPlannerStats(ctx context.Context, db ledger.DBTX) (plannerStats, error) {
	var (
		reltuples    float64
		relpages     int64
		pagesNow     int64
		vals         []string
		freqs        []float64
		analyzedAt   *time.Time
		autoAnalyzed *time.Time
	)
	err := db.QueryRow(ctx, `SELECT c.reltuples::float8, c.relpages::bigint,
			pg_relation_size(c.oid) / current_setting('block_size')::bigint,
			s.most_common_vals::text::text[], s.most_common_freqs::float8[],
			t.last_analyze, t.last_autoanalyze
		FROM pg_class c
		JOIN pg_namespace n ON n.oid = c.relnamespace
		LEFT JOIN pg_stats s ON s.schemaname = n.nspname AND s.tablename = c.relname AND s.attname = 'tool' AND NOT s.inherited
		LEFT JOIN pg_stat_all_tables t ON t.relid = c.oid
		WHERE c.oid = 'idempotency_keys'::regclass`).Scan(&reltuples, &relpages, &pagesNow, &vals, &freqs, &analyzedAt, &autoAnalyzed)
	if err != nil {
		return plannerStats{}, wrap("read planner statistics", err)
	}
	ps := plannerStats{rows: -1, analyzedAt: analyzedAt}
	if autoAnalyzed != nil && (analyzedAt == nil || autoAnalyzed.After(*analyzedAt)) {
		ps.analyzedAt = autoAnalyzed
	}
	switch {
	case reltuples < 0: // never vacuumed nor analyzed (PostgreSQL 14+)
	case relpages > 0:
		ps.rows = int64(math.Round(reltuples / float64(relpages) * float64(pagesNow)))
	default:
		ps.rows = int64(reltuples)
	}
	if len(vals) == len(freqs) && len(vals) > 0 {
		ps.freq = make(map[string]float64, len(vals))
		for i, v := range vals {
			ps.freq[v] = freqs[i]
		}
	}
	return ps, nil
}

// distinctTools lists the ledger's tools exactly without reading its rows:
// a skip scan of idempotency_keys_tool_created_idx, one index descent per
// tool (PostgreSQL 15 has no skip scan of its own; this is the recursive
// form of it).
//
// Citus runs a recursive CTE only within one shard: there (distinctTools
// when engine.Citus()) each shard lists its own tools, a scan of its part
// of the index rather than one descent per tool.
func distinctTools() string {
	if engine.Citus() {
		return `WITH tools(tool) AS (SELECT DISTINCT tool FROM idempotency_keys)`
	}
	return distinctToolsSkipScan
}

const distinctToolsSkipScan = `WITH RECURSIVE tools(tool) AS (
		SELECT min(tool) FROM idempotency_keys
		UNION ALL
		SELECT (SELECT min(k.tool) FROM idempotency_keys k WHERE k.tool > t.tool) FROM tools t WHERE t.tool IS NOT NULL
	)`

// StatsWith counts keys per tool for `ledgerkeeper status`. The figures an
// operator acts on are exact whatever the ledger's size, each from an
// index that holds only its own population: processing, in flight, stuck
// and the oldest stuck (idempotency_keys_processing_idx), failed_retryable
// (idempotency_keys_failed_retryable_idx), held (key_holds), and the list
// of tools (a skip scan). Completed, most of the table, is estimated from
// the planner's statistics when the table is large (opts.ExactBelow):
// the tool's share of the table in pg_stats times the table's estimated
// rows, less its exact processing and failed_retryable keys; those tools
// are marked CompletedEstimated. A small or never-analyzed table, a tool
// the last ANALYZE did not see, the smallest tools (opts.ExactToolRows),
// and opts.Exact are counted exactly.
func StatsWith(ctx context.Context, db ledger.DBTX, windows Windows, opts StatsOptions) (Counts, error) {
	engine.Ensure(ctx, db)
	below := cmp.Or(opts.ExactBelow, DefaultExactBelow)
	ps, err := readPlannerStats(ctx, db)
	if err != nil {
		return Counts{}, err
	}
	c := Counts{AnalyzedAt: ps.analyzedAt, EstimatedKeys: ps.rows}
	if opts.Exact || ps.rows < below || ps.freq == nil {
		c.Tools, err = exactStats(ctx, db, windows)
		return c, err
	}
	rows, err := db.Query(ctx, distinctTools()+` SELECT tool FROM tools WHERE tool IS NOT NULL`)
	if err != nil {
		return Counts{}, wrap("list tools", err)
	}
	tools, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return Counts{}, wrap("list tools", err)
	}
	byTool := make(map[string]*ToolStats, len(tools))
	for _, t := range tools {
		byTool[t] = &ToolStats{Tool: t}
	}
	get := func(tool string) *ToolStats { // a key claimed since the tools were listed
		s, ok := byTool[tool]
		if !ok {
			s = &ToolStats{Tool: tool}
			byTool[tool] = s
		}
		return s
	}
	stuck, processing, err := stuckStats(ctx, db, windows)
	if err != nil {
		return Counts{}, err
	}
	for _, st := range stuck {
		s := get(st.Tool)
		s.InWindow, s.Stuck, s.OldestStuckClaimedAt, s.OldestStuckAgeSeconds = st.InWindow, st.Stuck, st.OldestStuckClaimedAt, st.OldestStuckAgeSeconds
	}
	failed := map[string]int{}
	if err := countByTool(ctx, db, "count failed_retryable keys",
		`SELECT tool, count(*) FROM idempotency_keys WHERE status = 'failed_retryable' GROUP BY tool`, nil, func(tool string, n int) {
			get(tool).FailedRetryable = n
			failed[tool] = n
		}); err != nil {
		return Counts{}, err
	}
	if err := countHolds(ctx, db, get); err != nil {
		return Counts{}, err
	}
	// Exact for the tools the sample did not see (new or rare) and for
	// the smallest, while they add up to fewer than ExactToolRows; the
	// others' completed keys are their share of the table less what is
	// counted exactly.
	type share struct {
		tool string
		rows float64
	}
	var seen []share
	var exact []string
	for t := range byTool {
		if f, ok := ps.freq[t]; ok {
			seen = append(seen, share{t, f * float64(ps.rows)})
		} else {
			exact = append(exact, t)
		}
	}
	slices.SortFunc(seen, func(a, b share) int { return cmp.Or(cmp.Compare(a.rows, b.rows), cmp.Compare(a.tool, b.tool)) })
	budget := float64(cmp.Or(opts.ExactToolRows, DefaultExactToolRows))
	for _, sh := range seen {
		if sh.rows < budget {
			budget -= sh.rows
			exact = append(exact, sh.tool)
			continue
		}
		budget = 0
		s := byTool[sh.tool]
		s.Completed = max(int(math.Round(sh.rows))-processing[sh.tool]-failed[sh.tool], 0)
		s.CompletedEstimated = true
		c.Estimated = true
	}
	if len(exact) > 0 {
		if err := countByTool(ctx, db, "count completed keys",
			`SELECT tool, count(*) FROM idempotency_keys WHERE tool = ANY($1) AND status = 'completed' GROUP BY tool`, []any{exact}, func(tool string, n int) {
				get(tool).Completed = n
			}); err != nil {
			return Counts{}, err
		}
	}
	c.Tools = sortedStats(byTool)
	return c, nil
}

// countByTool runs q, which returns (tool, count) rows, and hands each to
// set.
func countByTool(ctx context.Context, db ledger.DBTX, op, q string, args []any, set func(tool string, n int)) error {
	rows, err := db.Query(ctx, q, args...)
	if err != nil {
		return wrap(op, err)
	}
	var tool string
	var n int
	_, err = pgx.ForEachRow(rows, []any{&tool, &n}, func() error {
		set(tool, n)
		return nil
	})
	return wrap(op, err)
}

// countHolds sets each tool's Held: key_holds is small, and each hold's
// key is found by primary key.
func countHolds(ctx context.Context, db ledger.DBTX, get func(string) *ToolStats) error {
	return countByTool(ctx, db, "count holds",
		`SELECT k.tool, count(*) FROM key_holds h JOIN idempotency_keys k USING (key) GROUP BY k.tool`, nil, func(tool string, n int) {
			get(tool).Held = n
		})
}

func sortedStats(byTool map[string]*ToolStats) []ToolStats {
	out := make([]ToolStats, 0, len(byTool))
	for _, s := range byTool {
		out = append(out, *s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Tool < out[j].Tool })
	return out
}

// LedgerTools lists the tools that have keys in the ledger, sorted, by the
// same skip scan as StatsWith (one index descent per tool): `reconcile
// --tool` tells a tool with keys but no configuration from a typo.
func LedgerTools(ctx context.Context, db ledger.DBTX) ([]string, error) {
	engine.Ensure(ctx, db)
	rows, err := db.Query(ctx, distinctTools()+` SELECT tool FROM tools WHERE tool IS NOT NULL ORDER BY tool`)
	if err != nil {
		return nil, fmt.Errorf("list the ledger's tools: %w", err)
	}
	tools, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("list the ledger's tools: %w", err)
	}
	return tools, nil
}
