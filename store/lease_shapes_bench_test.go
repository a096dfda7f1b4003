package store_test

import (
	"testing"
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
	"github.com/ledgerkeeper/ledgerkeeper/store"
)

// BenchmarkCitusLeaseShapes leases batches of 100 due keys, of a backlog of
// 400 on a Citus ledger, in both of the lease's Citus shapes side by side:
// across-shards (the usual: one read of the candidates across the shards,
// one upsert leasing them) and by-shard (the shape a worker outage forces:
// the candidates read shard by shard through master_run_on_worker, leased
// key by key). The leases are given back between iterations, outside the
// timer. Needs Citus:
//
//	LEDGERKEEPER_TEST_ENGINE=citus go test -run '^$' -bench CitusLeaseShapes -count 3 ./store/
func BenchmarkCitusLeaseShapes(b *testing.B) {
	if !pgtest.Citus() {
		b.Fatal("this benchmark compares the Citus shapes: run it with LEDGERKEEPER_TEST_ENGINE=citus")
	}
	db := pgtest.New(b)
	db.Exec(b, `INSERT INTO idempotency_keys (key, tool, request_hash, created_at, claimed_at, expires_at)
		SELECT 'bench-' || i, 'create_ticket', 'h', now() - interval '1 hour', now() - interval '1 hour', now() + interval '1 day'
		FROM generate_series(1, 400) i`)
	const batch = 100
	for _, shape := range []struct {
		name    string
		byShard bool
	}{{"across-shards", false}, {"by-shard", true}} {
		b.Run(shape.name, func(b *testing.B) {
			defer store.SetLeaseByShard(shape.byShard)()
			p := store.LeaseParams{Tool: "create_ticket", Window: time.Minute, HeartbeatTimeout: time.Minute,
				Limit: batch, Owner: "bench", Lease: time.Minute}
			for range b.N {
				leased, err := store.LeaseDue(ctx, db.Pool, p)
				if err != nil {
					b.Fatal(err)
				}
				if len(leased) != batch {
					b.Fatalf("leased %d keys, want %d", len(leased), batch)
				}
				b.StopTimer()
				if err := store.ReleaseLeases(ctx, db.Pool, keysOf(leased), "bench"); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
			b.ReportMetric(float64(batch*b.N)/b.Elapsed().Seconds(), "keys/s")
		})
	}
}
