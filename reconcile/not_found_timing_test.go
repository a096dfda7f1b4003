package reconcile_test

import (
	"testing"
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/reconcile"
)

// A not_found is acted on only inside the downstream's dedup window
// (measured from the key's first use): a key between one and two windows
// old escalates like an ancient one.
func TestDedupWindowBoundary(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ds := newDownstream(t)
	stuck(t, db, "charge_card", time.Minute, "inside", "past")
	db.Exec(t, `UPDATE idempotency_keys SET created_at = now() - interval '30 minutes' WHERE key = 'inside'`)
	db.Exec(t, `UPDATE idempotency_keys SET created_at = now() - interval '90 minutes' WHERE key = 'past'`)
	e := engine(t, db.Pool, reconcile.Config{Tools: map[string]reconcile.Policy{
		"charge_card": {ProcessingWindow: time.Second, DownstreamDedupWindow: time.Hour, Probe: ds.probe(t)}}})
	rep := run(t, e, reconcile.Options{})
	if rep.Actions["marked_retryable"] != 1 || rep.Actions["escalated_dedup_window"] != 1 {
		t.Fatalf("actions = %+v", rep.Actions)
	}
	if r := row(t, db, "inside"); r.Status != ledger.StatusFailedRetryable {
		t.Fatalf("30 minutes into a 1h window: %s, want failed_retryable", r.Status)
	}
	if r := row(t, db, "past"); r.Status != ledger.StatusProcessing {
		t.Fatalf("90 minutes old, past a 1h window: %s, want processing (a retry could duplicate the effect)", r.Status)
	}
	if n := db.Count(t, "alert_outbox WHERE reason = 'dedup_window_passed' AND key = 'past' AND kind = 'firing'"); n != 1 {
		t.Fatalf("dedup_window_passed alerts for the 90-minute key = %d, want 1", n)
	}
	if n := outboxCount(t, db, "dedup_window_passed"); n != 1 {
		t.Fatalf("dedup_window_passed alerts = %d, want 1", n)
	}
}

// A not_found is confirmed only by another not_found confirm_not_found_after
// after the first: one halfway through still waits, and is scheduled for
// the end of the wait, not a whole interval later.
func TestConfirmNotFoundWaitsTheWholeInterval(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ds := newDownstream(t)
	stuck(t, db, "create_ticket", time.Minute, "k")
	e := engine(t, db.Pool, reconcile.Config{ConfirmNotFoundAfter: time.Hour,
		Tools: map[string]reconcile.Policy{"create_ticket": {ProcessingWindow: time.Second, Probe: ds.probe(t)}}})
	// nextProbeIn is the key's next_probe_at - now().
	nextProbeIn := func() time.Duration {
		t.Helper()
		var s float64
		if err := db.Pool.QueryRow(bg, `SELECT extract(epoch FROM next_probe_at - now())::float8 FROM reconcile_state WHERE key = 'k'`).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return time.Duration(s * float64(time.Second))
	}
	within := func(what string, got, want time.Duration) {
		t.Helper()
		if got > want || got < want-time.Minute {
			t.Fatalf("%s: next probe in %s, want about %s", what, got.Round(time.Second), want)
		}
	}

	rep := run(t, e, reconcile.Options{})
	if rep.Actions["awaiting_confirmation"] != 1 {
		t.Fatalf("first not_found: %+v", rep.Actions)
	}
	within("first not_found", nextProbeIn(), time.Hour)

	// Half an hour later (simulated), another not_found: not yet.
	backdateFirstNotFound(t, db, 30*time.Minute)
	rep = run(t, e, reconcile.Options{})
	if rep.Actions["awaiting_confirmation"] != 1 {
		t.Fatalf("not_found 30 minutes after the first: %+v, want still awaiting confirmation", rep.Actions)
	}
	if r := row(t, db, "k"); r.Status != ledger.StatusProcessing {
		t.Fatalf("confirmed after half the wait: %s", r.Status)
	}
	within("30 minutes after the first not_found", nextProbeIn(), 30*time.Minute)
	var since float64
	if err := db.Pool.QueryRow(bg, `SELECT extract(epoch FROM now() - first_not_found_at)::float8 FROM reconcile_state WHERE key = 'k'`).Scan(&since); err != nil {
		t.Fatal(err)
	}
	if since < 30*60 || since > 31*60 {
		t.Fatalf("first_not_found_at moved: %.0fs ago, want 30 minutes", since)
	}

	// The wait is over: the next not_found confirms.
	backdateFirstNotFound(t, db, 31*time.Minute)
	rep = run(t, e, reconcile.Options{})
	if rep.Actions["marked_retryable"] != 1 {
		t.Fatalf("not_found 61 minutes after the first: %+v", rep.Actions)
	}
	if r := row(t, db, "k"); r.Status != ledger.StatusFailedRetryable {
		t.Fatalf("confirmed not_found: %s", r.Status)
	}
	if n := ds.hitsOf("k"); n != 3 {
		t.Fatalf("probes = %d, want 3", n)
	}
}
