package daemon

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
)

func TestLedgerMetrics(t *testing.T) {
	db := pgtest.New(t)
	db.Exec(t, `INSERT INTO idempotency_keys (key, tool, request_hash, claimed_at, expires_at)
		SELECT 'k' || g, 'create_ticket', 'h', now() - (g || ' minutes')::interval, now() + interval '1 day' FROM generate_series(0, 4) g`)
	db.Exec(t, `INSERT INTO key_holds (key, reason, actor) VALUES ('k4', 'r', 'op')`)
	db.Exec(t, `INSERT INTO tool_breakers (tool, opens, open_until) VALUES ('charge_card', 1, now() + interval '1 hour')`)
	reg := prometheus.NewRegistry()
	m := NewLedgerMetrics(reg)
	windows := func(string) (time.Duration, time.Duration) { return 90 * time.Second, 90 * time.Second }
	if err := m.Update(context.Background(), db.Pool, windows, []string{"create_ticket", "charge_card", "idle_tool"}); err != nil {
		t.Fatal(err)
	}
	// k0, k1 are inside 90s; k2, k3 stuck; k4 stuck but held.
	for _, c := range []struct {
		name string
		got  float64
		want float64
	}{
		{"stuck", testutil.ToFloat64(m.stuck.WithLabelValues("create_ticket")), 2},
		{"in flight", testutil.ToFloat64(m.inFlight.WithLabelValues("create_ticket")), 2},
		{"idle tool stuck", testutil.ToFloat64(m.stuck.WithLabelValues("idle_tool")), 0},
		{"held", testutil.ToFloat64(m.held.WithLabelValues("create_ticket")), 1},
		{"idle tool held", testutil.ToFloat64(m.held.WithLabelValues("idle_tool")), 0},
		{"breaker open", testutil.ToFloat64(m.breakerOpen.WithLabelValues("charge_card")), 1},
		{"breaker closed", testutil.ToFloat64(m.breakerOpen.WithLabelValues("create_ticket")), 0},
		{"up", testutil.ToFloat64(m.up), 1},
	} {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
	if age := testutil.ToFloat64(m.oldestStuck.WithLabelValues("create_ticket")); age < 170 || age > 400 {
		t.Errorf("oldest stuck age = %v, want about 180s", age)
	}
	// The database goes away: up drops to 0.
	db.Exec(t, `ALTER TABLE idempotency_keys RENAME TO gone`)
	if err := m.Update(context.Background(), db.Pool, windows, nil); err == nil {
		t.Fatal("no error without the table")
	}
	if got := testutil.ToFloat64(m.up); got != 0 {
		t.Fatalf("up = %v", got)
	}
}

// Holds are gauged per tool: how many and the oldest's age, configured
// tools at 0, holds on keys gone from the ledger under tool="", and a tool
// whose holds are released back at 0 (not a vanished series, which an
// alert rule would read as "no data").
func TestLedgerMetricsHolds(t *testing.T) {
	db := pgtest.New(t)
	db.Exec(t, `INSERT INTO idempotency_keys (key, tool, request_hash, claimed_at, expires_at) VALUES
		('t1', 'create_ticket', 'h', now() - interval '2 days', now() + interval '3 days'),
		('t2', 'create_ticket', 'h', now() - interval '2 days', now() + interval '3 days'),
		('c1', 'charge_card', 'h', now() - interval '2 days', now() + interval '3 days')`)
	db.Exec(t, `INSERT INTO key_holds (key, reason, actor, created_at) VALUES
		('t1', 'r', 'alice', now() - interval '25 hours'),
		('t2', 'r', 'alice', now() - interval '1 hour'),
		('c1', 'r', 'bob', now() - interval '5 minutes'),
		('deleted-by-hand', 'r', 'bob', now() - interval '3 days')`)
	reg := prometheus.NewRegistry()
	m := NewLedgerMetrics(reg)
	windows := func(string) (time.Duration, time.Duration) { return 90 * time.Second, 90 * time.Second }
	update := func() {
		t.Helper()
		if err := m.Update(context.Background(), db.Pool, windows, []string{"create_ticket", "charge_card", "idle_tool"}); err != nil {
			t.Fatal(err)
		}
	}
	update()
	for _, c := range []struct {
		tool      string
		held, age float64
	}{
		{"create_ticket", 2, 25 * 3600},
		{"charge_card", 1, 300},
		{"", 1, 3 * 86400},
		{"idle_tool", 0, 0},
	} {
		if got := testutil.ToFloat64(m.held.WithLabelValues(c.tool)); got != c.held {
			t.Errorf("keys_held{tool=%q} = %v, want %v", c.tool, got, c.held)
		}
		if got := testutil.ToFloat64(m.oldestHold.WithLabelValues(c.tool)); math.Abs(got-c.age) > 60 {
			t.Errorf("keys_oldest_hold_age_seconds{tool=%q} = %v, want about %v", c.tool, got, c.age)
		}
	}

	// Released: the series stay, at 0.
	db.Exec(t, `DELETE FROM key_holds WHERE key IN ('t1', 'deleted-by-hand')`)
	update()
	if got := testutil.ToFloat64(m.oldestHold.WithLabelValues("create_ticket")); math.Abs(got-3600) > 60 {
		t.Errorf("oldest hold of create_ticket after releasing the oldest = %v, want about 3600", got)
	}
	const want = `
# HELP ledgerkeeper_keys_held Keys on hold, by tool (tool="": holds on keys no longer in the ledger).
# TYPE ledgerkeeper_keys_held gauge
ledgerkeeper_keys_held{tool=""} 0
ledgerkeeper_keys_held{tool="charge_card"} 1
ledgerkeeper_keys_held{tool="create_ticket"} 1
ledgerkeeper_keys_held{tool="idle_tool"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "ledgerkeeper_keys_held"); err != nil {
		t.Error(err)
	}
	if got := testutil.ToFloat64(m.oldestHold.WithLabelValues("")); got != 0 {
		t.Errorf("oldest orphan hold age after its release = %v, want 0", got)
	}
}

// The p99 gauge is the tool side's own processing time of keys first
// claimed within the hour: older keys and keys the reconciler completed
// are left out.
func TestLedgerMetricsP99(t *testing.T) {
	db := pgtest.New(t)
	db.Exec(t, `INSERT INTO idempotency_keys (key, tool, request_hash, status, created_at, claimed_at, updated_at, expires_at)
		SELECT 'fast' || g, 'create_ticket', 'h', 'completed', now() - g * interval '1 minute', now() - g * interval '1 minute',
		       now() - g * interval '1 minute' + interval '2 seconds', now() + interval '1 day'
		FROM generate_series(1, 50) g`)
	db.Exec(t, `INSERT INTO idempotency_keys (key, tool, request_hash, status, created_at, claimed_at, updated_at, expires_at) VALUES
		('old', 'create_ticket', 'h', 'completed', now() - interval '3 hours', now() - interval '3 hours', now() - interval '1 hour', now() + interval '1 day'),
		('repaired', 'create_ticket', 'h', 'completed', now() - interval '30 minutes', now() - interval '30 minutes', now(), now() + interval '1 day')`)
	db.Exec(t, `INSERT INTO reconcile_state (key, tool, claimed_at) SELECT key, tool, claimed_at FROM idempotency_keys WHERE key = 'repaired'`)
	reg := prometheus.NewRegistry()
	m := NewLedgerMetrics(reg)
	windows := func(string) (time.Duration, time.Duration) { return 90 * time.Second, 90 * time.Second }
	if err := m.Update(context.Background(), db.Pool, windows, []string{"create_ticket"}); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(m.p99.WithLabelValues("create_ticket")); math.Abs(got-2) > 0.01 {
		t.Fatalf("p99 = %v, want 2s (the old and the repaired keys left out)", got)
	}
}
