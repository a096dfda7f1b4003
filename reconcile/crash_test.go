package reconcile_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/ledger/ledgertest/testwait"
	"github.com/ledgerkeeper/ledgerkeeper/probes"
	"github.com/ledgerkeeper/ledgerkeeper/reconcile"
)

const (
	helperEnv      = "LEDGERKEEPER_RECONCILE_HELPER"
	helperDBEnv    = "LEDGERKEEPER_RECONCILE_HELPER_DB"
	helperProbeEnv = "LEDGERKEEPER_RECONCILE_HELPER_PROBE"
	helperLease    = 6 * time.Second
)

// helperProcess runs one reconcile pass in a child process, which the test
// kills with SIGKILL while its probe is in flight.
func helperProcess() int {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv(helperDBEnv))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 3
	}
	p, err := probes.NewHTTP(probes.HTTPConfig{URL: os.Getenv(helperProbeEnv), Match: "data", Timeout: time.Minute})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 3
	}
	e := reconcile.New(reconcile.Config{Actor: "doomed-replica", Lease: helperLease, Concurrency: 4,
		Tools: map[string]reconcile.Policy{"create_ticket": {ProcessingWindow: time.Second, Probe: p, SelfCheckDisabled: true}}}, pool, nil, nil)
	_, _ = e.Run(ctx, reconcile.Options{})
	return 0
}

// kill -9 mid-probe: the keys stay leased until the lease expires, no
// attempt is counted, and the next pass after the lease resolves them all.
func TestKill9MidPass(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ds := newDownstream(t)
	gate := make(chan struct{})
	ds.gate = gate
	ds.entered = make(chan string, 100)
	t.Cleanup(func() { close(gate) })
	stuck(t, db, "create_ticket", time.Minute, "a", "b", "c")
	ds.addTicket("b", "T-b")

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=1", helperDBEnv+"="+db.URL,
		helperProbeEnv+"="+ds.srv.URL+"/v1/tickets?idempotency_key={key}")
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	testwait.Recv(t, ds.entered, testwait.Timeout) // a probe is in flight in the child
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	_ = testwait.Recv(t, waited, testwait.Timeout) // killed: it cannot take long; its exit status is "killed"

	if n := db.Count(t, "reconcile_audit"); n != 0 {
		t.Fatalf("audit rows after the crash = %d", n)
	}
	if n := db.Count(t, "reconcile_state WHERE lease_owner LIKE 'doomed-replica/%' AND attempts = 0"); n == 0 {
		t.Fatal("the child never leased: the crash was not mid-pass")
	}
	e := engine(t, db.Pool, reconcile.Config{Tools: map[string]reconcile.Policy{"create_ticket": {ProcessingWindow: time.Second, Probe: ds.probe(t)}}})
	// Still leased: hands off until the lease expires.
	var left float64
	if err := db.Pool.QueryRow(bg, `SELECT extract(epoch FROM min(lease_expires_at) - now()) FROM reconcile_state`).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left <= 0 {
		t.Fatalf("the child's leases (%s) ran out before the check: machine too slow for this test's timing", helperLease)
	}
	if rep := run(t, e, reconcile.Options{}); len(rep.Keys) != 0 {
		t.Fatalf("keys probed under another replica's live lease: %+v", rep.Keys)
	}
	ds.mu.Lock()
	ds.gate, ds.entered = nil, nil
	ds.mu.Unlock()
	// Polled while the crashed replica's leases run out.
	testwait.Eventually(t, func() bool {
		run(t, e, reconcile.Options{})
		return db.Count(t, "idempotency_keys WHERE status = 'processing'") == 0
	}, helperLease+15*time.Second, "the keys to be resolved after the crash's leases expired")
	if r, _ := ledger.Get(bg, db.Pool, "b"); r.Status != ledger.StatusCompleted {
		t.Fatalf("b = %+v", r)
	}
	for _, k := range []string{"a", "c"} {
		if r, _ := ledger.Get(bg, db.Pool, k); r.Status != ledger.StatusFailedRetryable {
			t.Fatalf("%s = %+v", k, r)
		}
	}
	// A crash is not a failed attempt: each key's one decision is attempt 1.
	if n := db.Count(t, "reconcile_audit WHERE attempt <> 1"); n != 0 {
		t.Fatalf("attempts counted for the crash: %d", n)
	}
}
