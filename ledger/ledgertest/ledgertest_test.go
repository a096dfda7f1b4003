package ledgertest_test

import (
	"context"
	"testing"

	"github.com/ledgerkeeper/ledgerkeeper/ledger/ledgertest"
)

func TestMain(m *testing.M) { ledgertest.Main(m) }

// New's database holds the ledger the mode promises: on PostgreSQL a plain
// table and no Citus; on Citus (LEDGERKEEPER_TEST_CITUS_WORKERS) the table
// distributed by key (hash), its shards on the workers, and a row written
// through the coordinator stored on its key's shard, on a worker.
func TestNewHoldsTheLedgerOfTheMode(t *testing.T) {
	t.Parallel()
	db := ledgertest.New(t)
	ctx := context.Background()
	db.Exec(t, `INSERT INTO idempotency_keys (key, tool, request_hash, expires_at) VALUES ('k-1', 't', 'h', now() + interval '1 day')`)
	if n := db.Count(t, `idempotency_keys WHERE key = 'k-1'`); n != 1 {
		t.Fatalf("rows of k-1: %d, want 1", n)
	}
	if !ledgertest.Citus() {
		var citus bool
		if err := db.Pool.QueryRow(ctx, `SELECT to_regclass('pg_dist_partition') IS NOT NULL`).Scan(&citus); err != nil || citus {
			t.Fatalf("a Citus catalog in a plain PostgreSQL test database (%v)", err)
		}
		return
	}
	var method, column string
	if err := db.Pool.QueryRow(ctx, `SELECT partmethod::text, column_to_column_name(logicalrelid, partkey)
		FROM pg_dist_partition WHERE logicalrelid = 'idempotency_keys'::regclass`).Scan(&method, &column); err != nil {
		t.Fatalf("idempotency_keys is not distributed: %v", err)
	}
	if method != "h" || column != "key" {
		t.Fatalf("idempotency_keys distributed by %s on %q, want by hash on key", method, column)
	}
	var workers, onCoordinator int
	if err := db.Pool.QueryRow(ctx, `SELECT count(DISTINCT nodeport), count(*) FILTER (WHERE nodeport = inet_server_port())
		FROM citus_shards WHERE table_name = 'idempotency_keys'::regclass`).Scan(&workers, &onCoordinator); err != nil {
		t.Fatal(err)
	}
	if workers < 2 || onCoordinator != 0 {
		t.Fatalf("shards on %d nodes, %d of them on the coordinator; want every worker's and none on the coordinator", workers, onCoordinator)
	}
	var shardRows int
	if err := db.Pool.QueryRow(ctx, `SELECT result::int FROM run_command_on_placements('idempotency_keys',
		$$SELECT count(*) FROM %s WHERE key = 'k-1'$$) r
		WHERE r.shardid = get_shard_id_for_distribution_column('idempotency_keys', 'k-1')`).Scan(&shardRows); err != nil {
		t.Fatal(err)
	}
	if shardRows != 1 {
		t.Fatalf("k-1's shard holds %d rows of it, want 1", shardRows)
	}
}
