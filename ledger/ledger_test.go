package ledger_test

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
	"github.com/ledgerkeeper/ledgerkeeper/internal/testwait"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
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

func TestClaimOutcomes(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	first := claim(t, db.Pool, "k1", "h1")
	if first.Outcome != ledger.New || first.Row.Status != ledger.StatusProcessing {
		t.Fatalf("first claim = %v %s", first.Outcome, first.Row.Status)
	}
	if got := claim(t, db.Pool, "k1", "h1"); got.Outcome != ledger.InFlight {
		t.Fatalf("second claim = %v, want in_flight", got.Outcome)
	}
	if got := claim(t, db.Pool, "k1", "h2"); got.Outcome != ledger.FingerprintMismatch {
		t.Fatalf("other fingerprint = %v", got.Outcome)
	}
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
	db := pgtest.New(t)
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
	db := pgtest.New(t)
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

func TestConcurrentReclaimOneWinner(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	first := claim(t, db.Pool, "k", "h")
	if err := ledger.Abandon(ctx, db.Pool, "k", first.Row.ClaimedAt); err != nil {
		t.Fatal(err)
	}
	const n = 20
	gate := make(chan struct{})
	results := make(chan ledger.Outcome, n)
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-gate
			res, err := ledger.Claim(ctx, db.Pool, ledger.ClaimParams{Key: "k", Tool: "create_ticket", RequestHash: "h"})
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
	if counts[ledger.New] != 1 || counts[ledger.InFlight] != n-1 {
		t.Fatalf("outcomes = %v", counts)
	}
}

func TestOriginalCompletesAfterMarkedRetryable(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
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

func lease(t *testing.T, db ledger.DBTX, owner string, p ledger.LeaseParams) []ledger.Leased {
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
	got, err := ledger.LeaseDue(ctx, db, p)
	if err != nil {
		t.Fatalf("lease: %v", err)
	}
	return got
}

func keysOf(ls []ledger.Leased) []string {
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

	got := lease(t, db.Pool, "a", ledger.LeaseParams{})
	if ks := keysOf(got); len(ks) != 1 || ks[0] != "old" {
		t.Fatalf("leased %v, want [old]", ks)
	}
	if got[0].RequestBody == nil || got[0].Attempts != 0 {
		t.Fatalf("leased row = %+v", got[0])
	}
	// Leased: nobody else gets it, not even with IgnoreBackoff.
	if ks := keysOf(lease(t, db.Pool, "b", ledger.LeaseParams{IgnoreBackoff: true})); len(ks) != 0 {
		t.Fatalf("second leaser got %v", ks)
	}
	// A released lease is due again at once, attempts untouched.
	if err := ledger.ReleaseLease(ctx, db.Pool, "old", "a"); err != nil {
		t.Fatal(err)
	}
	if ks := keysOf(lease(t, db.Pool, "b", ledger.LeaseParams{})); len(ks) != 1 {
		t.Fatalf("after release got %v", ks)
	}
	// An expired lease is due again.
	db.Exec(t, `UPDATE reconcile_state SET lease_expires_at = now() - interval '1 second'`)
	if ks := keysOf(lease(t, db.Pool, "c", ledger.LeaseParams{})); len(ks) != 1 {
		t.Fatalf("after expiry got %v", ks)
	}
	// The other tool's key is found under its own name.
	if ks := keysOf(lease(t, db.Pool, "c", ledger.LeaseParams{Tool: "other"})); len(ks) != 1 || ks[0] != "other-tool" {
		t.Fatalf("other tool got %v", ks)
	}
	tools, err := ledger.ProcessingTools(ctx, db.Pool, 30*time.Second)
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
				got, err := ledger.LeaseDue(ctx, pools[i%2], ledger.LeaseParams{Tool: "create_ticket", Window: time.Second,
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
	testwait.Wait(t, &wg, testwait.Timeout)
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

func decide(t *testing.T, db *pgtest.DB, d ledger.Decision) ledger.DecideResult {
	t.Helper()
	var res ledger.DecideResult
	err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		var err error
		res, err = ledger.Decide(ctx, tx, d)
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
	leased := lease(t, db.Pool, "me", ledger.LeaseParams{})
	if len(leased) != 5 {
		t.Fatalf("leased %d", len(leased))
	}
	at := map[string]time.Time{}
	for _, l := range leased {
		at[l.Key.Key] = l.ClaimedAt
	}
	base := ledger.Decision{Tool: "create_ticket", Owner: "me", Actor: "replica-1", Verdict: "found",
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
	hist, err := ledger.History(ctx, db.Pool, "raced", 10)
	if err != nil || len(hist) != 1 || hist[0].Action != "resolved_by_original" || hist[0].Actor != "replica-1" {
		t.Fatalf("history = %+v, %v", hist, err)
	}
}

func TestDecideBackoffAndNotFoundConfirmation(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	claim(t, db.Pool, "k", "h")
	age(t, db, "k", time.Minute)
	l := lease(t, db.Pool, "me", ledger.LeaseParams{})[0]
	res := decide(t, db, ledger.Decision{Key: "k", Tool: "create_ticket", ClaimedAt: l.ClaimedAt, Owner: "me", Actor: "r",
		Verdict: "not_found", Action: "awaiting_confirmation", NextProbeIn: time.Hour, CountAttempt: true, NotFoundSeen: true})
	if !res.Applied || res.Attempts != 1 {
		t.Fatalf("res = %+v", res)
	}
	st, err := ledger.GetState(ctx, db.Pool, "k")
	if err != nil || st.FirstNotFoundAt == nil || st.NextProbeAt == nil || st.LeaseOwner != nil {
		t.Fatalf("state = %+v, %v", st, err)
	}
	// Backed off: not due, unless forced (operator --key).
	if ks := keysOf(lease(t, db.Pool, "me2", ledger.LeaseParams{})); len(ks) != 0 {
		t.Fatalf("backed-off key leased: %v", ks)
	}
	forced := lease(t, db.Pool, "me2", ledger.LeaseParams{IgnoreBackoff: true, Keys: []string{"k"}})
	if len(forced) != 1 || forced[0].Attempts != 1 || forced[0].FirstNotFoundAt == nil {
		t.Fatalf("forced = %+v", forced)
	}
	// An unknown keeps the earlier not_found.
	decide(t, db, ledger.Decision{Key: "k", Tool: "create_ticket", ClaimedAt: l.ClaimedAt, Owner: "me2", Actor: "r",
		Verdict: "unknown", Action: "backoff", Error: "timeout", NextProbeIn: time.Minute, CountAttempt: true})
	st, _ = ledger.GetState(ctx, db.Pool, "k")
	if st.FirstNotFoundAt == nil || st.Attempts != 2 || *st.LastError != "timeout" {
		t.Fatalf("state after unknown = %+v", st)
	}
}

func TestReclaimResetsBookkeeping(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	claim(t, db.Pool, "k", "h")
	age(t, db, "k", time.Minute)
	l := lease(t, db.Pool, "me", ledger.LeaseParams{})[0]
	decide(t, db, ledger.Decision{Key: "k", Tool: "create_ticket", ClaimedAt: l.ClaimedAt, Owner: "me", Actor: "r",
		Verdict: "not_found", Transition: ledger.StatusFailedRetryable, Action: "marked_retryable", CountAttempt: true})
	again := claim(t, db.Pool, "k", "h")
	if again.Outcome != ledger.New {
		t.Fatalf("retry = %v", again.Outcome)
	}
	age(t, db, "k", time.Minute)
	l2 := lease(t, db.Pool, "me", ledger.LeaseParams{})
	if len(l2) != 1 || l2[0].Attempts != 0 || l2[0].FirstNotFoundAt != nil {
		t.Fatalf("fresh claim bookkeeping = %+v", l2)
	}
}

func TestHolds(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	claim(t, db.Pool, "k", "h")
	err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error { return ledger.PutHold(ctx, tx, "k", "looking at it", "alice") })
	if err != nil {
		t.Fatal(err)
	}
	err = pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error { return ledger.PutHold(ctx, tx, "missing", "x", "alice") })
	if !errors.Is(err, ledger.ErrNotFound) {
		t.Fatalf("hold of a missing key: %v", err)
	}
	holds, err := ledger.ListHolds(ctx, db.Pool)
	if err != nil || len(holds) != 1 || holds[0].Reason != "looking at it" || holds[0].Tool != "create_ticket" {
		t.Fatalf("holds = %+v %v", holds, err)
	}
	if err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error { return ledger.ReleaseHold(ctx, tx, "k", "bob") }); err != nil {
		t.Fatal(err)
	}
	err = pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error { return ledger.ReleaseHold(ctx, tx, "k", "bob") })
	if !errors.Is(err, ledger.ErrNotFound) {
		t.Fatalf("second release: %v", err)
	}
	hist, _ := ledger.History(ctx, db.Pool, "k", 10)
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
	stats, err := ledger.Stats(ctx, db.Pool, func(string) (time.Duration, time.Duration) { return 30 * time.Second, 30 * time.Second })
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
	old := lease(t, db.Pool, "replica-a", ledger.LeaseParams{})[0]
	// The first claim is abandoned and re-claimed; replica B leases the new one.
	if err := ledger.Abandon(ctx, db.Pool, "k", old.ClaimedAt); err != nil {
		t.Fatal(err)
	}
	claim(t, db.Pool, "k", "h")
	age(t, db, "k", 2*time.Minute)
	fresh := lease(t, db.Pool, "replica-b", ledger.LeaseParams{})
	if len(fresh) != 1 {
		t.Fatalf("new claim not leased: %+v", fresh)
	}
	// A's stale decision arrives.
	res := decide(t, db, ledger.Decision{Key: "k", Tool: "create_ticket", ClaimedAt: old.ClaimedAt, Owner: "replica-a", Actor: "a",
		Verdict: "found", Transition: ledger.StatusCompleted, ResponseCode: 200, ResponseBody: json.RawMessage(`{}`), Action: "completed", CountAttempt: true})
	if res.Applied || res.Action != ledger.ActionResolvedByOriginal {
		t.Fatalf("stale decision: %+v", res)
	}
	st, err := ledger.GetState(ctx, db.Pool, "k")
	if err != nil || st.LeaseOwner == nil || *st.LeaseOwner != "replica-b" || !st.ClaimedAt.Equal(fresh[0].ClaimedAt) {
		t.Fatalf("new claim's lease clobbered: %+v %v", st, err)
	}
	if got := lease(t, db.Pool, "replica-c", ledger.LeaseParams{}); len(got) != 0 {
		t.Fatalf("a third replica leased a key B holds: %+v", got)
	}
}
