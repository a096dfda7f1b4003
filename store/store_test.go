package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/ledger/ledgertest/testwait"
	"github.com/ledgerkeeper/ledgerkeeper/store"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

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
func age(t *testing.T, db *pgtest.DB, key string, d time.Duration) {
	t.Helper()
	db.Exec(t, `UPDATE idempotency_keys SET claimed_at = now() - $2::interval, created_at = now() - $2::interval WHERE key = $1`, key, d)
}

func lease(t *testing.T, db ledger.DBTX, owner string, p store.LeaseParams) []store.Leased {
	t.Helper()
	if p.Tool == "" {
		p.Tool = "create_ticket"
	}
	if p.Limit == 0 {
		p.Limit = 100
	}
	p.Owner = owner
	if p.Lease == 0 {
		p.Lease = time.Minute
	}
	if p.Window == 0 {
		p.Window = 30 * time.Second
	}
	if p.HeartbeatTimeout == 0 {
		p.HeartbeatTimeout = 30 * time.Second
	}
	got, err := store.LeaseDue(ctx, db, p)
	if err != nil {
		t.Fatalf("lease: %v", err)
	}
	return got
}

func keysOf(ls []store.Leased) []string {
	out := make([]string, len(ls))
	for i, l := range ls {
		out[i] = l.Key.Key
	}
	return out
}

func TestLeaseDueRules(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	for _, k := range []string{"old", "young", "beating", "held", "done", "other-tool"} {
		claim(t, db.Pool, k, "h")
	}
	age(t, db, "old", time.Minute)
	age(t, db, "beating", time.Minute)
	age(t, db, "held", time.Minute)
	age(t, db, "done", time.Minute)
	db.Exec(t, `UPDATE idempotency_keys SET tool = 'other', claimed_at = now() - interval '1 minute' WHERE key = 'other-tool'`)
	db.Exec(t, `UPDATE idempotency_keys SET heartbeat_at = now() WHERE key = 'beating'`)
	db.Exec(t, `INSERT INTO key_holds (key, reason, actor) VALUES ('held', 'investigating', 'alice')`)
	db.Exec(t, `UPDATE idempotency_keys SET status = 'completed' WHERE key = 'done'`)

	got := lease(t, db.Pool, "a", store.LeaseParams{})
	if ks := keysOf(got); len(ks) != 1 || ks[0] != "old" {
		t.Fatalf("leased %v, want [old]", ks)
	}
	if got[0].RequestBody == nil || got[0].Attempts != 0 {
		t.Fatalf("leased row = %+v", got[0])
	}
	// Leased: nobody else gets it, not even with IgnoreBackoff.
	if ks := keysOf(lease(t, db.Pool, "b", store.LeaseParams{IgnoreBackoff: true})); len(ks) != 0 {
		t.Fatalf("second leaser got %v", ks)
	}
	// A released lease is due again at once, attempts untouched.
	if err := store.ReleaseLease(ctx, db.Pool, "old", "a"); err != nil {
		t.Fatal(err)
	}
	if ks := keysOf(lease(t, db.Pool, "b", store.LeaseParams{})); len(ks) != 1 {
		t.Fatalf("after release got %v", ks)
	}
	// An expired lease is due again.
	db.Exec(t, `UPDATE reconcile_state SET lease_expires_at = now() - interval '1 second'`)
	if ks := keysOf(lease(t, db.Pool, "c", store.LeaseParams{})); len(ks) != 1 {
		t.Fatalf("after expiry got %v", ks)
	}
	// The other tool's key is found under its own name.
	if ks := keysOf(lease(t, db.Pool, "c", store.LeaseParams{Tool: "other"})); len(ks) != 1 || ks[0] != "other-tool" {
		t.Fatalf("other tool got %v", ks)
	}
	tools, err := store.ProcessingTools(ctx, db.Pool)
	if err != nil || fmt.Sprint(tools) != "[create_ticket other]" {
		t.Fatalf("tools = %v, %v", tools, err)
	}
}

