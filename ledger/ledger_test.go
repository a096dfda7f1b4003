package ledger_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/ledger/ledgertest"
	"github.com/ledgerkeeper/ledgerkeeper/ledger/ledgertest/testwait"
)

// On a Citus ledger (ledgertest's Citus mode) the claims take their Citus
// shape, as a tool server on Citus does.
func TestMain(m *testing.M) {
	ledger.UseCitusShapes(os.Getenv(ledgertest.EnvCitusWorkers) != "")
	ledgertest.Main(m)
}

var ctx = context.Background()

func claim(t *testing.T, db ledger.DBTX, key, hash string) ledger.ClaimResult {
	t.Helper()
	res, err := ledger.Claim(ctx, db, ledger.ClaimParams{Key: key, Tool: "create_ticket", RequestHash: hash, RequestBody: json.RawMessage(`{"a":1}`)})
	if err != nil {
		t.Fatalf("claim %s: %v", key, err)
	}
	return res
}

// age moves a key's claim into the past, as if it had been claimed d ago.
func age(t *testing.T, db *ledgertest.DB, key string, d time.Duration) {
	t.Helper()
	db.Exec(t, `UPDATE idempotency_keys SET claimed_at = now() - $2::interval, created_at = now() - $2::interval WHERE key = $1`, key, d)
}

// claimNewThenRefused claims key with hash (New, processing), then checks
// that the same call again finds it in flight and other arguments a
// fingerprint mismatch. It returns the first claim.
func claimNewThenRefused(t *testing.T, db *ledgertest.DB, key, hash, other string) ledger.ClaimResult {
	t.Helper()
	first := claim(t, db.Pool, key, hash)
	if first.Outcome != ledger.New || first.Row.Status != ledger.StatusProcessing {
		t.Fatalf("first claim = %v %s", first.Outcome, first.Row.Status)
	}
	if got := claim(t, db.Pool, key, hash); got.Outcome != ledger.InFlight {
		t.Fatalf("second claim = %v, want in_flight", got.Outcome)
	}
	if got := claim(t, db.Pool, key, other); got.Outcome != ledger.FingerprintMismatch {
		t.Fatalf("other fingerprint = %v", got.Outcome)
	}
	return first
}

func TestClaimOutcomes(t *testing.T) {
	t.Parallel()
	db := ledgertest.New(t)
	first := claimNewThenRefused(t, db, "k1", "h1", "h2")
	if err := ledger.Complete(ctx, db.Pool, "k1", first.Row.ClaimedAt, 201, json.RawMessage(`{"id":"T-1"}`)); err != nil {
		t.Fatal(err)
	}
	got := claim(t, db.Pool, "k1", "h1")
	if got.Outcome != ledger.Replay || *got.Row.ResponseCode != 201 || string(got.Row.ResponseBody) != `{"id": "T-1"}` {
		t.Fatalf("replay = %v %v %s", got.Outcome, got.Row.ResponseCode, got.Row.ResponseBody)
	}
	// Completed is terminal for Complete too.
	if err := ledger.Complete(ctx, db.Pool, "k1", first.Row.ClaimedAt, 500, nil); !errors.Is(err, ledger.ErrConflict) {
		t.Fatalf("second complete err = %v", err)
	}
	if n := db.Count(t, "idempotency_keys"); n != 1 {
		t.Fatalf("rows = %d", n)
	}
}

func TestClaimValidates(t *testing.T) {
	t.Parallel()
	db := ledgertest.New(t)
	long := string(make([]byte, 129))
	for _, p := range []ledger.ClaimParams{
		{Key: "", Tool: "t", RequestHash: "h"},
		{Key: long, Tool: "t", RequestHash: "h"},
		{Key: "k", Tool: "", RequestHash: "h"},
		{Key: "k", Tool: "t", RequestHash: ""},
		{Key: "k", Tool: "t", RequestHash: "h", RequestBody: json.RawMessage(`{nope`)},
	} {
		if _, err := ledger.Claim(ctx, db.Pool, p); !errors.Is(err, ledger.ErrInvalid) {
			t.Errorf("claim %+v: err = %v, want ErrInvalid", p, err)
		}
	}
	if n := db.Count(t, "idempotency_keys"); n != 0 {
		t.Fatalf("rows = %d", n)
	}
}

