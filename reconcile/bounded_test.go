package reconcile_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/reconcile"
)

// A pass over a backlog counts every key but lists a bounded sample, so its
// memory does not grow with the backlog.
func TestReportKeepsCountsAndASample(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ds := newDownstream(t)
	for i := range 30 {
		stuck(t, db, "create_ticket", time.Minute, fmt.Sprintf("k%02d", i))
	}
	e := engine(t, db.Pool, reconcile.Config{ReportKeys: 10,
		Tools: map[string]reconcile.Policy{"create_ticket": {ProcessingWindow: time.Second, Probe: ds.probe(t)}}})
	rep := run(t, e, reconcile.Options{})
	if rep.Decided != 30 || len(rep.Keys) != 10 || rep.KeysOmitted != 20 || rep.Actions[reconcile.ActionMarkedRetryable] != 30 {
		t.Fatalf("decided %d, listed %d, omitted %d, actions %v; want 30, 10, 20 and 30 marked", rep.Decided, len(rep.Keys), rep.KeysOmitted, rep.Actions)
	}
	if n := db.Count(t, `idempotency_keys WHERE status = 'failed_retryable'`); n != 30 {
		t.Fatalf("%d keys marked, want 30", n)
	}
}

// A pass that reaches reconcile.max_duration leases nothing more; what is
// left stays due, untouched, for the next pass.
func TestPassStopsLeasingAtItsTimeBudget(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ds := newDownstream(t)
	stuck(t, db, "create_ticket", time.Minute, "k1", "k2")
	pol := map[string]reconcile.Policy{"create_ticket": {ProcessingWindow: time.Second, Probe: ds.probe(t)}}
	rep := run(t, engine(t, db.Pool, reconcile.Config{MaxDuration: time.Nanosecond, Tools: pol}), reconcile.Options{})
	if !rep.OutOfTime || rep.Decided != 0 || ds.totalHits() != 0 {
		t.Fatalf("out of time %v, decided %d, %d probes: want a pass that stopped at once", rep.OutOfTime, rep.Decided, ds.totalHits())
	}
	if n := db.Count(t, `reconcile_state WHERE lease_owner IS NOT NULL`); n != 0 {
		t.Fatal("a key was left leased")
	}
	rep = run(t, engine(t, db.Pool, reconcile.Config{Tools: pol}), reconcile.Options{})
	if rep.OutOfTime || rep.Decided != 2 || row(t, db, "k1").Status != ledger.StatusFailedRetryable {
		t.Fatalf("next pass: %+v", rep)
	}
}