func TestLeaseExclusiveUnderConcurrency(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	db.Exec(t, `INSERT INTO idempotency_keys (key, tool, request_hash, claimed_at, expires_at)
		SELECT 'k' || g, 'create_ticket', 'h', now() - interval '1 hour', now() + interval '1 day' FROM generate_series(1, 300) g`)
	pools := []*pgxpool.Pool{db.Pool, newPool(t, db.URL)}
	const leasers = 6
	seen := make(chan string, 1000)
	var wg sync.WaitGroup
	gate := make(chan struct{})
	for i := range leasers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-gate
			for {
				got, err := store.LeaseDue(ctx, pools[i%2], store.LeaseParams{Tool: "create_ticket", Window: time.Second,
					HeartbeatTimeout: time.Second, Owner: fmt.Sprint("owner", i), Lease: time.Hour, Limit: 7})
				if err != nil {
					t.Error(err)
					return
				}
				if len(got) == 0 {
					return
				}
				for _, l := range got {
					seen <- l.Key.Key
				}
			}
		}()
	}
	close(gate)
	// The bound is for a hang, not a speed test: on Citus the lease is a
	// candidate read and a compare-and-set through the coordinator, 6.6-12 s
	// for these 300 keys on a loaded two-core machine (0.56 s on PostgreSQL).
	bound := testwait.Timeout
	if pgtest.Citus() {
		bound = 2 * time.Minute
	}
	testwait.Wait(t, &wg, bound)
	close(seen)
	count := map[string]int{}
	for k := range seen {
		count[k]++
	}
	if len(count) != 300 {
		t.Fatalf("leased %d distinct keys, want 300", len(count))
	}
	for k, n := range count {
		if n != 1 {
			t.Fatalf("key %s leased %d times", k, n)
		}
	}
}

func newPool(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	p, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

func decide(t *testing.T, db *pgtest.DB, d store.Decision) store.DecideResult {
	t.Helper()
	var res store.DecideResult
	err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		var err error
		res, err = store.Decide(ctx, tx, d)
		return err
	})
	if err != nil {
		t.Fatalf("decide: %v", err)
	}
	return res
}

func TestDecideCompareAndSet(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	for _, k := range []string{"found", "raced", "gone", "held", "stolen"} {
		claim(t, db.Pool, k, "h")
		age(t, db, k, time.Minute)
	}
	leased := lease(t, db.Pool, "me", store.LeaseParams{})
	if len(leased) != 5 {
		t.Fatalf("leased %d", len(leased))
	}
	at := map[string]time.Time{}
	for _, l := range leased {
		at[l.Key.Key] = l.ClaimedAt
	}
	base := store.Decision{Tool: "create_ticket", Owner: "me", Actor: "replica-1", Verdict: "found",
		Transition: ledger.StatusCompleted, ResponseCode: 201, ResponseBody: json.RawMessage(`{"ticket_id":"T-9"}`), Action: "completed", CountAttempt: true}

	d := base
	d.Key, d.ClaimedAt = "found", at["found"]
	if res := decide(t, db, d); !res.Applied || res.Current.Status != ledger.StatusCompleted || res.Attempts != 1 {
		t.Fatalf("found: %+v", res)
	}

	// The original attempt finishes while the probe runs: its outcome stays.
	if err := ledger.Complete(ctx, db.Pool, "raced", at["raced"], 200, json.RawMessage(`{"orig":true}`)); err != nil {
		t.Fatal(err)
	}
	d = base
	d.Key, d.ClaimedAt = "raced", at["raced"]
	if res := decide(t, db, d); res.Applied || res.Action != "resolved_by_original" {
		t.Fatalf("raced: %+v", res)
	}
	k, _ := ledger.Get(ctx, db.Pool, "raced")
	if string(k.ResponseBody) != `{"orig": true}` {
		t.Fatalf("original outcome overwritten: %s", k.ResponseBody)
	}

	// The row vanished meanwhile.
	db.Exec(t, `DELETE FROM idempotency_keys WHERE key = 'gone'`)
	d = base
	d.Key, d.ClaimedAt, d.Transition = "gone", at["gone"], ledger.StatusFailedRetryable
	if res := decide(t, db, d); res.Applied || res.Action != "resolved_by_original" {
		t.Fatalf("gone: %+v", res)
	}

	// Put on hold while the probe ran.
	db.Exec(t, `INSERT INTO key_holds (key, reason, actor) VALUES ('held', 'r', 'op')`)
	d = base
	d.Key, d.ClaimedAt = "held", at["held"]
	if res := decide(t, db, d); res.Applied || res.Action != "held" {
		t.Fatalf("held: %+v", res)
	}

	// Another reconciler took over the lease: we write nothing.
	db.Exec(t, `UPDATE reconcile_state SET lease_owner = 'thief' WHERE key = 'stolen'`)
	d = base
	d.Key, d.ClaimedAt = "stolen", at["stolen"]
	if res := decide(t, db, d); res.Applied || res.Action != "lease_lost" {
		t.Fatalf("stolen: %+v", res)
	}
	k, _ = ledger.Get(ctx, db.Pool, "stolen")
	if k.Status != ledger.StatusProcessing {
		t.Fatalf("stolen status = %s", k.Status)
	}

	// Audit: one row per decision except lease_lost.
	if n := db.Count(t, "reconcile_audit"); n != 4 {
		t.Fatalf("audit rows = %d, want 4", n)
	}
	hist, err := store.History(ctx, db.Pool, "raced", 10)
	if err != nil || len(hist) != 1 || hist[0].Action != "resolved_by_original" || hist[0].Actor != "replica-1" {
		t.Fatalf("history = %+v, %v", hist, err)
	}
}

