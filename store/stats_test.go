package store_test

import (
	"context"
	"fmt"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/store"
)

// countingDB forwards to a real database and counts the statements sent.
type countingDB struct {
	db ledger.DBTX
	n  atomic.Int64
}

func (c *countingDB) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	c.n.Add(1)
	return c.db.Exec(ctx, sql, args...)
}

func (c *countingDB) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	c.n.Add(1)
	return c.db.Query(ctx, sql, args...)
}

func (c *countingDB) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	c.n.Add(1)
	return c.db.QueryRow(ctx, sql, args...)
}

// SendBatch counts a batch as one round trip.
func (c *countingDB) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	c.n.Add(1)
	return c.db.(interface {
		SendBatch(context.Context, *pgx.Batch) pgx.BatchResults
	}).SendBatch(ctx, b)
}

// StuckStats judges every tool by its own windows, and sends the same
// number of statements for 40 tools as for one.
func TestStuckStatsPerToolWindowsInConstantStatements(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	const tools = 40
	window := func(i int) time.Duration { return time.Duration(i+1) * time.Minute }
	// Per tool, against its own window w and a heartbeat timeout of 1m:
	// young (w-30s: in flight), beating (w+1h, heartbeat 10s ago: in
	// flight), old (w+30s: stuck), older (w+10m: stuck), stale (w+2h,
	// heartbeat 2m ago: stuck, the oldest), held (w+30s, on hold: neither),
	// done (completed: not processing).
	for i := range tools {
		tool, w := fmt.Sprintf("t%02d", i), window(i)
		keys := []struct {
			name, status string
			claimed      time.Duration
			beat         *time.Duration
		}{
			{"young", "processing", w - 30*time.Second, nil},
			{"beating", "processing", w + time.Hour, ptr(10 * time.Second)},
			{"old", "processing", w + 30*time.Second, nil},
			{"older", "processing", w + 10*time.Minute, nil},
			{"stale", "processing", w + 2*time.Hour, ptr(2 * time.Minute)},
			{"held", "processing", w + 30*time.Second, nil},
			{"done", "completed", w + time.Hour, nil},
		}
		for _, k := range keys {
			var beat any
			if k.beat != nil {
				beat = *k.beat
			}
			db.Exec(t, `INSERT INTO idempotency_keys (key, tool, request_hash, status, created_at, claimed_at, updated_at, expires_at, heartbeat_at)
				VALUES ($1, $2, 'h', $3, now() - $4::interval, now() - $4::interval, now(), now() + interval '1 day', now() - $5::interval)`,
				tool+"-"+k.name, tool, k.status, k.claimed, beat)
		}
		db.Exec(t, `INSERT INTO key_holds (key, reason, actor) VALUES ($1, 'r', 'op')`, tool+"-held")
	}
	windows := func(tool string) (time.Duration, time.Duration) {
		var i int
		if _, err := fmt.Sscanf(tool, "t%02d", &i); err != nil {
			t.Errorf("windows asked for unknown tool %q", tool)
		}
		return window(i), time.Minute
	}

	cdb := &countingDB{db: db.Pool}
	stats, err := store.StuckStats(context.Background(), cdb, windows)
	if err != nil {
		t.Fatal(err)
	}
	if len(stats) != tools {
		t.Fatalf("%d tools in the stats; want %d", len(stats), tools)
	}
	for i, s := range stats {
		want := window(i) + 2*time.Hour
		if s.Tool != fmt.Sprintf("t%02d", i) || s.Stuck != 3 || s.InWindow != 2 ||
			s.OldestStuckClaimedAt == nil || math.Abs(s.OldestStuckAgeSeconds-want.Seconds()) > 60 {
			t.Errorf("tool %d: %+v; want 3 stuck, 2 in flight, oldest stuck about %v old", i, s, want)
		}
		if i > 0 && s.OldestStuckClaimedAt == stats[i-1].OldestStuckClaimedAt {
			t.Errorf("tools %d and %d share one OldestStuckClaimedAt", i-1, i)
		}
	}
	if n := cdb.n.Load(); n != 2 {
		t.Fatalf("StuckStats sent %d statements for %d tools; want 2 whatever the number of tools", n, tools)
	}

	// No processing key at all: one statement, no tool.
	empty := pgtest.New(t)
	cdb = &countingDB{db: empty.Pool}
	if stats, err := store.StuckStats(context.Background(), cdb, windows); err != nil || len(stats) != 0 || cdb.n.Load() != 1 {
		t.Fatalf("empty ledger: %+v, %v, %d statements", stats, err, cdb.n.Load())
	}
}

