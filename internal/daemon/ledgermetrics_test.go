package daemon

import (
	"context"
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
		{"held", testutil.ToFloat64(m.held), 1},
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
