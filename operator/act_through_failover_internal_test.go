package operator

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
)

func stuckKey(t *testing.T, db *pgtest.DB, key string) {
	t.Helper()
	db.Exec(t, `INSERT INTO idempotency_keys (key, tool, request_hash, created_at, claimed_at, expires_at)
		VALUES ($1, 'create_ticket', 'h', now() - interval '1 hour', now() - interval '1 hour', now() + interval '1 day')`, key)
}

func windows(string) (time.Duration, time.Duration) { return time.Minute, time.Minute }

// An operator's resolve whose COMMIT went through but whose answer was
// lost is reported done (the truth), not as an error, and not done twice:
// its audit row is read back by the transaction's own now().
func TestResolveWhoseCommitAnswerWasLostIsDone(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	stuckKey(t, db, "k-op-lost")
	var commits atomic.Int32
	req := ResolveRequest{Key: "k-op-lost", Mark: MarkRetryable, Reason: "checked downstream", Actor: "operator:alice", Windows: windows,
		commit: func(tx pgx.Tx, ctx context.Context) error {
			if err := tx.Commit(ctx); err != nil {
				return err
			}
			if commits.Add(1) == 1 {
				return &pgconn.PgError{Code: "08006", Message: "connection failure during COMMIT (test)"}
			}
			return nil
		}}
	res, err := Resolve(context.Background(), db.Pool, req)
	if err != nil {
		t.Fatalf("Resolve = %v; want done", err)
	}
	if res.Key.Status != ledger.StatusFailedRetryable || commits.Load() != 1 {
		t.Fatalf("result %+v after %d commits; want failed_retryable after 1", res, commits.Load())
	}
	if n := db.Count(t, "reconcile_audit WHERE key = 'k-op-lost'"); n != 1 {
		t.Fatalf("%d audit rows; want 1", n)
	}
}

// A resolve whose connection was cut before its COMMIT reached the server
// wrote nothing: it runs again on a fresh connection and is done once.
func TestResolveCutByAFailoverIsDoneOnAFreshConnection(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	stuckKey(t, db, "k-op-cut")
	var tries atomic.Int32
	req := ResolveRequest{Key: "k-op-cut", Mark: MarkRetryable, Reason: "checked downstream", Actor: "operator:alice", Windows: windows,
		commit: func(tx pgx.Tx, ctx context.Context) error {
			if tries.Add(1) == 1 {
				if _, err := db.Pool.Exec(ctx, `SELECT pg_terminate_backend($1::int)`, tx.Conn().PgConn().PID()); err != nil {
					t.Errorf("terminate backend: %v", err)
				}
			}
			return tx.Commit(ctx)
		}}
	res, err := Resolve(context.Background(), db.Pool, req)
	if err != nil {
		t.Fatalf("Resolve = %v; want done", err)
	}
	if res.Key.Status != ledger.StatusFailedRetryable || tries.Load() != 2 {
		t.Fatalf("result %+v after %d tries; want failed_retryable after 2", res, tries.Load())
	}
	if n := db.Count(t, "reconcile_audit WHERE key = 'k-op-cut'"); n != 1 {
		t.Fatalf("%d audit rows; want 1", n)
	}
}