func ptr[T any](v T) *T { return &v }

// Statuses reads many keys in one statement; a key not in the ledger is
// absent from the map.
func TestStatuses(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	claim(t, db.Pool, "p", "h")
	claim(t, db.Pool, "c", "h")
	db.Exec(t, `UPDATE idempotency_keys SET status = 'completed' WHERE key = 'c'`)
	cdb := &countingDB{db: db.Pool}
	got, err := store.Statuses(context.Background(), cdb, []string{"p", "c", "gone"})
	if err != nil || len(got) != 2 || got["p"] != ledger.StatusProcessing || got["c"] != ledger.StatusCompleted || cdb.n.Load() != 1 {
		t.Fatalf("Statuses = %v, %v (%d statements)", got, err, cdb.n.Load())
	}
	if got, err := store.Statuses(context.Background(), cdb, nil); err != nil || len(got) != 0 || cdb.n.Load() != 1 {
		t.Fatalf("Statuses(nil) = %v, %v; want nothing, no statement", got, err)
	}
}

// statsFixture fills a ledger with tool "big" (300 completed, 5
// failed_retryable, 2 stuck, 1 in flight, 1 stuck and held) and tool
// "small" (40 completed), and returns the exact counts it holds.
func statsFixture(t *testing.T, db *pgtest.DB) {
	t.Helper()
	db.Exec(t, `INSERT INTO idempotency_keys (key, tool, request_hash, status, created_at, claimed_at, updated_at, expires_at)
		SELECT prefix || g, tool, 'h', status, now() - claimed, now() - claimed, now() - claimed, now() + interval '7 days'
		FROM (VALUES ('big-', 'big', 'completed', 300, interval '1 hour'), ('failed-', 'big', 'failed_retryable', 5, interval '1 hour'),
		             ('small-', 'small', 'completed', 40, interval '1 hour')) v(prefix, tool, status, n, claimed),
		     generate_series(1, v.n) g`)
	db.Exec(t, `INSERT INTO idempotency_keys (key, tool, request_hash, status, created_at, claimed_at, updated_at, expires_at) VALUES
		('stuck-1', 'big', 'h', 'processing', now() - interval '1 hour', now() - interval '1 hour', now(), now() + interval '1 day'),
		('stuck-2', 'big', 'h', 'processing', now() - interval '2 hours', now() - interval '2 hours', now(), now() + interval '1 day'),
		('held-1', 'big', 'h', 'processing', now() - interval '1 hour', now() - interval '1 hour', now(), now() + interval '1 day'),
		('young-1', 'big', 'h', 'processing', now(), now(), now(), now() + interval '1 day')`)
	db.Exec(t, `INSERT INTO key_holds (key, reason, actor) VALUES ('held-1', 'r', 'op')`)
}

var statsWindows = func(string) (time.Duration, time.Duration) { return time.Minute, time.Minute }

func statsOf(t *testing.T, db ledger.DBTX, opts store.StatsOptions) (store.Counts, map[string]store.ToolStats) {
	t.Helper()
	c, err := store.StatsWith(context.Background(), db, statsWindows, opts)
	if err != nil {
		t.Fatal(err)
	}
	by := map[string]store.ToolStats{}
	for _, s := range c.Tools {
		by[s.Tool] = s
	}
	return c, by
}

