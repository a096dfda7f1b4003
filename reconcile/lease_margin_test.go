package reconcile_test

import (
	"testing"
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/ledger/ledgertest/testwait"
	"github.com/ledgerkeeper/ledgerkeeper/reconcile"
	"github.com/ledgerkeeper/ledgerkeeper/store"
)

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
