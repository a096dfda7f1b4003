package reconcile

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// A pass that fails because the database cannot be reached is a failed
// pass in reconcile_passes_total, and the series of every result exist from
// the start, so the first failure is an increase.
func TestPassWithTheDatabaseDownIsCountedAsAnError(t *testing.T) {
	t.Parallel()
	// Port 1 on the loopback: nothing listens, the connection is refused
	// at once.
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none?sslmode=disable&connect_timeout=2")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	if n := testutil.CollectAndCount(m.passes, "ledgerkeeper_reconcile_passes_total"); n != 3 {
		t.Fatalf("passes_total has %d series before any pass; want ok, error, stopped", n)
	}
	e := New(Config{Actor: "test-replica", Tools: map[string]Policy{"create_ticket": {}}}, pool, nil, m)
	if _, err := e.Run(context.Background(), Options{}); err == nil {
		t.Fatal("a pass without a database succeeded")
	}
	if got := testutil.ToFloat64(m.passes.WithLabelValues("error")); got != 1 {
		t.Fatalf("passes_total{result=\"error\"} = %v; want 1", got)
	}
}
