package store

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/ledger/ledgertest/testwait"
)

// TestMain (pgtest.Main) is in store_test.go.

var day = 24 * time.Hour

// putKey inserts a key created ageAgo, expiring expiresIn from now
// (negative: in the past).
func putKey(t *testing.T, db *pgtest.DB, key, tool, status string, age, expiresIn time.Duration) {
	t.Helper()
	db.Exec(t, `INSERT INTO idempotency_keys (key, tool, request_hash, status, created_at, claimed_at, updated_at, expires_at)
		VALUES ($1, $2, 'h', $3, now() - $4::interval, now() - $4::interval, now() - $4::interval, now() + $5::interval)`,
		key, tool, status, age, expiresIn)
}

func exists(t *testing.T, db *pgtest.DB, key string) bool {
	t.Helper()
	return db.Count(t, "idempotency_keys WHERE key = $1", key) == 1
}

// eachShape runs test once per purge shape (every one purgeBatchSQL
// knows), as parallel subtests: each safety rule of a batch must hold
// whichever way it deletes.
func eachShape(t *testing.T, test func(t *testing.T, shape PurgeShape)) {
	shapes := make([]PurgeShape, 0, len(purgeBatchSQL))
	for s := range purgeBatchSQL {
		if s.Supported() == nil { // ctid is PostgreSQL's alone: TestPurgeShapeSupportedByTheEngine
			shapes = append(shapes, s)
		}
	}
	slices.Sort(shapes)
	for _, shape := range shapes {
		t.Run(string(shape), func(t *testing.T) {
			t.Parallel()
			test(t, shape)
		})
	}
}

// waitBlocked polls until some session of the test's database waits on a
// lock (the statement running in the background has reached a locked row).
func waitBlocked(t *testing.T, db *pgtest.DB) {
	t.Helper()
	testwait.Eventually(t, func() bool {
		return db.Count(t, pgtest.LockWaiters()) > 0
	}, testwait.Timeout, "a session of the test's database to wait on a lock")
}

// A failed_retryable key that a retry re-claims while the DELETE waits on
// it is re-checked on its new version (now processing) and kept: the
// DELETE's own WHERE re-validates the row its ctid or key names.
func TestPurgeBatchRechecksRowReclaimedMidStatement(t *testing.T) {
	t.Parallel()
	eachShape(t, func(t *testing.T, shape PurgeShape) {
		db := pgtest.New(t)
		ctx := context.Background()
		putKey(t, db, "a", "t", ledger.StatusFailedRetryable, 3*day, -day)
		putKey(t, db, "b", "t", ledger.StatusFailedRetryable, 3*day, -day)

		retry, err := db.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer retry.Rollback(ctx)
		res, err := ledger.Claim(ctx, retry, ledger.ClaimParams{Key: "a", Tool: "t", RequestHash: "h"})
		if err != nil || res.Outcome != ledger.New {
			t.Fatalf("re-claim: %v %v", res.Outcome, err)
		}
		done := make(chan PurgeBatchResult, 1)
		go func() {
			res, err := PurgeExpiredBatchBy(ctx, db.Pool, shape, PurgePolicy{MinAge: day}, PurgeCursor{}, 10)
			if err != nil {
				t.Error(err)
			}
			done <- res
		}()
		waitBlocked(t, db)
		if err := retry.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if got := testwait.Recv(t, done, testwait.Timeout); got.Keys != 1 || got.Candidates != 2 {
			t.Fatalf("deleted %d of %d candidates; want 1 of 2", got.Keys, got.Candidates)
		}
		if !exists(t, db, "a") || exists(t, db, "b") {
			t.Fatal("want the re-claimed key kept and the other deleted")
		}
	})
}