func TestReclaimFailedRetryable(t *testing.T) {
	t.Parallel()
	db := ledgertest.New(t)
	first := claim(t, db.Pool, "k", "h")
	age(t, db, "k", time.Minute)
	first.Row, _ = ledger.Get(ctx, db.Pool, "k")
	if err := ledger.Abandon(ctx, db.Pool, "k", first.Row.ClaimedAt); err != nil {
		t.Fatal(err)
	}
	// Other arguments may not re-claim it.
	if got := claim(t, db.Pool, "k", "other"); got.Outcome != ledger.FingerprintMismatch {
		t.Fatalf("mismatch re-claim = %v", got.Outcome)
	}
	second := claim(t, db.Pool, "k", "h")
	if second.Outcome != ledger.New || !second.Row.ClaimedAt.After(first.Row.ClaimedAt) {
		t.Fatalf("re-claim = %v, claimed_at %v -> %v", second.Outcome, first.Row.ClaimedAt, second.Row.ClaimedAt)
	}
	// The first attempt no longer owns the key.
	if err := ledger.Complete(ctx, db.Pool, "k", first.Row.ClaimedAt, 200, nil); !errors.Is(err, ledger.ErrConflict) {
		t.Fatalf("stale complete err = %v", err)
	}
	if err := ledger.Heartbeat(ctx, db.Pool, "k", first.Row.ClaimedAt); !errors.Is(err, ledger.ErrConflict) {
		t.Fatalf("stale heartbeat err = %v", err)
	}
	if err := ledger.Heartbeat(ctx, db.Pool, "k", second.Row.ClaimedAt); err != nil {
		t.Fatal(err)
	}
}

// claimAtOnce runs n claims with p released together and counts their
// outcomes.
func claimAtOnce(t *testing.T, db ledger.DBTX, n int, p ledger.ClaimParams) map[ledger.Outcome]int {
	t.Helper()
	gate := make(chan struct{})
	results := make(chan ledger.Outcome, n)
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-gate
			res, err := ledger.Claim(ctx, db, p)
			if err != nil {
				t.Error(err)
				return
			}
			results <- res.Outcome
		}()
	}
	close(gate)
	testwait.Wait(t, &wg, testwait.Timeout)
	close(results)
	counts := map[ledger.Outcome]int{}
	for o := range results {
		counts[o]++
	}
	return counts
}

func TestConcurrentReclaimOneWinner(t *testing.T) {
	t.Parallel()
	db := ledgertest.New(t)
	first := claim(t, db.Pool, "k", "h")
	if err := ledger.Abandon(ctx, db.Pool, "k", first.Row.ClaimedAt); err != nil {
		t.Fatal(err)
	}
	const n = 20
	counts := claimAtOnce(t, db.Pool, n, ledger.ClaimParams{Key: "k", Tool: "create_ticket", RequestHash: "h"})
	if counts[ledger.New] != 1 || counts[ledger.InFlight] != n-1 {
		t.Fatalf("outcomes = %v", counts)
	}
}

// TestConcurrentFirstClaimOneWinner: many claims of a key nobody holds yet,
// at once: one is New, the others find it in flight (those whose snapshot
// predates the winner's commit go round again), and there is one row.
func TestConcurrentFirstClaimOneWinner(t *testing.T) {
	t.Parallel()
	db := ledgertest.New(t)
	// Several rounds: a claim whose snapshot predates the winner's commit
	// is a race, hit in some rounds only.
	const n, rounds = 50, 10
	for r := range rounds {
		key := fmt.Sprintf("k%d", r)
		counts := claimAtOnce(t, db.Pool, n, ledger.ClaimParams{Key: key, Tool: "create_ticket", RequestHash: "h"})
		if counts[ledger.New] != 1 || counts[ledger.InFlight] != n-1 {
			t.Fatalf("%s: outcomes = %v", key, counts)
		}
	}
	if got := db.Count(t, "idempotency_keys WHERE status = 'processing'"); got != rounds {
		t.Fatalf("%d processing rows, want %d", got, rounds)
	}
}

// statementCounter counts the statements a pool sends.
type statementCounter struct{ n atomic.Int64 }

func (c *statementCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}

