package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/internal/engine"
	"github.com/ledgerkeeper/ledgerkeeper/ledger/ledgertest/testwait"
)

// serve on a Citus cluster whose coordinator restarts while keys of both
// workers are leased and their probes are in flight: serve survives it as
// it survives a failover (its pools reconnect to the coordinator), the
// answers are written once it is back, every key is resolved with exactly
// one audit row, and keys stuck afterwards are resolved and expired keys
// purged by the same serve.
func TestServeOnCitusResolvesKeysOnceThroughACoordinatorRestart(t *testing.T) {
	// Not parallel: the store's shapes are chosen per process.
	was := engine.Citus()
	t.Cleanup(func() { engine.SetCitus(was) })
	c, db := citusLedger(t)
	rt := newRouter(t)
	var inFlight []string
	for _, w := range c.Workers {
		inFlight = append(inFlight, keysOn(t, db, w.Port, fmt.Sprintf("wf-restart-%d", w.Port), 3, true)...)
	}
	gate := newProbeGate(t, rt, inFlight...)
	slack := newSlackServer(t)
	completedTicket(t, db, rt, "wf-witness:done")
	logs := serveWith(t, db, citusServeConfig(t, gate.srv.URL, slack.srv.URL, freeAddr(t)), slack)
	// Each worker's three keys on one shard, inserted at once: the pass
	// leases them together.
	stuckAtOnce(t, db, rt, inFlight[:3])
	stuckAtOnce(t, db, rt, inFlight[3:])
	testwait.Eventually(t, gate.holds(inFlight), 30*time.Second, "the probes of the keys in flight on both workers")

	if err := c.StopNode(c.Coordinator); err != nil {
		t.Fatal(err)
	}
	if err := c.StartNode(context.Background(), c.Coordinator); err != nil {
		t.Fatal(err)
	}
	// The test's own pool drops the connections the restart broke.
	testwait.Eventually(t, func() bool {
		_, err := db.Pool.Exec(context.Background(), `SELECT 1`)
		return err == nil
	}, 30*time.Second, "the coordinator answering again")
	var back time.Time
	if err := db.Pool.QueryRow(context.Background(), `SELECT now()`).Scan(&back); err != nil {
		t.Fatal(err)
	}
	gate.release()

	resolved := func(keys []string) func() bool { return eachKey(t, db, keys, `status = 'completed'`, 1) }
	testwait.Eventually(t, resolved(inFlight), 60*time.Second, "the keys in flight across the restart completed")
	auditedOnce(t, db, inFlight)
	// Their decisions were written after the restart: the answers of the
	// probes in flight across it, not a pass that had finished before.
	for _, k := range inFlight {
		if n := db.Count(t, `reconcile_audit WHERE key = $1 AND created_at >= $2`, k, back); n != 1 {
			t.Errorf("key %s: %d audit rows written after the restart, want its one decision", k, n)
		}
	}
	if !strings.Contains(logs.String(), "database failed over") {
		t.Errorf("serve did not see the coordinator's restart as a failover:\n%s", logs.String())
	}

	// The same serve goes on: keys stuck after the restart are resolved,
	// expired keys purged.
	var after, expired []string
	for _, w := range c.Workers {
		after = append(after, keysOn(t, db, w.Port, fmt.Sprintf("wf-after-%d", w.Port), 2, false)...)
		expired = append(expired, keysOn(t, db, w.Port, fmt.Sprintf("wf-after-%d:expired", w.Port), 2, false)...)
	}
	stuckTickets(t, db, rt, after...)
	expiredKeys(t, db, rt, expired...)
	testwait.Eventually(t, resolved(after), 40*time.Second, "keys stuck after the restart completed")
	auditedOnce(t, db, after)
	testwait.Eventually(t, func() bool {
		return db.Count(t, `idempotency_keys WHERE key = ANY($1)`, expired) == 0
	}, 30*time.Second, "keys expired after the restart purged")
}
