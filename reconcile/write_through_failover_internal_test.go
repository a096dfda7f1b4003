package reconcile

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
	"github.com/ledgerkeeper/ledgerkeeper/probes"
)

// duplicateEngine is an engine whose one tool's probe finds two effects
// for every key: a decision that writes an audit row and raises an alert,
// both of which must exist once.
func duplicateEngine(t *testing.T, db *pgtest.DB) *Engine {
	t.Helper()
	dup := probes.ProbeFunc(func(context.Context, probes.Key) probes.Result {
		return probes.Result{Verdict: probes.Duplicate, Err: fmt.Errorf("two tickets for the key")}
	})
	return New(Config{Actor: "test-replica", BackoffBase: time.Hour, Tools: map[string]Policy{
		"create_ticket": {ProcessingWindow: time.Second, Probe: dup, SelfCheckDisabled: true}}}, db.Pool, nil, nil)
}

func stuckKey(t *testing.T, db *pgtest.DB, key string) {
	t.Helper()
	db.Exec(t, `INSERT INTO idempotency_keys (key, tool, request_hash, created_at, claimed_at, expires_at)
		VALUES ($1, 'create_ticket', 'h', now() - interval '1 minute', now() - interval '1 minute', now() + interval '1 day')`, key)
}

// A COMMIT that went through but whose answer was lost (the connection
// broke under it) has an unknown outcome: the writer reads the decision's
// audit rows back before anything else, finds them, and reports the
// decision written: one audit row, one alert, never written twice.
func TestCommitWhoseAnswerWasLostIsConfirmedNotRepeated(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	stuckKey(t, db, "k-lost-answer")
	e := duplicateEngine(t, db)
	var lost atomic.Int32
	e.commitTx = func(tx pgx.Tx, ctx context.Context) error {
		if err := tx.Commit(ctx); err != nil {
			return err
		}
		if lost.Add(1) == 1 {
			// The server committed; the client never heard.
			return &pgconn.PgError{Code: "08006", Message: "connection failure during COMMIT (test)"}
		}
		return nil
	}
	rep, err := e.Run(context.Background(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Actions["duplicate_alerted"] != 1 || rep.Actions["write_failed"] != 0 {
		t.Fatalf("report actions %v; want the decision reported written", rep.Actions)
	}
	if n := db.Count(t, "reconcile_audit WHERE key = 'k-lost-answer'"); n != 1 {
		t.Fatalf("%d audit rows; want 1 (the decision written once)", n)
	}
	if n := db.Count(t, "alert_outbox WHERE key = 'k-lost-answer'"); n != 1 {
		t.Fatalf("%d outbox entries; want 1", n)
	}
	if n := db.Count(t, "reconcile_state WHERE key = 'k-lost-answer' AND lease_owner IS NULL AND attempts = 1"); n != 1 {
		t.Fatal("the key's lease was not given back with its attempt counted")
	}
	if lost.Load() != 1 {
		t.Fatalf("%d commits; want 1 (confirmed, not written again)", lost.Load())
	}
}

// A connection killed under the write (the primary went away before the
// COMMIT reached it) committed nothing: the decision is written again on a
// fresh connection while its lease holds, once, instead of the key being
// probed again after the lease lapses.
func TestWriteCutByAFailoverIsWrittenOnAFreshConnection(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	stuckKey(t, db, "k-killed")
	e := duplicateEngine(t, db)
	var tries atomic.Int32
	e.commitTx = func(tx pgx.Tx, ctx context.Context) error {
		if tries.Add(1) == 1 {
			// The server goes away under the transaction: its backend is
			// terminated (57P01 for the session), then the COMMIT fails.
			pid := tx.Conn().PgConn().PID()
			if _, err := db.Pool.Exec(ctx, `SELECT pg_terminate_backend($1::int)`, pid); err != nil {
				t.Errorf("terminate backend: %v", err)
			}
		}
		return tx.Commit(ctx)
	}
	rep, err := e.Run(context.Background(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if tries.Load() != 2 {
		t.Fatalf("%d commits; want 2 (the cut one, then one on a fresh connection)", tries.Load())
	}
	if rep.Actions["duplicate_alerted"] != 1 || rep.Actions["write_failed"] != 0 {
		t.Fatalf("report actions %v; want the decision written", rep.Actions)
	}
	if n := db.Count(t, "reconcile_audit WHERE key = 'k-killed'"); n != 1 {
		t.Fatalf("%d audit rows; want 1", n)
	}
	if n := db.Count(t, "alert_outbox WHERE key = 'k-killed'"); n != 1 {
		t.Fatalf("%d outbox entries; want 1", n)
	}
}

// A failover's writes are tried again only while every lease of the group
// holds, less the margin that keeps a late write from landing after
// another replica leased the key.
func TestWriteDeadlineIsTheFirstLeaseLessTheMargin(t *testing.T) {
	t.Parallel()
	now := time.Now()
	mk := func(left time.Duration) *plan {
		pl := &plan{leasedAt: now}
		pl.l.Now = time.Unix(1000, 0)
		pl.l.LeaseExpiresAt = pl.l.Now.Add(left)
		return pl
	}
	got := writeDeadline([]*plan{mk(2 * time.Minute), mk(30 * time.Second), mk(time.Hour)})
	if want := now.Add(30*time.Second - leaseMargin); !got.Equal(want) {
		t.Fatalf("writeDeadline = %v, want %v (the shortest lease, less the margin)", got.Sub(now), want.Sub(now))
	}
}