func TestDecideBackoffAndNotFoundConfirmation(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	claim(t, db.Pool, "k", "h")
	age(t, db, "k", time.Minute)
	l := lease(t, db.Pool, "me", store.LeaseParams{})[0]
	res := decide(t, db, store.Decision{Key: "k", Tool: "create_ticket", ClaimedAt: l.ClaimedAt, Owner: "me", Actor: "r",
		Verdict: "not_found", Action: "awaiting_confirmation", NextProbeIn: time.Hour, CountAttempt: true, NotFoundSeen: true})
	if !res.Applied || res.Attempts != 1 {
		t.Fatalf("res = %+v", res)
	}
	st, err := store.GetState(ctx, db.Pool, "k")
	if err != nil || st.FirstNotFoundAt == nil || st.NextProbeAt == nil || st.LeaseOwner != nil {
		t.Fatalf("state = %+v, %v", st, err)
	}
	// Backed off: not due, unless forced (operator --key).
	if ks := keysOf(lease(t, db.Pool, "me2", store.LeaseParams{})); len(ks) != 0 {
		t.Fatalf("backed-off key leased: %v", ks)
	}
	forced := lease(t, db.Pool, "me2", store.LeaseParams{IgnoreBackoff: true, Keys: []string{"k"}})
	if len(forced) != 1 || forced[0].Attempts != 1 || forced[0].FirstNotFoundAt == nil {
		t.Fatalf("forced = %+v", forced)
	}
	// An unknown keeps the earlier not_found.
	decide(t, db, store.Decision{Key: "k", Tool: "create_ticket", ClaimedAt: l.ClaimedAt, Owner: "me2", Actor: "r",
		Verdict: "unknown", Action: "backoff", Error: "timeout", NextProbeIn: time.Minute, CountAttempt: true})
	st, _ = store.GetState(ctx, db.Pool, "k")
	if st.FirstNotFoundAt == nil || st.Attempts != 2 || *st.LastError != "timeout" {
		t.Fatalf("state after unknown = %+v", st)
	}
}

func TestReclaimResetsBookkeeping(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	claim(t, db.Pool, "k", "h")
	age(t, db, "k", time.Minute)
	l := lease(t, db.Pool, "me", store.LeaseParams{})[0]
	decide(t, db, store.Decision{Key: "k", Tool: "create_ticket", ClaimedAt: l.ClaimedAt, Owner: "me", Actor: "r",
		Verdict: "not_found", Transition: ledger.StatusFailedRetryable, Action: "marked_retryable", CountAttempt: true})
	again := claim(t, db.Pool, "k", "h")
	if again.Outcome != ledger.New {
		t.Fatalf("retry = %v", again.Outcome)
	}
	age(t, db, "k", time.Minute)
	l2 := lease(t, db.Pool, "me", store.LeaseParams{})
	if len(l2) != 1 || l2[0].Attempts != 0 || l2[0].FirstNotFoundAt != nil {
		t.Fatalf("fresh claim bookkeeping = %+v", l2)
	}
}