func (c *statementCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TestClaimIsOneStatement: whatever the claim finds (a new key, a replay,
// a key in flight, other arguments, a re-claim), it costs one round trip.
// In its Citus shape (ledgertest's Citus mode), a claim costs one and any
// other outcome two: the upsert, then the read of the row it did not
// claim.
func TestClaimIsOneStatement(t *testing.T) {
	t.Parallel()
	db := ledgertest.New(t)
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	counter := &statementCounter{}
	cfg.ConnConfig.Tracer = counter
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	step := func(what, key, hash string, want ledger.Outcome) ledger.ClaimResult {
		t.Helper()
		before := counter.n.Load()
		res := claim(t, pool, key, hash)
		if res.Outcome != want {
			t.Fatalf("%s: outcome %v, want %v", what, res.Outcome, want)
		}
		wantN := int64(1)
		if ledgertest.Citus() && want != ledger.New {
			wantN = 2
		}
		if n := counter.n.Load() - before; n != wantN {
			t.Fatalf("%s: %d statements, want %d", what, n, wantN)
		}
		return res
	}
	first := step("new key", "k", "h", ledger.New)
	step("in flight", "k", "h", ledger.InFlight)
	step("other arguments", "k", "other", ledger.FingerprintMismatch)
	if err := ledger.Abandon(ctx, pool, "k", first.Row.ClaimedAt); err != nil {
		t.Fatal(err)
	}
	second := step("re-claim", "k", "h", ledger.New)
	if !second.Row.ClaimedAt.After(first.Row.ClaimedAt) || second.Row.Status != ledger.StatusProcessing {
		t.Fatalf("re-claim row = %+v", second.Row)
	}
	if err := ledger.Complete(ctx, pool, "k", second.Row.ClaimedAt, 201, json.RawMessage(`{"id":"T-1"}`)); err != nil {
		t.Fatal(err)
	}
	replay := step("replay", "k", "h", ledger.Replay)
	if *replay.Row.ResponseCode != 201 || string(replay.Row.ResponseBody) != `{"id": "T-1"}` {
		t.Fatalf("replay row = %v %s", replay.Row.ResponseCode, replay.Row.ResponseBody)
	}
}

// The claim's Citus shape (UseCitusShapes) is plain SQL that PostgreSQL
// runs too: here, on whichever engine the suite has, its outcomes and its
// one winner among concurrent first claims and concurrent re-claims. Not
// parallel: the shape is chosen per process, and both are correct, so
// the parallel tests paused meanwhile are not affected by it either.
func TestCitusClaimShapeKeepsOneWinner(t *testing.T) {
	was := ledgertest.Citus()
	ledger.UseCitusShapes(true)
	t.Cleanup(func() { ledger.UseCitusShapes(was) })
	db := ledgertest.New(t)
	first := claimNewThenRefused(t, db, "k1", "h1", "h2")
	if err := ledger.Abandon(ctx, db.Pool, "k1", first.Row.ClaimedAt); err != nil {
		t.Fatal(err)
	}
	if got := claim(t, db.Pool, "k1", "h2"); got.Outcome != ledger.FingerprintMismatch {
		t.Fatalf("a failed_retryable key with other arguments = %v, want a mismatch", got.Outcome)
	}
	const n = 20
	counts := claimAtOnce(t, db.Pool, n, ledger.ClaimParams{Key: "k1", Tool: "create_ticket", RequestHash: "h1"})
	if counts[ledger.New] != 1 || counts[ledger.InFlight] != n-1 {
		t.Fatalf("concurrent re-claims: outcomes = %v", counts)
	}
	re, err := ledger.Get(ctx, db.Pool, "k1")
	if err != nil {
		t.Fatal(err)
	}
	if !re.ClaimedAt.After(first.Row.ClaimedAt) || re.Status != ledger.StatusProcessing || re.ResponseCode != nil {
		t.Fatalf("re-claimed row = %+v", re)
	}
	if err := ledger.Complete(ctx, db.Pool, "k1", re.ClaimedAt, 201, json.RawMessage(`{"id":"T-1"}`)); err != nil {
		t.Fatal(err)
	}
	if got := claim(t, db.Pool, "k1", "h1"); got.Outcome != ledger.Replay || *got.Row.ResponseCode != 201 {
		t.Fatalf("replay = %v %v", got.Outcome, got.Row.ResponseCode)
	}
	for r := range 5 {
		key := fmt.Sprintf("first-%d", r)
		counts := claimAtOnce(t, db.Pool, n, ledger.ClaimParams{Key: key, Tool: "create_ticket", RequestHash: "h"})
		if counts[ledger.New] != 1 || counts[ledger.InFlight] != n-1 {
			t.Fatalf("%s: concurrent first claims: outcomes = %v", key, counts)
		}
	}
	if got := db.Count(t, "idempotency_keys"); got != 6 {
		t.Fatalf("%d rows, want 6", got)
	}
}

func TestOriginalCompletesAfterMarkedRetryable(t *testing.T) {
	t.Parallel()
	db := ledgertest.New(t)
	first := claim(t, db.Pool, "k", "h")
	if err := ledger.Abandon(ctx, db.Pool, "k", first.Row.ClaimedAt); err != nil {
		t.Fatal(err)
	}
	// Not re-claimed yet: the original attempt's real outcome wins.
	if err := ledger.Complete(ctx, db.Pool, "k", first.Row.ClaimedAt, 201, json.RawMessage(`{"id":1}`)); err != nil {
		t.Fatal(err)
	}
	k, _ := ledger.Get(ctx, db.Pool, "k")
	if k.Status != ledger.StatusCompleted {
		t.Fatalf("status = %s", k.Status)
	}
}

func TestFingerprintCanonical(t *testing.T) {
	t.Parallel()
	a, err := ledger.Fingerprint([]byte(`{"title":"SSO broken","account_id":"A-1029","n":[1,2,{"b":1,"a":2}]}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := ledger.Fingerprint([]byte("{ \"n\" : [1, 2, {\"a\":2, \"b\":1}],\n\"account_id\":\"A-1029\", \"title\":\"SSO broken\" }"))
	c, _ := ledger.Fingerprint([]byte(`{"title":"SSO broken!","account_id":"A-1029","n":[1,2,{"b":1,"a":2}]}`))
	if a != b || a == c || len(a) != 64 {
		t.Fatalf("a=%s b=%s c=%s", a, b, c)
	}
	for _, bad := range []string{`{`, `{"a":1} {"b":2}`, `nope`} {
		if _, err := ledger.Fingerprint([]byte(bad)); !errors.Is(err, ledger.ErrInvalid) {
			t.Errorf("%q: err = %v", bad, err)
		}
	}
}
