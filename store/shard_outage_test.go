package store_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerkeeper/ledgerkeeper/internal/citustest"
	"github.com/ledgerkeeper/ledgerkeeper/internal/engine"
	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
	"github.com/ledgerkeeper/ledgerkeeper/migrations"
	"github.com/ledgerkeeper/ledgerkeeper/store"
)

// With one Citus worker stopped, each read that finds work (the tools with
// processing keys, the due keys, the self-check's samples, the expired
// processing keys, the purge's batch) returns what the other worker's
// shards hold and a *ShardsUnreachableError naming the stopped worker and
// its shards; what follows the read (the lease's compare-and-set, the
// purge's DELETE) touches only the keys read. Nothing of the stopped
// worker's keys changes. Runs a cluster of its own (stopping a worker of
// the shared one would fail every other test), in the ordinary run too.
func TestReadsThatFindWorkSkipTheShardsOfAStoppedWorker(t *testing.T) {
	// Not parallel: the store's shapes are chosen per process.
	was := engine.Citus()
	t.Cleanup(func() { engine.SetCitus(was) })
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	c, err := citustest.Start(ctx)
	if err != nil {
		t.Fatalf("no Citus cluster for the test: %v", err)
	}
	t.Cleanup(c.Stop)
	const name = "ledgerkeeper_shard_outage"
	if err := c.CreateDatabase(ctx, name, ""); err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, citustest.WithDatabase(c.Coordinator.URL, name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := migrations.Up(ctx, pool, nil); err != nil {
		t.Fatal(err)
	}
	engine.SetCitus(true)
	db := &pgtest.DB{Pool: pool, Name: name}
	live, down := c.Workers[0], c.Workers[1]

	// On each worker: 3 stuck keys, 2 completed keys (self-check
	// samples), 2 expired completed keys, 1 expired processing key.
	keys := map[int]map[string][]string{}
	for _, w := range c.Workers {
		on := func(kind string, n int) []string {
			return keysOnWorker(t, pool, w.Port, fmt.Sprintf("%s-%d", kind, w.Port), n)
		}
		keys[w.Port] = map[string][]string{
			"stuck": on("stuck", 3), "done": on("done", 2), "expired": on("expired", 2), "expired-processing": on("xp", 1),
			"held-stuck": on("held-stuck", 1), "held-expired": on("held-expired", 1),
		}
		db.Exec(t, `INSERT INTO idempotency_keys (key, tool, request_hash, created_at, claimed_at, expires_at)
			SELECT k, 'create_ticket', 'h', now() - interval '1 hour', now() - interval '1 hour', now() + interval '1 day'
			FROM unnest($1::text[]) k`, keys[w.Port]["stuck"])
		db.Exec(t, `INSERT INTO idempotency_keys (key, tool, request_hash, status, response_code, response_body, created_at, claimed_at, expires_at)
			SELECT k, 'create_ticket', 'h', 'completed', 201, '{}', now() - interval '1 minute', now() - interval '1 minute', now() + interval '1 day'
			FROM unnest($1::text[]) k`, keys[w.Port]["done"])
		db.Exec(t, `INSERT INTO idempotency_keys (key, tool, request_hash, status, response_code, response_body, created_at, claimed_at, expires_at)
			SELECT k, 'create_ticket', 'h', 'completed', 201, '{}', now() - interval '2 days', now() - interval '2 days', now() - interval '1 hour'
			FROM unnest($1::text[]) k`, keys[w.Port]["expired"])
		db.Exec(t, `INSERT INTO idempotency_keys (key, tool, request_hash, created_at, claimed_at, expires_at)
			SELECT k, 'charge_card', 'h', now() - interval '2 days', now() - interval '2 days', now() - interval '1 hour'
			FROM unnest($1::text[]) k`, keys[w.Port]["expired-processing"])
		// On hold: neither leased nor purged, whatever the shape.
		db.Exec(t, `INSERT INTO idempotency_keys (key, tool, request_hash, created_at, claimed_at, expires_at)
			VALUES ($1, 'create_ticket', 'h', now() - interval '1 hour', now() - interval '1 hour', now() + interval '1 day')`, keys[w.Port]["held-stuck"][0])
		db.Exec(t, `INSERT INTO idempotency_keys (key, tool, request_hash, status, response_code, response_body, created_at, claimed_at, expires_at)
			VALUES ($1, 'create_ticket', 'h', 'completed', 201, '{}', now() - interval '2 days', now() - interval '2 days', now() - interval '1 hour')`, keys[w.Port]["held-expired"][0])
		for _, k := range []string{keys[w.Port]["held-stuck"][0], keys[w.Port]["held-expired"][0]} {
			if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return store.PutHold(ctx, tx, k, "looking", "alice") }); err != nil {
				t.Fatal(err)
			}
		}
	}
	var downShards []int64
	if err := pool.QueryRow(ctx, `SELECT array_agg(p.shardid ORDER BY p.shardid)
		FROM pg_dist_placement p JOIN pg_dist_node n ON n.groupid = p.groupid
		JOIN pg_dist_shard s ON s.shardid = p.shardid
		WHERE s.logicalrelid = 'idempotency_keys'::regclass AND n.nodeport = $1`, down.Port).Scan(&downShards); err != nil {
		t.Fatal(err)
	}
	if err := c.StopNode(down); err != nil {
		t.Fatal(err)
	}
	downNode := fmt.Sprintf("127.0.0.1:%d", down.Port)
	// partialOf fails the test unless err names exactly the stopped
	// worker's shards.
	partialOf := func(what string, err error) {
		t.Helper()
		e, ok := store.AsShardsUnreachable(err)
		if !ok {
			t.Fatalf("%s: want the stopped worker's shards reported as unreachable, got %v", what, err)
		}
		if nodes := e.Nodes(); len(nodes) != 1 || !slices.Equal(e.ShardsOn(nodes[0]), downShards) {
			t.Fatalf("%s: unreachable %v (%v); want shards %v of %s", what, nodes, e.Faults, downShards, downNode)
		}
	}

	health, err := store.CheckShards(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range health {
		wantUp := h.Node != downNode
		if h.Reachable != wantUp {
			t.Errorf("CheckShards: %s reachable %v, want %v (%+v)", h.Node, h.Reachable, wantUp, health)
		}
	}
	if len(health) != 2 {
		t.Errorf("CheckShards: %d workers, want 2 (%+v)", len(health), health)
	}

	tools, err := store.ProcessingTools(ctx, pool)
	partialOf("ProcessingTools", err)
	if !slices.Equal(tools, []string{"charge_card", "create_ticket"}) {
		t.Errorf("ProcessingTools: %v, want the live worker's tools", tools)
	}

	leased, _, err := store.LeaseDueDrained(ctx, pool, store.LeaseParams{Tool: "create_ticket", Window: time.Minute, HeartbeatTimeout: time.Minute,
		Limit: 10, Owner: "r1", Lease: time.Minute})
	partialOf("LeaseDueDrained", err)
	if got := keysOf(leased); !slices.Equal(got, sorted(keys[live.Port]["stuck"])) {
		t.Errorf("leased %v, want the live worker's stuck keys %v", got, keys[live.Port]["stuck"])
	}

	// Renewing and giving back the leases: key by key, the stopped
	// worker's keys left out.
	all := append(keysOf(leased), keys[down.Port]["stuck"]...)
	renewed, err := store.ExtendLeases(ctx, pool, all, "r1", 2*time.Minute)
	if err != nil {
		t.Fatalf("ExtendLeases with a worker down: %v", err)
	}
	if slices.Sort(renewed); !slices.Equal(renewed, sorted(keys[live.Port]["stuck"])) {
		t.Errorf("renewed %v, want the live worker's leased keys", renewed)
	}
	if err := store.ReleaseLeases(ctx, pool, all, "r1"); err != nil {
		t.Fatalf("ReleaseLeases with a worker down: %v", err)
	}
	again, _, err := store.LeaseDueDrained(ctx, pool, store.LeaseParams{Tool: "create_ticket", Window: time.Minute, HeartbeatTimeout: time.Minute,
		Limit: 10, Owner: "r1", Lease: time.Minute})
	partialOf("LeaseDueDrained after ReleaseLeases", err)
	if len(again) != 3 {
		t.Errorf("leased %v after giving the leases back, want the live worker's 3 keys again", keysOf(again))
	}

	samples, err := store.SelfCheckSamples(ctx, pool, "create_ticket", time.Hour, 10)
	partialOf("SelfCheckSamples", err)
	var got []string
	for _, k := range samples {
		got = append(got, k.Key)
	}
	if slices.Sort(got); !slices.Equal(got, sorted(keys[live.Port]["done"])) {
		t.Errorf("self-check samples %v, want the live worker's completed keys %v", got, keys[live.Port]["done"])
	}

	total, _, err := store.CountExpiredProcessing(ctx, pool)
	partialOf("CountExpiredProcessing", err)
	if total != 1 {
		t.Errorf("%d expired processing keys counted, want the live worker's 1", total)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	page, err := store.ExpiredProcessingPage(ctx, tx, store.PurgeCursor{}, 10)
	partialOf("ExpiredProcessingPage in a transaction", err)
	if len(page) != 1 || page[0].Key != keys[live.Port]["expired-processing"][0] {
		t.Errorf("expired processing page %+v, want the live worker's key", page)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatalf("the transaction that read the page: %v", err)
	}

	res, err := store.PurgeExpiredBatch(ctx, pool, store.PurgePolicy{MinAge: time.Hour}, store.PurgeCursor{}, 100)
	partialOf("PurgeExpiredBatch", err)
	if res.Keys != 2 || !res.Done {
		t.Errorf("purge batch %+v; want the live worker's 2 expired keys deleted and the pass done", res)
	}

	// The worker is back: its keys are as they were.
	if err := c.StartNode(ctx, down); err != nil {
		t.Fatal(err)
	}
	if n := db.Count(t, `idempotency_keys WHERE key = ANY($1)`, keys[down.Port]["expired"]); n != 2 {
		t.Errorf("%d of the stopped worker's expired keys left, want 2: purged while unreachable?", n)
	}
	if n := db.Count(t, `reconcile_state WHERE lease_owner = 'r1' AND key = ANY($1)`, keys[live.Port]["stuck"]); n != 3 {
		t.Errorf("%d leases of the live worker's keys written, want 3", n)
	}
	if n := db.Count(t, `reconcile_state WHERE key = ANY($1)`, keys[down.Port]["stuck"]); n != 0 {
		t.Errorf("%d of the stopped worker's stuck keys leased while it was down", n)
	}
	if n := db.Count(t, `idempotency_keys WHERE key = ANY($1)`, keys[live.Port]["expired"]); n != 0 {
		t.Errorf("%d of the live worker's expired keys left", n)
	}
	if n := db.Count(t, `idempotency_keys WHERE key = ANY($1)`, keys[live.Port]["held-expired"]); n != 1 {
		t.Errorf("the live worker's held expired key was purged")
	}
	if n := db.Count(t, `reconcile_state WHERE key = ANY($1) AND lease_owner IS NOT NULL`, keys[live.Port]["held-stuck"]); n != 0 {
		t.Errorf("the live worker's held stuck key was leased")
	}
	tools, err = store.ProcessingTools(ctx, pool)
	if err != nil || len(tools) != 2 {
		t.Errorf("ProcessingTools with every worker back: %v, %v", tools, err)
	}
}

// keysOnWorker returns n keys prefix-0, prefix-1, … that hash to shards on
// the worker listening on port.
func keysOnWorker(t *testing.T, pool *pgxpool.Pool, port int, prefix string, n int) []string {
	t.Helper()
	var out []string
	for i := 0; len(out) < n; i++ {
		if i > 100*n {
			t.Fatalf("no %d keys %s-N on the worker at port %d", n, prefix, port)
		}
		k := fmt.Sprintf("%s-%d", prefix, i)
		var on int
		if err := pool.QueryRow(context.Background(), `SELECT n.nodeport
			FROM pg_dist_placement p JOIN pg_dist_node n ON n.groupid = p.groupid
			WHERE p.shardid = get_shard_id_for_distribution_column('idempotency_keys', $1::text)`, k).Scan(&on); err != nil {
			t.Fatal(err)
		}
		if on == port {
			out = append(out, k)
		}
	}
	return out
}

func sorted(s []string) []string {
	out := slices.Clone(s)
	slices.Sort(out)
	return out
}