func TestHolds(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	claim(t, db.Pool, "k", "h")
	err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error { return store.PutHold(ctx, tx, "k", "looking at it", "alice") })
	if err != nil {
		t.Fatal(err)
	}
	err = pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error { return store.PutHold(ctx, tx, "missing", "x", "alice") })
	if !errors.Is(err, ledger.ErrNotFound) {
		t.Fatalf("hold of a missing key: %v", err)
	}
	holds, err := store.ListHolds(ctx, db.Pool)
	if err != nil || len(holds) != 1 || holds[0].Reason != "looking at it" || holds[0].Tool != "create_ticket" {
		t.Fatalf("holds = %+v %v", holds, err)
	}
	if err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error { return store.ReleaseHold(ctx, tx, "k", "bob") }); err != nil {
		t.Fatal(err)
	}
	err = pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error { return store.ReleaseHold(ctx, tx, "k", "bob") })
	if !errors.Is(err, ledger.ErrNotFound) {
		t.Fatalf("second release: %v", err)
	}
	hist, _ := store.History(ctx, db.Pool, "k", 10)
	if len(hist) != 2 || hist[0].Action != "hold" || hist[1].Action != "release" || hist[1].Actor != "bob" {
		t.Fatalf("history = %+v", hist)
	}
}

func TestStats(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	for _, k := range []string{"a", "b", "c", "d"} {
		claim(t, db.Pool, k, "h")
	}
	age(t, db, "a", time.Hour)
	age(t, db, "b", time.Minute)
	db.Exec(t, `UPDATE idempotency_keys SET status = 'completed' WHERE key = 'c'`)
	db.Exec(t, `INSERT INTO key_holds (key, reason, actor) VALUES ('a', 'r', 'op')`)
	stats, err := store.Stats(ctx, db.Pool, func(string) (time.Duration, time.Duration) { return 30 * time.Second, 30 * time.Second })
	if err != nil || len(stats) != 1 {
		t.Fatalf("stats = %+v, %v", stats, err)
	}
	s := stats[0]
	if s.Stuck != 1 || s.InWindow != 1 || s.Completed != 1 || s.Held != 1 || s.OldestStuckAgeSeconds < 50 || s.OldestStuckAgeSeconds > 3500 {
		t.Fatalf("stats = %+v", s)
	}
}

// A decision about an old claim never touches the bookkeeping or the live
// lease of the key's new claim.
func TestStaleDecisionLeavesNewClaimAlone(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	claim(t, db.Pool, "k", "h")
	age(t, db, "k", time.Minute)
	old := lease(t, db.Pool, "replica-a", store.LeaseParams{})[0]
	// The first claim is abandoned and re-claimed; replica B leases the new one.
	if err := ledger.Abandon(ctx, db.Pool, "k", old.ClaimedAt); err != nil {
		t.Fatal(err)
	}
	claim(t, db.Pool, "k", "h")
	age(t, db, "k", 2*time.Minute)
	fresh := lease(t, db.Pool, "replica-b", store.LeaseParams{})
	if len(fresh) != 1 {
		t.Fatalf("new claim not leased: %+v", fresh)
	}
	// A's stale decision arrives.
	res := decide(t, db, store.Decision{Key: "k", Tool: "create_ticket", ClaimedAt: old.ClaimedAt, Owner: "replica-a", Actor: "a",
		Verdict: "found", Transition: ledger.StatusCompleted, ResponseCode: 200, ResponseBody: json.RawMessage(`{}`), Action: "completed", CountAttempt: true})
	if res.Applied || res.Action != store.ActionResolvedByOriginal {
		t.Fatalf("stale decision: %+v", res)
	}
	st, err := store.GetState(ctx, db.Pool, "k")
	if err != nil || st.LeaseOwner == nil || *st.LeaseOwner != "replica-b" || !st.ClaimedAt.Equal(fresh[0].ClaimedAt) {
		t.Fatalf("new claim's lease clobbered: %+v %v", st, err)
	}
	if got := lease(t, db.Pool, "replica-c", store.LeaseParams{}); len(got) != 0 {
		t.Fatalf("a third replica leased a key B holds: %+v", got)
	}
}