// The populations an operator acts on are exact, whatever the counting;
// completed is estimated only from statistics PostgreSQL has gathered: a
// never-analyzed table (reltuples -1, as in every fresh test database) is
// counted, and so is one --exact asks for.
func TestStatsEstimatesOnlyFromGatheredStatistics(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	statsFixture(t, db)
	exactBig := store.ToolStats{Tool: "big", InWindow: 1, Stuck: 2, FailedRetryable: 5, Completed: 300, Held: 1}
	check := func(name string, got store.ToolStats, want store.ToolStats, estimated bool) {
		t.Helper()
		if got.InWindow != want.InWindow || got.Stuck != want.Stuck || got.FailedRetryable != want.FailedRetryable ||
			got.Held != want.Held || got.CompletedEstimated != estimated {
			t.Errorf("%s: %s = %+v; want %+v, completed estimated %v", name, want.Tool, got, want, estimated)
		}
		if !estimated && got.Completed != want.Completed {
			t.Errorf("%s: %s completed = %d, want exactly %d", name, want.Tool, got.Completed, want.Completed)
		}
		if estimated && math.Abs(float64(got.Completed-want.Completed)) > 0.05*float64(want.Completed) {
			t.Errorf("%s: %s completed = ~%d, want about %d", name, want.Tool, got.Completed, want.Completed)
		}
	}
	// Never analyzed: exact, whatever ExactBelow.
	c, by := statsOf(t, db.Pool, store.StatsOptions{ExactBelow: 1})
	if c.Estimated || c.EstimatedKeys != -1 || c.AnalyzedAt != nil {
		t.Fatalf("never analyzed: %+v; want exact counts, EstimatedKeys -1", c)
	}
	check("never analyzed", by["big"], exactBig, false)
	check("never analyzed", by["small"], store.ToolStats{Tool: "small", Completed: 40}, false)

	db.Exec(t, `ANALYZE idempotency_keys`)
	c, by = statsOf(t, db.Pool, store.StatsOptions{ExactBelow: 1, ExactToolRows: 1})
	if pgtest.Citus() {
		// No statistics on the coordinator's table: exact, as never analyzed.
		if c.Estimated {
			t.Fatalf("analyzed, on Citus: %+v; want exact counts", c)
		}
		check("analyzed, on Citus", by["big"], exactBig, false)
		check("analyzed, on Citus", by["small"], store.ToolStats{Tool: "small", Completed: 40}, false)
		return
	}
	if !c.Estimated || c.AnalyzedAt == nil || c.EstimatedKeys < 340 || c.EstimatedKeys > 360 {
		t.Fatalf("analyzed: %+v; want estimates, about 349 keys", c)
	}
	check("analyzed", by["big"], exactBig, true)
	check("analyzed", by["small"], store.ToolStats{Tool: "small", Completed: 40}, true)

	// The default threshold counts a table this small exactly.
	c, by = statsOf(t, db.Pool, store.StatsOptions{})
	if c.Estimated {
		t.Fatalf("349 rows under the default ExactBelow: %+v", c)
	}
	check("default", by["big"], exactBig, false)
	// So does Exact.
	c, by = statsOf(t, db.Pool, store.StatsOptions{Exact: true, ExactBelow: 1})
	if c.Estimated {
		t.Fatalf("Exact: %+v", c)
	}
	check("exact", by["big"], exactBig, false)
	// Stats (what `status` ran before StatsWith) is StatsWith's default.
	stats, err := store.Stats(context.Background(), db.Pool, statsWindows)
	if err != nil || len(stats) != 2 || stats[0].Completed != 300 || stats[0].CompletedEstimated || stats[1].Completed != 40 {
		t.Fatalf("Stats = %+v, %v", stats, err)
	}
}