// A key an operator puts on hold while the batch waits on its row is never
// purged: the batch sees the hold after the DELETE, rolls back and is
// chosen again without it.
func TestPurgeBatchHoldRace(t *testing.T) {
	t.Parallel()
	eachShape(t, func(t *testing.T, shape PurgeShape) {
		db := pgtest.New(t)
		ctx := context.Background()
		putKey(t, db, "a", "t", ledger.StatusCompleted, 3*day, -day)
		putKey(t, db, "b", "t", ledger.StatusCompleted, 3*day, -day)
		db.Exec(t, `INSERT INTO reconcile_state (key, tool, claimed_at) VALUES ('a', 't', now()), ('b', 't', now())`)

		op, err := db.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer op.Rollback(ctx)
		if err := PutHold(ctx, op, "a", "investigating", "alice"); err != nil {
			t.Fatal(err)
		}
		done := make(chan PurgeBatchResult, 1)
		go func() {
			res, err := PurgeExpiredBatchBy(ctx, db.Pool, shape, PurgePolicy{MinAge: day}, PurgeCursor{}, 10)
			if err != nil {
				t.Error(err)
			}
			done <- res
		}()
		waitBlocked(t, db)
		if err := op.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		got := testwait.Recv(t, done, testwait.Timeout)
		if got.HoldRaces != 1 || got.Keys != 1 || got.States != 1 {
			t.Fatalf("result %+v; want one hold race, then b and its state deleted", got)
		}
		if !exists(t, db, "a") || exists(t, db, "b") || db.Count(t, "reconcile_state WHERE key = 'a'") != 1 {
			t.Fatal("want the held key and its state kept, the other deleted")
		}
	})
}

// A hold that comes after the batch's DELETE waits for it and finds the key
// gone: it never holds a deleted key.
func TestHoldAfterPurgeFindsKeyGone(t *testing.T) {
	t.Parallel()
	eachShape(t, func(t *testing.T, shape PurgeShape) {
		db := pgtest.New(t)
		ctx := context.Background()
		putKey(t, db, "a", "t", ledger.StatusCompleted, 3*day, -day)
		purge, err := db.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer purge.Rollback(ctx)
		if _, _, err := deletePurge(ctx, purge, purgeBatchSQL[shape], PurgePolicy{MinAge: day}, PurgeCursor{}, 10); err != nil {
			t.Fatal(err)
		}
		held := make(chan error, 1)
		go func() {
			held <- pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error { return PutHold(ctx, tx, "a", "r", "alice") })
		}()
		waitBlocked(t, db)
		if err := purge.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if err := testwait.Recv(t, held, testwait.Timeout); !errors.Is(err, ledger.ErrNotFound) {
			t.Fatalf("hold of a purged key: %v; want ErrNotFound", err)
		}
		if db.Count(t, "key_holds") != 0 {
			t.Fatal("a hold was recorded for a purged key")
		}
	})
}

// Keyset paging walks (expires_at, key) even through ties, and a batch never
// returns a row twice.
func TestPurgeExpiredBatchKeysetThroughTies(t *testing.T) {
	t.Parallel()
	eachShape(t, func(t *testing.T, shape PurgeShape) {
		db := pgtest.New(t)
		ctx := context.Background()
		// 7 purgeable rows and 3 kept ones sharing one expires_at.
		db.Exec(t, `INSERT INTO idempotency_keys (key, tool, request_hash, status, created_at, expires_at)
			SELECT 'k' || i, 't', 'h', CASE WHEN i % 3 = 0 THEN 'processing' ELSE 'completed' END,
			       now() - interval '3 days', date_trunc('day', now()) - interval '1 day'
			FROM generate_series(1, 10) i`)
		var cur PurgeCursor
		var total int64
		batches := 0
		for {
			res, err := PurgeExpiredBatchBy(ctx, db.Pool, shape, PurgePolicy{MinAge: day}, cur, 2)
			if err != nil {
				t.Fatal(err)
			}
			batches++
			total += res.Keys
			cur = res.Next
			if res.Done {
				break
			}
			if batches > 10 {
				t.Fatal("keyset paging does not progress")
			}
		}
		if total != 7 || batches != 4 {
			t.Fatalf("deleted %d in %d batches; want 7 in 4", total, batches)
		}
		if n := db.Count(t, "idempotency_keys"); n != 3 {
			t.Fatalf("%d rows left; want the 3 processing ones", n)
		}
	})
}