// ExtendLeases renews only the leases the owner still holds: a key another
// replica leased since, or one given back, is not renewed.
func TestExtendLeasesRenewsOnlyTheOwnersLeases(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	for _, k := range []string{"mine", "taken", "given-back"} {
		db.Exec(t, `INSERT INTO idempotency_keys (key, tool, request_hash, expires_at) VALUES ($1, 't', 'h', now() + interval '1 day')`, k)
		db.Exec(t, `INSERT INTO reconcile_state (key, tool, claimed_at, lease_owner, lease_expires_at)
			SELECT key, tool, claimed_at, 'a/1', now() - interval '1 second' FROM idempotency_keys WHERE key = $1`, k)
	}
	db.Exec(t, `UPDATE reconcile_state SET lease_owner = 'b/2', lease_expires_at = now() + interval '1 minute' WHERE key = 'taken'`)
	db.Exec(t, `UPDATE reconcile_state SET lease_owner = NULL, lease_expires_at = NULL WHERE key = 'given-back'`)
	got, err := store.ExtendLeases(context.Background(), db.Pool, []string{"mine", "taken", "given-back"}, "a/1", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0] != "mine" {
		t.Fatalf("renewed %v, want [mine]", got)
	}
	if n := db.Count(t, `reconcile_state WHERE key = 'mine' AND lease_expires_at > now() + interval '50 seconds'`); n != 1 {
		t.Fatal("the owner's lease was not renewed")
	}
	if n := db.Count(t, `reconcile_state WHERE key = 'taken' AND lease_owner = 'b/2'`); n != 1 {
		t.Fatal("another holder's lease was touched")
	}
}

// A lease says the tool's due keys ran out only when it found fewer than
// it asked for: a full batch may have more behind it, a short one has not.
func TestLeaseDueSaysWhenTheDueKeysRanOut(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	for _, k := range []string{"k1", "k2", "k3"} {
		claim(t, db.Pool, k, "h")
		age(t, db, k, time.Minute)
	}
	p := store.LeaseParams{Tool: "create_ticket", Window: 30 * time.Second, HeartbeatTimeout: 30 * time.Second, Owner: "a", Lease: time.Minute, Limit: 2}
	got, drained, err := store.LeaseDueDrained(ctx, db.Pool, p)
	if err != nil || len(got) != 2 || drained {
		t.Fatalf("first lease of 2 over 3 due keys: %d keys, drained %v, %v; want 2 keys, not drained", len(got), drained, err)
	}
	got, drained, err = store.LeaseDueDrained(ctx, db.Pool, p)
	if err != nil || len(got) != 1 || !drained {
		t.Fatalf("second lease of 2 over the 1 key left: %d keys, drained %v, %v; want 1 key, drained", len(got), drained, err)
	}
	got, drained, err = store.LeaseDueDrained(ctx, db.Pool, p)
	if err != nil || len(got) != 0 || !drained {
		t.Fatalf("a lease with nothing due: %d keys, drained %v, %v; want none, drained", len(got), drained, err)
	}
}

// A decision's transaction runs its statements with generic plans, and
// only it: the connection's setting is back once it ends. On Citus it
// leaves the setting alone (Citus cannot plan the decisions' locking read
// generically).
func TestDecisionTransactionsUseGenericPlansOnly(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	conn, err := db.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	var inside, after string
	_, _, err = store.TxAt(ctx, conn.Conn(), nil, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, `SELECT current_setting('plan_cache_mode')`).Scan(&inside)
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := conn.QueryRow(ctx, `SELECT current_setting('plan_cache_mode')`).Scan(&after); err != nil {
		t.Fatal(err)
	}
	want := "force_generic_plan"
	if pgtest.Citus() {
		want = "auto"
	}
	if inside != want || after != "auto" {
		t.Errorf("plan_cache_mode inside the transaction %q, after it %q; want %s, then auto", inside, after, want)
	}
}
