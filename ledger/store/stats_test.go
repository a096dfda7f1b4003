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
	"github.com/ledgerkeeper/ledgerkeeper/ledger/store"
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
