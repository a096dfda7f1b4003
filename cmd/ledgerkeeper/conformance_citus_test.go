package main

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/internal/engine"
	"github.com/ledgerkeeper/ledgerkeeper/internal/exampletool"
)

// `conformance --profile ledgerkeeper` passes the example tool server whose
// ledger is a Citus coordinator (idempotency_keys distributed by key by
// `ledgerkeeper migrate`, on a cluster of its own): the tool side's claims,
// completions and replays route through the coordinator to the keys'
// shards. Effects at the sink: one ticket per key (the tickets table is
// the coordinator's own), one ledger row per key, completed, each stored
// on its shard on a worker, none on the coordinator.
func TestConformancePassesExampleToolOnCitus(t *testing.T) {
	// Not parallel: `ledgerkeeper migrate` on the coordinator turns the
	// store's Citus shapes on for the whole process (internal/engine).
	was := engine.Citus()
	t.Cleanup(func() { engine.SetCitus(was) })
	start := time.Now()
	_, db := citusLedger(t)
	t.Logf("cluster up and migrated in %s", time.Since(start).Round(time.Millisecond))
	ctx := context.Background()

	tool := exampletool.New(exampletool.Config{Ledger: db.Pool, Sink: db.Pool})
	if err := tool.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(tool.Handler())
	t.Cleanup(srv.Close)
	t.Setenv("TOOL_URL", srv.URL)
	t.Setenv("SLACK_API_URL", "http://127.0.0.1:1/api/")
	cfg := writeFile(t, "demo.yaml", string(demoConfig))

	code, out, stderr := cli(t, "conformance", srv.URL+"/tools/create_ticket", "--tool", "create_ticket", "--config", cfg,
		"--body", conformanceBody, "--key-prefix", "citus-1:", "--profile", "ledgerkeeper")
	if code != 0 || strings.Contains(out, "FAIL ") || !strings.Contains(out, "PASS concurrent/exactly one request executed: verdict found") ||
		!strings.Contains(out, "PASS ledgerkeeper/same-key-twice/second answer says idempotent_replay true") ||
		!strings.Contains(out, "(profile ledgerkeeper, keys raw; keys citus-1:*)") {
		t.Fatalf("conformance on a Citus ledger: %d\n%s\n%s", code, out, stderr)
	}
	t.Logf("conformance on the example tool, Citus ledger, at %s:\n%s", time.Since(start).Round(time.Millisecond), out)

	if n := db.Count(t, `tickets WHERE idempotency_key LIKE 'citus-1:%'`); n != 3 {
		t.Fatalf("tickets under the prefix = %d, want 3 (same-key-twice, other-arguments, concurrent)", n)
	}
	if n := db.Count(t, `idempotency_keys WHERE key LIKE 'citus-1:%' AND status = 'completed'`); n != 3 {
		t.Fatalf("completed keys under the prefix = %d (of %d), want 3", n, db.Count(t, `idempotency_keys WHERE key LIKE 'citus-1:%'`))
	}
	// Each key's row is on a worker, in its shard: summed over every
	// placement (the coordinator holds none), three rows.
	var onShards, onCoordinator int
	if err := db.Pool.QueryRow(ctx, `SELECT coalesce(sum(r.result::int), 0), count(*) FILTER (WHERE r.nodeport = inet_server_port())
		FROM run_command_on_placements('idempotency_keys', $$SELECT count(*) FROM %s WHERE starts_with(key, 'citus-1:')$$) r`).Scan(&onShards, &onCoordinator); err != nil {
		t.Fatal(err)
	}
	if onShards != 3 || onCoordinator != 0 {
		t.Fatalf("rows under the prefix in the shards: %d, placements on the coordinator: %d; want 3 rows, all on workers", onShards, onCoordinator)
	}

	// The default profile, keys raw, more concurrent callers: passes too.
	code, out, stderr = cli(t, "conformance", srv.URL+"/tools/create_ticket", "--tool", "create_ticket", "--config", cfg,
		"--body", conformanceBody, "--key-prefix", "citus-2:", "--key-format", "raw", "--concurrency", "5")
	if code != 0 || strings.Contains(out, "FAIL ") || !strings.Contains(out, "(profile draft-07, keys raw;") {
		t.Fatalf("conformance --key-format raw on a Citus ledger: %d\n%s\n%s", code, out, stderr)
	}
	if n := db.Count(t, `tickets WHERE idempotency_key LIKE 'citus-2:%'`); n != db.Count(t, `idempotency_keys WHERE key LIKE 'citus-2:%'`) || n == 0 {
		t.Fatalf("default profile: %d tickets under the prefix for %d keys, want one per key", n, db.Count(t, `idempotency_keys WHERE key LIKE 'citus-2:%'`))
	}
	t.Logf("done at %s", time.Since(start).Round(time.Millisecond))
}
