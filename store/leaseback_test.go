package store_test

import (
	"testing"
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/store"
)

// A reconciler decision that is refused (the key was put on hold, or a
// heartbeat arrived while the probe ran) still gives its own lease back:
// the key is due again at once for whoever may decide it, instead of
// waiting for the lease to lapse. Liveness, not safety, but an operator
// releasing a hold expects the next pass to take the key.
func TestRefusedDecisionGivesItsLeaseBack(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	for _, k := range []string{"held", "beating"} {
		claim(t, db.Pool, k, "h")
		age(t, db, k, time.Minute)
	}
	leased := lease(t, db.Pool, "me", store.LeaseParams{})
	if len(leased) != 2 {
		t.Fatalf("leased %d keys, want 2", len(leased))
	}
	db.Exec(t, `INSERT INTO key_holds (key, reason, actor) VALUES ('held', 'checking by hand', 'alice')`)
	db.Exec(t, `UPDATE idempotency_keys SET heartbeat_at = now() WHERE key = 'beating'`)
	want := map[string]string{"held": store.ActionHeld, "beating": store.ActionInFlightAgain}
	for _, l := range leased {
		d := store.Decision{Key: l.Key.Key, Tool: l.Tool, ClaimedAt: l.ClaimedAt, Owner: "me", Actor: "replica-1",
			Verdict: "not_found", Transition: ledger.StatusFailedRetryable, Action: "marked_retryable", CountAttempt: true,
			CheckHeartbeat: true, LeasedHeartbeatAt: l.HeartbeatAt}
		res := decide(t, db, d)
		if res.Applied || res.Action != want[l.Key.Key] {
			t.Fatalf("%s: %+v, want refused as %s", l.Key.Key, res, want[l.Key.Key])
		}
	}
	if n := db.Count(t, `reconcile_state WHERE lease_owner IS NOT NULL OR lease_expires_at IS NOT NULL`); n != 0 {
		t.Fatalf("%d refused decisions kept their lease", n)
	}
	if n := db.Count(t, `idempotency_keys WHERE status = 'processing'`); n != 2 {
		t.Fatal("a refused decision changed a key")
	}
}