// After the statistics were gathered, what changes is still seen: new
// failed_retryable, processing and held keys are counted exactly (their
// own indexes), a tool the sample never saw is counted exactly, the
// smallest tools are counted exactly up to ExactBelow rows in all, and a
// tool's completed estimate is its share of the table less its exact
// keys of other statuses.
func TestStatsExactPopulationsAfterAnalyze(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	statsFixture(t, db)
	db.Exec(t, `ANALYZE idempotency_keys`)
	db.Exec(t, `UPDATE idempotency_keys SET status = 'failed_retryable' WHERE key IN ('big-1', 'big-2', 'big-3', 'big-4', 'big-5', 'big-6', 'big-7', 'big-8', 'big-9', 'big-10')`)
	db.Exec(t, `UPDATE idempotency_keys SET status = 'processing', claimed_at = now() - interval '1 hour' WHERE key IN ('big-11', 'big-12')`)
	db.Exec(t, `INSERT INTO key_holds (key, reason, actor) VALUES ('big-11', 'r', 'op'), ('small-1', 'r', 'op')`)
	db.Exec(t, `INSERT INTO idempotency_keys (key, tool, request_hash, status, expires_at)
		SELECT 'new-' || g, 'new_tool', 'h', 'completed', now() + interval '1 day' FROM generate_series(1, 7) g`)

	c, by := statsOf(t, db.Pool, store.StatsOptions{ExactBelow: 1, ExactToolRows: 1})
	if pgtest.Citus() {
		// The coordinator's table has no statistics of its shards' rows:
		// on Citus status counts everything exactly.
		if c.Estimated || by["big"].Completed != 288 || by["big"].FailedRetryable != 15 || by["big"].Held != 2 {
			t.Fatalf("on Citus: %+v; want exact counts (288 completed, 15 failed_retryable, 2 held for big)", c)
		}
		return
	}
	if !c.Estimated {
		t.Fatalf("no estimate: %+v", c)
	}
	big := by["big"]
	if big.FailedRetryable != 15 || big.Stuck != 3 || big.InWindow != 1 || big.Held != 2 || !big.CompletedEstimated {
		t.Errorf("big = %+v; want exactly 15 failed_retryable, 3 stuck, 1 in flight, 2 held, completed estimated", big)
	}
	// Its share of the analyzed table is 310 rows; less 15 failed and 5
	// processing: 290 (the truth is 288: 300 less 10 failed, 2 processing).
	if big.Completed < 280 || big.Completed > 300 {
		t.Errorf("big completed = ~%d; want about 288", big.Completed)
	}
	if n := by["new_tool"]; n.Completed != 7 || n.CompletedEstimated {
		t.Errorf("new_tool (not in the statistics) = %+v; want exactly 7 completed", n)
	}
	if s := by["small"]; s.Held != 1 || !s.CompletedEstimated {
		t.Errorf("small = %+v; want 1 held, completed estimated with ExactToolRows 1", s)
	}
	// ExactToolRows 100: "small" (about 40 rows) fits under it and is
	// counted; "big" (about 310) does not.
	_, by = statsOf(t, db.Pool, store.StatsOptions{ExactBelow: 1, ExactToolRows: 100})
	if s := by["small"]; s.Completed != 40 || s.CompletedEstimated {
		t.Errorf("small under ExactToolRows 100 = %+v; want exactly 40", s)
	}
	if !by["big"].CompletedEstimated {
		t.Errorf("big under ExactToolRows 100 = %+v; want estimated", by["big"])
	}
}

// ProcessingP99 reads a bounded sample spread over the look-back: keys
// the tool side completed itself, first claimed within it; at most
// p99PerSlice (40) keys of each slice (2 minutes of an hour).
func TestProcessingP99SamplesTheLookBack(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	insert := func(prefix string, n int, created, took time.Duration, status string) {
		t.Helper()
		db.Exec(t, `INSERT INTO idempotency_keys (key, tool, request_hash, status, created_at, claimed_at, updated_at, expires_at)
			SELECT $1 || g, 'create_ticket', 'h', $2, now() - $3::interval + g * interval '1 millisecond',
			       now() - $3::interval + g * interval '1 millisecond', now() - $3::interval + g * interval '1 millisecond' + $4::interval,
			       now() + interval '1 day'
			FROM generate_series(1, $5::int) g`, prefix, status, created, took, n)
	}
	// 150 fast keys in one slice, 30m20s ago: 40 are read.
	insert("burst-", 150, 30*time.Minute+20*time.Second, time.Second, "completed")
	// 5 slow keys, one each in other slices.
	for i := range 5 {
		insert(fmt.Sprintf("slow%d-", i), 1, time.Duration(5+10*i)*time.Minute+20*time.Second, 20*time.Second, "completed")
	}
	// Left out: claimed before the look-back, still processing, and
	// completed by the reconciler (its reconcile_state has the claim).
	insert("old-", 3, 2*time.Hour, 500*time.Second, "completed")
	insert("open-", 3, 40*time.Minute+20*time.Second, 0, "processing")
	insert("repaired-", 3, 50*time.Minute+20*time.Second, 500*time.Second, "completed")
	db.Exec(t, `INSERT INTO reconcile_state (key, tool, claimed_at) SELECT key, tool, claimed_at FROM idempotency_keys WHERE key LIKE 'repaired-%'`)

	cdb := &countingDB{db: db.Pool}
	lat, err := store.ProcessingP99(context.Background(), cdb, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	// Sorted: 40 × 1s, 5 × 20s; the p99's position 0.99 × 44 falls
	// among the 20s.
	if len(lat) != 1 || lat[0].Tool != "create_ticket" || lat[0].Samples != 45 || math.Abs(lat[0].P99Seconds-20) > 0.01 {
		t.Fatalf("ProcessingP99 = %+v; want create_ticket, 45 samples, p99 20s", lat)
	}
	// On Citus: the tools, then the slices' reads in one batch.
	want := int64(1)
	if pgtest.Citus() {
		want = 2
	}
	if n := cdb.n.Load(); n != want {
		t.Fatalf("ProcessingP99 sent %d statements; want %d", n, want)
	}
}
