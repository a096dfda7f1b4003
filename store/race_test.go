package store

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/ledger/ledgertest/testwait"
)

// These tests reach the conditions that the Go-side checks normally decide
// first: the database itself must refuse what a stale read would allow.

// A hold committed after LeaseDue's statement took its snapshot, but before
// it locked the key, is invisible to that statement: the re-check that
// follows must give the lease back.
//
// Made deterministic with a row lock: the statement leases the older key
// "first" before the held one, and its upsert of first's bookkeeping waits
// on a lock the test holds. By then the snapshot is taken and "held" is
// not locked yet, so the operator's hold commits inside the window.
func TestLeaseDueGivesBackAKeyHeldMidStatement(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	putKey(t, db, "first", "t", ledger.StatusProcessing, 2*time.Hour, day)
	putKey(t, db, "held", "t", ledger.StatusProcessing, time.Hour, day)
	db.Exec(t, `INSERT INTO reconcile_state (key, tool, claimed_at) SELECT key, tool, claimed_at FROM idempotency_keys WHERE key = 'first'`)

	blocker, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer blocker.Rollback(ctx)
	if _, err := blocker.Exec(ctx, `SELECT 1 FROM reconcile_state WHERE key = 'first' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}

	type leaseResult struct {
		leased []Leased
		err    error
	}
	done := make(chan leaseResult, 1)
	go func() {
		l, err := LeaseDue(ctx, db.Pool, LeaseParams{Tool: "t", Window: time.Minute, HeartbeatTimeout: time.Minute,
			Owner: "replica-a", Lease: time.Minute, Limit: 10})
		done <- leaseResult{l, err}
	}()
	waitBlocked(t, db)

	// The statement waits on first's bookkeeping; "held" is not locked by
	// it yet, so the hold goes through and commits.
	// Bounded: were "held" locked already, the hold would wait for ever.
	hctx, cancel := context.WithTimeout(ctx, testwait.Timeout)
	defer cancel()
	if err := pgx.BeginFunc(hctx, db.Pool, func(tx pgx.Tx) error { return PutHold(hctx, tx, "held", "investigating", "alice") }); err != nil {
		t.Fatalf("hold while the lease statement runs (it must not have locked the held key yet): %v", err)
	}
	if err := blocker.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	got := testwait.Recv(t, done, testwait.Timeout)
	if got.err != nil {
		t.Fatal(got.err)
	}
	if len(got.leased) != 1 || got.leased[0].Key.Key != "first" {
		t.Fatalf("leased %v; want [first]: a key put on hold must not be probed", keysOfLeased(got.leased))
	}
	// The statement did lease "held" (its bookkeeping row exists): the
	// re-check is what gave it back.
	st, err := GetState(ctx, db.Pool, "held")
	if err != nil {
		t.Fatalf("the lease statement never reached the held key, so this test proves nothing: %v", err)
	}
	if st.LeaseOwner != nil || st.LeaseExpiresAt != nil {
		t.Fatalf("held key still leased: owner %v until %v", *st.LeaseOwner, st.LeaseExpiresAt)
	}
}

func keysOfLeased(ls []Leased) []string {
	out := make([]string, len(ls))
	for i, l := range ls {
		out[i] = l.Key.Key
	}
	return out
}

// The transitions are compare-and-set in SQL too: a decision made from a
// stale read (the claim re-claimed, or the status changed, since) updates
// nothing, and the zero-row UPDATE ... RETURNING fails the batch
// (pgx.ErrNoRows) instead of passing silently. DecideMany reads under the
// row lock, so this cannot happen there; queueDecision is fed the stale
// read by hand to reach the statement's own condition.
func TestDecisionTransitionIsCompareAndSetInSQL(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		transition string
		// real is the row's status in the ledger; the decision was made
		// from a read that said processing.
		real string
		// reclaimed: the row's claimed_at is not the one decided on.
		reclaimed bool
	}{
		{"completed, re-claimed meanwhile", ledger.StatusCompleted, ledger.StatusProcessing, true},
		{"completed, completed meanwhile", ledger.StatusCompleted, ledger.StatusCompleted, false},
		{"failed_retryable, re-claimed meanwhile", ledger.StatusFailedRetryable, ledger.StatusProcessing, true},
		{"failed_retryable, marked retryable meanwhile", ledger.StatusFailedRetryable, ledger.StatusFailedRetryable, false},
		{"failed_retryable, completed meanwhile", ledger.StatusFailedRetryable, ledger.StatusCompleted, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db := pgtest.New(t)
			ctx := context.Background()
			putKey(t, db, "k", "t", tc.real, time.Hour, day)
			real, err := ledger.Get(ctx, db.Pool, "k")
			if err != nil {
				t.Fatal(err)
			}
			stale := real
			stale.Status = ledger.StatusProcessing
			if tc.reclaimed {
				stale.ClaimedAt = real.ClaimedAt.Add(-time.Minute)
			}
			d, err := OperatorDecision{Key: "k", Tool: "t", ClaimedAt: stale.ClaimedAt, Actor: "op", Reason: "r",
				Transition: tc.transition, ResponseCode: 201, ResponseBody: json.RawMessage(`{"id":"T-1"}`), Window: time.Minute}.pending()
			if err != nil {
				t.Fatal(err)
			}

			var res DecideResult
			batch := &pgx.Batch{}
			if err := queueDecision(batch, d, decisionRow{cur: stale}, &res); err != nil {
				t.Fatal(err)
			}
			if !res.Applied {
				t.Fatalf("the stale read should have let the decision through to SQL: %+v", res)
			}
			tx, err := db.Pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx)
			err = tx.SendBatch(ctx, batch).Close()
			if !errors.Is(err, pgx.ErrNoRows) {
				now, _ := ledger.Get(ctx, tx, "k")
				t.Fatalf("batch err = %v, want pgx.ErrNoRows: the transition to %s matched a row in status %s claimed at %s (decided on %s); now %s",
					err, tc.transition, real.Status, real.ClaimedAt, d.ClaimedAt, now.Status)
			}
			if err := tx.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			after, err := ledger.Get(ctx, db.Pool, "k")
			if err != nil {
				t.Fatal(err)
			}
			if after.Status != real.Status || !after.ClaimedAt.Equal(real.ClaimedAt) || after.ResponseCode != nil || !after.UpdatedAt.Equal(real.UpdatedAt) {
				t.Fatalf("ledger row changed: %+v, was %+v", after, real)
			}
		})
	}
}