// A statement past the session's timeout becomes ErrBatchTimeout.
func TestPurgeBatchTimeout(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	putKey(t, db, "a", "t", ledger.StatusCompleted, 3*day, -day)
	conn, err := db.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if err := SetStatementTimeout(ctx, conn, 50*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	defer SetStatementTimeout(ctx, conn, 0) //nolint:errcheck // cleanup; the connection closes with the test

	blocker, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer blocker.Rollback(ctx)
	if _, err := blocker.Exec(ctx, `LOCK TABLE reconcile_audit IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	_, err = PurgeDaemonBatch(ctx, conn, TableAudit, day, 10)
	if !errors.Is(err, ErrBatchTimeout) {
		t.Fatalf("err = %v; want ErrBatchTimeout", err)
	}
}

// AsBatchTimeout marks a statement timeout of any package's statement as
// ErrBatchTimeout, once, and leaves every other error as it is.
func TestAsBatchTimeout(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	conn, err := db.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if err := SetStatementTimeout(ctx, conn, 50*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	defer SetStatementTimeout(ctx, conn, 0) //nolint:errcheck // cleanup; the connection closes with the test
	_, slow := conn.Exec(ctx, `SELECT pg_sleep(5)`)
	if slow == nil {
		t.Fatal("pg_sleep(5) finished under a 50ms statement timeout")
	}
	got := AsBatchTimeout(slow)
	if !errors.Is(got, ErrBatchTimeout) {
		t.Fatalf("AsBatchTimeout(%v) = %v; want ErrBatchTimeout", slow, got)
	}
	if again := AsBatchTimeout(got); again != got { //nolint:errorlint // identity: the error must come back unchanged
		t.Fatalf("AsBatchTimeout wrapped twice: %v", again)
	}
	_, bad := conn.Exec(ctx, `SELECT no_such_column FROM idempotency_keys`)
	if bad == nil || AsBatchTimeout(bad) != bad { //nolint:errorlint // identity: the error must come back unchanged
		t.Fatalf("another PostgreSQL error changed: %v", AsBatchTimeout(bad))
	}
	plain := errors.New("not a database error")
	if AsBatchTimeout(plain) != plain || AsBatchTimeout(nil) != nil { //nolint:errorlint // identity: the error must come back unchanged
		t.Fatal("a non-database error or nil changed")
	}
}

func TestPurgeLock(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	c1, err := db.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c1.Release()
	c2, err := db.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Release()

	if running, err := PurgeRunning(ctx, db.Pool); err != nil || running {
		t.Fatalf("running before anyone locked: %v %v", running, err)
	}
	if ok, err := TryPurgeLock(ctx, c1); err != nil || !ok {
		t.Fatalf("first lock: %v %v", ok, err)
	}
	if ok, err := TryPurgeLock(ctx, c2); err != nil || ok {
		t.Fatalf("second lock: %v %v; want refused without waiting", ok, err)
	}
	if running, err := PurgeRunning(ctx, db.Pool); err != nil || !running {
		t.Fatalf("running while locked: %v %v", running, err)
	}
	if err := ReleasePurgeLock(ctx, c1); err != nil {
		t.Fatal(err)
	}
	if ok, err := TryPurgeLock(ctx, c2); err != nil || !ok {
		t.Fatalf("lock after release: %v %v", ok, err)
	}
	_ = ReleasePurgeLock(ctx, c2)
}

// Every shape runs on PostgreSQL; on Citus the ctid shape is refused with
// an error naming the shape to use, before anything is deleted.
func TestPurgeShapeSupportedByTheEngine(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	putKey(t, db, "old", "t", ledger.StatusCompleted, 3*day, -day)
	policy := PurgePolicy{MinAge: time.Hour}
	_, err := PurgeExpiredBatchBy(context.Background(), db.Pool, PurgeByCTID, policy, PurgeCursor{}, 10)
	if !pgtest.Citus() {
		if err != nil {
			t.Fatalf("ctid shape on PostgreSQL: %v", err)
		}
		if n := db.Count(t, "idempotency_keys"); n != 0 {
			t.Fatalf("%d keys left, want the expired one purged", n)
		}
		return
	}
	if !errors.Is(err, ErrShapeUnsupported) || !strings.Contains(err.Error(), string(PurgeByRange)) {
		t.Fatalf("ctid shape on Citus: err = %v, want ErrShapeUnsupported naming %q", err, PurgeByRange)
	}
	if n := db.Count(t, "idempotency_keys"); n != 1 {
		t.Fatalf("%d keys left, want the ledger untouched", n)
	}
}
