package main

import (
	"strings"
	"testing"

	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
)

// migrate --distributed lays the ledger out on a Citus coordinator and says
// so (and status shows each table's shape); on PostgreSQL it refuses,
// naming the missing extension, and creates nothing.
func TestMigrateDistributed(t *testing.T) {
	t.Parallel()
	db := pgtest.NewEmpty(t)
	code, out, stderr := cli(t, "migrate", "--distributed", "--database-url", db.URL)
	if !pgtest.Citus() {
		if code == 0 || !strings.Contains(stderr, "citus extension") {
			t.Fatalf("migrate --distributed on PostgreSQL: exit %d, %q; want a refusal naming the citus extension", code, stderr)
		}
		if n := db.Count(t, "pg_tables WHERE schemaname = 'public'"); n != 0 {
			t.Fatalf("%d tables created; want none", n)
		}
		return
	}
	if code != 0 || !strings.Contains(out, "distributed idempotency_keys by key (citus)") {
		t.Fatalf("migrate --distributed on Citus: exit %d\n%s\n%s", code, out, stderr)
	}
	code, out, stderr = cli(t, "migrate", "status", "--database-url", db.URL)
	if code != 0 || !strings.Contains(out, "CITUS SHAPE") || !strings.Contains(out, "reconcile_state") {
		t.Fatalf("migrate status on Citus: exit %d\n%s\n%s", code, out, stderr)
	}
}
