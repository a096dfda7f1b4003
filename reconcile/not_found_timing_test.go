package reconcile_test

import (
	"testing"
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
	"github.com/ledgerkeeper/ledgerkeeper/internal/testwait"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/ledger/store"
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
	db.Exec(t, `UPDATE reconcile_state SET first_not_found_at = first_not_found_at - interval '30 minutes', next_probe_at = now() - interval '1 second'`)
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
	db.Exec(t, `UPDATE reconcile_state SET first_not_found_at = first_not_found_at - interval '31 minutes', next_probe_at = now() - interval '1 second'`)
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

// A leased key is probed only while its lease outlasts the probe's timeout
// plus a margin (2s); otherwise it is given back untouched, or the lease
// could lapse mid-probe and another replica probe the key too.
func TestLeaseTooShortToProbe(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ds := newDownstream(t)
	stuck(t, db, "create_ticket", time.Minute, "k")
	ds.addTicket("k", "T-1")
	policy := reconcile.Policy{ProcessingWindow: time.Second, ProbeTimeout: time.Second, Probe: ds.probe(t)}
	// Lease = timeout + margin: whatever time passes after the lease
	// leaves less than that.
	short := engine(t, db.Pool, reconcile.Config{Lease: time.Second + 2*time.Second,
		Tools: map[string]reconcile.Policy{"create_ticket": policy}})
	rep := run(t, short, reconcile.Options{})
	if len(rep.Keys) != 0 || ds.totalHits() != 0 {
		t.Fatalf("probed with less lease left than timeout + margin: actions %v, %d requests", rep.Actions, ds.totalHits())
	}
	st, err := store.GetState(bg, db.Pool, "k")
	if err != nil || st.LeaseOwner != nil || st.Attempts != 0 || st.NextProbeAt != nil {
		t.Fatalf("key not given back untouched: %+v %v", st, err)
	}
	if n := db.Count(t, "reconcile_audit"); n != 0 {
		t.Fatalf("audit rows = %d", n)
	}
	// Given back, not stuck: a replica with a long enough lease takes it
	// at once.
	long := engine(t, db.Pool, reconcile.Config{Lease: time.Minute, Tools: map[string]reconcile.Policy{"create_ticket": policy}})
	run(t, long, reconcile.Options{})
	if r := row(t, db, "k"); r.Status != ledger.StatusCompleted || ds.totalHits() != 1 {
		t.Fatalf("after the give-back: %s, %d requests", r.Status, ds.totalHits())
	}
}

// A key that waited for a probe slot until its lease no longer covers the
// probe is given back, not probed.
func TestKeyWaitingTooLongForASlotIsGivenBack(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ds := newDownstream(t)
	ds.gate = make(chan struct{})
	ds.entered = make(chan string, 2)
	stuck(t, db, "create_ticket", 2*time.Minute, "first")
	stuck(t, db, "create_ticket", time.Minute, "second")
	// Lease 4s, timeout 1.5s + margin 2s: a key may wait 0.5s for a slot.
	// (The engine holds every probe to its timeout, so the first probe
	// keeps the slot for less than 1.5s.)
	e := engine(t, db.Pool, reconcile.Config{Lease: 4 * time.Second, Tools: map[string]reconcile.Policy{
		"create_ticket": {ProcessingWindow: time.Second, Concurrency: 1, ProbeTimeout: 1500 * time.Millisecond, Probe: ds.probe(t)}}})
	done := make(chan reconcile.Report, 1)
	go func() {
		r, _ := e.Run(bg, reconcile.Options{})
		done <- r
	}()
	if k := testwait.Recv(t, ds.entered, testwait.Timeout); k != "first" {
		t.Fatalf("first probe for %q", k)
	}
	// Both keys were leased before "first" was probed; "second" waits for
	// the one slot. The probe is held until it has waited 1.1s.
	entered := time.Now()
	testwait.Eventually(t, func() bool { return time.Since(entered) > 1100*time.Millisecond }, testwait.Timeout, "1.1s to pass")
	close(ds.gate)
	rep := testwait.Recv(t, done, testwait.Timeout)
	if ds.hitsOf("second") != 0 {
		t.Fatal("a key probed with less lease left than its probe timeout plus the margin")
	}
	if len(rep.Keys) != 1 || rep.Keys[0].Key != "first" {
		t.Fatalf("report = %+v", rep.Keys)
	}
	st, err := store.GetState(bg, db.Pool, "second")
	if err != nil || st.LeaseOwner != nil || st.Attempts != 0 {
		t.Fatalf("second not given back untouched: %+v %v", st, err)
	}
	if n := db.Count(t, "reconcile_audit WHERE key = 'second'"); n != 0 {
		t.Fatalf("audit rows for the key given back = %d", n)
	}
	if rep.Keys[0].Action != "marked_retryable" {
		t.Fatalf("first: %+v", rep.Keys[0])
	}
}
