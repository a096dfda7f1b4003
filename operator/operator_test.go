package operator_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/alerts"
	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/ledger/ledgertest/testwait"
	"github.com/ledgerkeeper/ledgerkeeper/operator"
	"github.com/ledgerkeeper/ledgerkeeper/store"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

var ctx = context.Background()

// minute is the windows of the tests' one tool: a minute of window + grace,
// a minute of heartbeat timeout.
func minute(string) (time.Duration, time.Duration) { return time.Minute, time.Minute }

// putKey inserts a key of tool t in status st, claimed ago (by the
// database's clock).
func putKey(t *testing.T, db *pgtest.DB, key, st string, ago time.Duration) ledger.Key {
	t.Helper()
	db.Exec(t, `INSERT INTO idempotency_keys (key, tool, request_hash, status, created_at, claimed_at, expires_at)
		VALUES ($1, 't', 'h', $2, now() - $3::interval, now() - $3::interval, now() + interval '1 day')`, key, st, ago)
	k, err := ledger.Get(ctx, db.Pool, key)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func get(t *testing.T, db *pgtest.DB, key string) ledger.Key {
	t.Helper()
	k, err := ledger.Get(ctx, db.Pool, key)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func refusal(err error) operator.Refusal {
	var r *operator.RefusedError
	if errors.As(err, &r) && errors.Is(err, operator.ErrRefused) {
		return r.Why
	}
	return ""
}

// Judge's boundaries are the ledger's: in flight strictly inside the window
// or the heartbeat timeout, by the clock it is given.
func TestJudge(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	ago := func(d time.Duration) *time.Time { at := now.Add(-d); return &at }
	const win, hb = time.Minute, 5 * time.Minute
	for _, tc := range []struct {
		name    string
		status  string
		claimed time.Duration
		beat    *time.Time
		want    operator.Condition
	}{
		{"inside the window", ledger.StatusProcessing, 59 * time.Second, nil, operator.InFlight},
		{"window exactly reached", ledger.StatusProcessing, time.Minute, nil, operator.Stuck},
		{"past the window", ledger.StatusProcessing, time.Hour, nil, operator.Stuck},
		{"past the window, heartbeat within the timeout", ledger.StatusProcessing, time.Hour, ago(4 * time.Minute), operator.InFlight},
		{"past the window, heartbeat timeout exactly reached", ledger.StatusProcessing, time.Hour, ago(hb), operator.Stuck},
		{"inside the window, heartbeat stale", ledger.StatusProcessing, time.Second, ago(time.Hour), operator.InFlight},
		{"claimed in the database's future", ledger.StatusProcessing, -time.Minute, nil, operator.InFlight},
		{"completed", ledger.StatusCompleted, time.Second, nil, operator.Completed},
		{"failed_retryable", ledger.StatusFailedRetryable, time.Second, nil, operator.FailedRetryable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := ledger.Key{Key: "k", Status: tc.status, ClaimedAt: now.Add(-tc.claimed), HeartbeatAt: tc.beat}
			j := operator.Judge(k, now, win, hb)
			if j.Condition != tc.want || j.Age != tc.claimed {
				t.Fatalf("Judge = %+v, want %s aged %s", j, tc.want, tc.claimed)
			}
			if (tc.beat == nil) != (j.HeartbeatAge == nil) || (tc.beat != nil && *j.HeartbeatAge != now.Sub(*tc.beat)) {
				t.Fatalf("heartbeat age = %v, want since %v", j.HeartbeatAge, tc.beat)
			}
		})
	}
}

// A request wrong in itself is refused before any database is reached,
// naming its first mistake; every such error matches ErrInvalid.
func TestResolveValidate(t *testing.T) {
	t.Parallel()
	ok := operator.ResolveRequest{Key: "k", Mark: operator.MarkCompleted, Code: 201, Body: json.RawMessage(`{}`), Reason: "r", Actor: "a"}
	for _, tc := range []struct {
		name string
		edit func(*operator.ResolveRequest)
		want error
	}{
		{"valid", func(*operator.ResolveRequest) {}, nil},
		{"no mark", func(r *operator.ResolveRequest) { r.Mark = "" }, operator.ErrNoMark},
		{"no mark before no reason", func(r *operator.ResolveRequest) { r.Mark, r.Reason = "", "" }, operator.ErrNoMark},
		{"blank reason", func(r *operator.ResolveRequest) { r.Reason = "  " }, operator.ErrNoReason},
		{"code below 100", func(r *operator.ResolveRequest) { r.Code = 99 }, operator.ErrBadCode},
		{"code above 599", func(r *operator.ResolveRequest) { r.Code = 600 }, operator.ErrBadCode},
		{"5xx", func(r *operator.ResolveRequest) { r.Code = 500 }, operator.ErrServerErrorOutcome},
		{"5xx forced", func(r *operator.ResolveRequest) { r.Code, r.Force = 503, true }, nil},
		{"4xx", func(r *operator.ResolveRequest) { r.Code = 422 }, nil},
		{"no body", func(r *operator.ResolveRequest) { r.Body = nil }, operator.ErrBadBody},
		{"body not JSON", func(r *operator.ResolveRequest) { r.Body = json.RawMessage(`{nope`) }, operator.ErrBadBody},
		{"retryable", func(r *operator.ResolveRequest) { r.Mark, r.Code, r.Body = operator.MarkRetryable, 0, nil }, nil},
		{"retryable with a code", func(r *operator.ResolveRequest) { r.Mark, r.Body = operator.MarkRetryable, nil }, operator.ErrOutcomeOnRetryable},
		{"retryable with an empty body", func(r *operator.ResolveRequest) {
			r.Mark, r.Code, r.Body = operator.MarkRetryable, 0, json.RawMessage{}
		}, operator.ErrOutcomeOnRetryable},
		{"no actor", func(r *operator.ResolveRequest) { r.Actor = "" }, operator.ErrNoActor},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := ok
			tc.edit(&r)
			err := r.Validate()
			if !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
				t.Fatalf("Validate = %v, want %v", err, tc.want)
			}
			if err != nil && !errors.Is(err, operator.ErrInvalid) {
				t.Fatalf("%v does not match ErrInvalid", err)
			}
		})
	}
	// Resolve validates too, before touching the database (a nil one).
	bad := ok
	bad.Code = 500
	if _, err := operator.Resolve(ctx, nil, bad); !errors.Is(err, operator.ErrServerErrorOutcome) {
		t.Fatalf("Resolve of a 5xx outcome = %v", err)
	}
}

// Resolve's refusals: each changes nothing, and the in-flight check is the
// database's, under the row lock.
func TestResolveGuards(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	retryable := func(key string) operator.ResolveRequest {
		return operator.ResolveRequest{Key: key, Mark: operator.MarkRetryable, Reason: "checked downstream", Actor: "alice", Windows: minute}
	}
	completed := func(key string) operator.ResolveRequest {
		return operator.ResolveRequest{Key: key, Mark: operator.MarkCompleted, Code: 201, Body: json.RawMessage(`{"ticket_id":"T-1"}`),
			Reason: "found it", Actor: "alice", Windows: minute}
	}
	putKey(t, db, "done", ledger.StatusCompleted, time.Hour)
	putKey(t, db, "retry", ledger.StatusFailedRetryable, time.Hour)
	putKey(t, db, "held", ledger.StatusProcessing, time.Hour)
	db.Exec(t, `INSERT INTO key_holds (key, reason, actor) VALUES ('held', 'checking', 'bob')`)
	putKey(t, db, "young", ledger.StatusProcessing, 10*time.Second)
	putKey(t, db, "beating", ledger.StatusProcessing, time.Hour)
	db.Exec(t, `UPDATE idempotency_keys SET heartbeat_at = now() - interval '10 seconds' WHERE key = 'beating'`)
	putKey(t, db, "noconf", ledger.StatusProcessing, time.Hour)

	noConf := retryable("noconf")
	noConf.Windows = nil
	for _, tc := range []struct {
		name string
		req  operator.ResolveRequest
		want operator.Refusal
	}{
		{"completed is final", retryable("done"), operator.RefusedFinal},
		{"completed is final for completed too", completed("done"), operator.RefusedFinal},
		{"already failed_retryable", retryable("retry"), operator.RefusedAlreadyRetryable},
		{"held", completed("held"), operator.RefusedHeld},
		{"claimed inside the window", retryable("young"), operator.RefusedInFlight},
		{"heartbeating", completed("beating"), operator.RefusedInFlight},
		{"no configuration", noConf, operator.RefusedNoConfiguration},
	} {
		before := get(t, db, tc.req.Key)
		_, err := operator.Resolve(ctx, db.Pool, tc.req)
		if got := refusal(err); got != tc.want {
			t.Errorf("%s: err = %v, want refusal %s", tc.name, err, tc.want)
		}
		if after := get(t, db, tc.req.Key); after.Status != before.Status || !after.UpdatedAt.Equal(before.UpdatedAt) {
			t.Errorf("%s: refused resolve changed the key: %+v -> %+v", tc.name, before, after)
		}
	}
	var r *operator.RefusedError
	if _, err := operator.Resolve(ctx, db.Pool, retryable("young")); !errors.As(err, &r) || r.Window != time.Minute {
		t.Fatalf("in-flight refusal does not name the window: %v", err)
	}
	if n := db.Count(t, "reconcile_audit"); n != 0 {
		t.Fatalf("refusals wrote %d audit rows", n)
	}
	if _, err := operator.Resolve(ctx, db.Pool, retryable("missing")); !errors.Is(err, operator.ErrNoKey) || !errors.Is(err, ledger.ErrNotFound) {
		t.Fatalf("resolve of a missing key = %v", err)
	}

	// --force goes past "in flight" and the missing configuration, never
	// past a hold.
	for _, key := range []string{"young", "beating", "noconf", "held"} {
		req := retryable(key)
		req.Force = true
		if key == "noconf" {
			req.Windows = nil
		}
		res, err := operator.Resolve(ctx, db.Pool, req)
		if key == "held" {
			if refusal(err) != operator.RefusedHeld {
				t.Fatalf("forced resolve of a held key = %v", err)
			}
			continue
		}
		if err != nil || res.Key.Status != ledger.StatusFailedRetryable || res.Action != store.ActionOperatorMarkedRetryable {
			t.Fatalf("forced resolve of %s = %+v, %v", key, res, err)
		}
	}

	// A failed_retryable key whose attempt still owns it: the effect turned
	// up after all, its outcome is stored and replayed.
	res, err := operator.Resolve(ctx, db.Pool, completed("retry"))
	if err != nil || res.Key.Status != ledger.StatusCompleted || res.Action != store.ActionOperatorCompleted {
		t.Fatalf("completing a failed_retryable key = %+v, %v", res, err)
	}
	replay, err := ledger.Claim(ctx, db.Pool, ledger.ClaimParams{Key: "retry", Tool: "t", RequestHash: "h"})
	if err != nil || replay.Outcome != ledger.Replay || *replay.Row.ResponseCode != 201 {
		t.Fatalf("replay after resolve = %+v, %v", replay, err)
	}
	hist, err := store.History(ctx, db.Pool, "retry", 10)
	if err != nil || len(hist) != 1 || hist[0].Actor != "alice" || hist[0].Verdict != store.VerdictOperator || hist[0].Action != store.ActionOperatorCompleted {
		t.Fatalf("audit of the resolve = %+v, %v", hist, err)
	}
	var ev struct {
		Reason string
		Forced bool
	}
	if err := json.Unmarshal(hist[0].Evidence, &ev); err != nil || ev.Reason != "found it" || ev.Forced {
		t.Fatalf("evidence = %s (%v)", hist[0].Evidence, err)
	}
}

// A key that changes between Resolve's read and its write (the original
// attempt completes it while Resolve waits on the row lock) is left as the
// attempt left it: refused as changed, the refusal audited.
func TestResolveOfAKeyThatChangesMeanwhile(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	putKey(t, db, "k", ledger.StatusProcessing, time.Hour)
	blocker, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer blocker.Rollback(ctx)
	if _, err := blocker.Exec(ctx, `UPDATE idempotency_keys SET status = 'completed', response_code = 200, response_body = '{"orig":true}', updated_at = now() WHERE key = 'k'`); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := operator.Resolve(ctx, db.Pool, operator.ResolveRequest{Key: "k", Mark: operator.MarkRetryable, Reason: "r", Actor: "alice", Windows: minute})
		done <- err
	}()
	// Resolve read the key as processing (the update is not committed) and
	// now waits for its row lock.
	testwait.Eventually(t, func() bool {
		return db.Count(t, pgtest.LockWaiters()) > 0
	}, testwait.Timeout, "resolve to wait on the key's row lock")
	if err := blocker.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	err = testwait.Recv(t, done, testwait.Timeout)
	var r *operator.RefusedError
	if !errors.As(err, &r) || r.Why != operator.RefusedChanged || r.Action != store.ActionResolvedByOriginal {
		t.Fatalf("resolve of a key completed meanwhile = %v", err)
	}
	if k := get(t, db, "k"); k.Status != ledger.StatusCompleted || string(k.ResponseBody) != `{"orig": true}` {
		t.Fatalf("the original outcome was overwritten: %s %s", k.Status, k.ResponseBody)
	}
	if hist, _ := store.History(ctx, db.Pool, "k", 10); len(hist) != 1 || hist[0].Action != store.ActionResolvedByOriginal || hist[0].Actor != "alice" {
		t.Fatalf("the refusal's audit = %+v", hist)
	}
}

// A resolved key's open alerts are resolved in the same transaction; a
// refused one's stay open.
func TestResolveResolvesTheKeysAlerts(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	for _, k := range []string{"k", "young"} {
		ago := time.Hour
		if k == "young" {
			ago = time.Second
		}
		putKey(t, db, k, ledger.StatusProcessing, ago)
		if _, err := alerts.Raise(ctx, db.Pool, alerts.Alert{Reason: alerts.ReasonProbeFailing, Tool: "t", Key: k}, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	res, err := operator.Resolve(ctx, db.Pool, operator.ResolveRequest{Key: "k", Mark: operator.MarkRetryable, Reason: "r", Actor: "a", Windows: minute})
	if err != nil || res.AlertsResolved != 1 {
		t.Fatalf("resolve = %+v, %v", res, err)
	}
	if n := db.Count(t, "alert_state WHERE key = 'k' AND resolved_at IS NULL"); n != 0 {
		t.Fatalf("resolved key still has %d open alerts", n)
	}
	if _, err := operator.Resolve(ctx, db.Pool, operator.ResolveRequest{Key: "young", Mark: operator.MarkRetryable, Reason: "r", Actor: "a", Windows: minute}); refusal(err) != operator.RefusedInFlight {
		t.Fatalf("resolve of a young key = %v", err)
	}
	if n := db.Count(t, "alert_state WHERE key = 'young' AND resolved_at IS NULL"); n != 1 {
		t.Fatalf("refused resolve closed the key's alert: %d open", n)
	}
}

// Hold refuses a held key unless Replace, with the hold in force; Release
// lifts it once.
func TestHoldAndRelease(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	putKey(t, db, "k", ledger.StatusProcessing, time.Hour)
	if _, err := operator.Hold(ctx, db.Pool, operator.HoldRequest{Key: "k", Reason: " ", Actor: "alice"}); !errors.Is(err, operator.ErrNoReason) {
		t.Fatalf("hold without a reason = %v", err)
	}
	if _, err := operator.Hold(ctx, db.Pool, operator.HoldRequest{Key: "missing", Reason: "r", Actor: "alice"}); !errors.Is(err, operator.ErrNoKey) {
		t.Fatalf("hold of a missing key = %v", err)
	}
	if res, err := operator.Hold(ctx, db.Pool, operator.HoldRequest{Key: "k", Reason: "checking", Actor: "alice"}); err != nil || res.Replaced != nil {
		t.Fatalf("hold = %+v, %v", res, err)
	}
	_, err := operator.Hold(ctx, db.Pool, operator.HoldRequest{Key: "k", Reason: "mine now", Actor: "bob"})
	var r *operator.RefusedError
	if !errors.As(err, &r) || r.Why != operator.RefusedAlreadyHeld || r.Hold == nil || r.Hold.Actor != "alice" || r.Hold.Reason != "checking" {
		t.Fatalf("hold of a held key = %v", err)
	}
	if h, _ := store.GetHold(ctx, db.Pool, "k"); h.Actor != "alice" {
		t.Fatalf("refused hold replaced the hold: %+v", h)
	}
	res, err := operator.Hold(ctx, db.Pool, operator.HoldRequest{Key: "k", Reason: "mine now", Actor: "bob", Replace: true})
	if err != nil || res.Replaced == nil || res.Replaced.Actor != "alice" {
		t.Fatalf("hold --replace = %+v, %v", res, err)
	}
	if err := operator.Release(ctx, db.Pool, operator.ReleaseRequest{Key: "k", Actor: "carol"}); err != nil {
		t.Fatal(err)
	}
	if err := operator.Release(ctx, db.Pool, operator.ReleaseRequest{Key: "k", Actor: "carol"}); !errors.Is(err, operator.ErrNotHeld) {
		t.Fatalf("second release = %v", err)
	}
	hist, _ := store.History(ctx, db.Pool, "k", 10)
	var actions []string
	for _, e := range hist {
		actions = append(actions, e.Actor+":"+e.Action)
	}
	if want := "[alice:hold bob:hold carol:release]"; len(hist) != 3 || want != "["+actions[0]+" "+actions[1]+" "+actions[2]+"]" {
		t.Fatalf("audit = %v, want %s", actions, want)
	}
}

// Inspect's judgement of each state a key can be in.
func TestInspectJudgement(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	putKey(t, db, "young", ledger.StatusProcessing, time.Second)
	putKey(t, db, "stuck", ledger.StatusProcessing, time.Hour)
	putKey(t, db, "held", ledger.StatusProcessing, time.Hour)
	putKey(t, db, "done", ledger.StatusCompleted, time.Hour)
	putKey(t, db, "purged", ledger.StatusCompleted, time.Hour)
	if _, err := operator.Hold(ctx, db.Pool, operator.HoldRequest{Key: "held", Reason: "checking", Actor: "alice"}); err != nil {
		t.Fatal(err)
	}
	if _, err := operator.Hold(ctx, db.Pool, operator.HoldRequest{Key: "purged", Reason: "r", Actor: "alice"}); err != nil {
		t.Fatal(err)
	}
	if err := operator.Release(ctx, db.Pool, operator.ReleaseRequest{Key: "purged", Actor: "alice"}); err != nil {
		t.Fatal(err)
	}
	db.Exec(t, `DELETE FROM idempotency_keys WHERE key = 'purged'`)
	// "stuck" is leased by a reconciler; "lapsed" was, its lease expired by
	// the database's clock.
	putKey(t, db, "lapsed", ledger.StatusProcessing, time.Hour)
	leased, err := store.LeaseDue(ctx, db.Pool, store.LeaseParams{Tool: "t", Window: time.Minute, HeartbeatTimeout: time.Minute,
		Owner: "replica-1", Lease: time.Hour, Limit: 10, Keys: []string{"stuck", "lapsed"}})
	if err != nil || len(leased) != 2 {
		t.Fatalf("lease: %+v, %v", leased, err)
	}
	db.Exec(t, `UPDATE reconcile_state SET lease_expires_at = now() - interval '1 second' WHERE key = 'lapsed'`)
	for _, tc := range []struct {
		key    string
		want   operator.Condition
		held   bool
		leased bool
	}{
		{"young", operator.InFlight, false, false},
		{"stuck", operator.Stuck, false, true},
		{"lapsed", operator.Stuck, false, false},
		{"held", operator.Stuck, true, false},
		{"done", operator.Completed, false, false},
		{"purged", operator.Purged, false, false},
	} {
		in, err := operator.Inspect(ctx, db.Pool, operator.InspectRequest{Key: tc.key, Windows: minute})
		if err != nil {
			t.Fatalf("%s: %v", tc.key, err)
		}
		j := in.Judgement
		if j.Condition != tc.want || j.Held != tc.held || j.Leased != tc.leased {
			t.Errorf("%s judged %+v, want %s held=%v leased=%v", tc.key, j, tc.want, tc.held, tc.leased)
		}
		if in.History == nil || (tc.key == "purged" && len(in.History) != 2) {
			t.Errorf("%s: history %+v", tc.key, in.History)
		}
	}
	if _, err := operator.Inspect(ctx, db.Pool, operator.InspectRequest{Key: "never", Windows: minute}); !errors.Is(err, operator.ErrNoKey) {
		t.Fatalf("inspect of a key never claimed = %v", err)
	}
}

// Inspect judges by the database's clock, not the caller's. In a
// transaction now() stands still: a key claimed just under a window before
// it is in flight by that clock however long the caller's clock has moved
// past the window since.
func TestInspectJudgesByTheDatabasesClock(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	var dbNow time.Time
	if err := tx.QueryRow(ctx, `SELECT now()`).Scan(&dbNow); err != nil {
		t.Fatal(err)
	}
	const window = time.Second
	claimedAt := dbNow.Add(-window + 100*time.Millisecond)
	db.Exec(t, `INSERT INTO idempotency_keys (key, tool, request_hash, created_at, claimed_at, expires_at)
		VALUES ('k', 't', 'h', $1::timestamptz, $1::timestamptz, $1::timestamptz + interval '1 day')`, claimedAt)
	testwait.Eventually(t, func() bool { return time.Since(claimedAt) > 2*window }, testwait.Timeout, "the local clock to pass the window")

	in, err := operator.Inspect(ctx, tx, operator.InspectRequest{Key: "k",
		Windows: func(string) (time.Duration, time.Duration) { return window, window }})
	if err != nil {
		t.Fatal(err)
	}
	if !in.Now.Equal(dbNow) {
		t.Fatalf("inspection clock %s, want the database's %s", in.Now, dbNow)
	}
	if in.Judgement.Condition != operator.InFlight || in.Judgement.Age >= window {
		t.Fatalf("judged %+v by the local clock (claimed %s ago locally), want in flight by the database's", in.Judgement, time.Since(claimedAt))
	}
}

// A refusal is audited with the attempts of the key's current claim (none
// for a state an older claim left), changes nothing else, and is not
// recorded for a key the ledger does not hold.
func TestAuditRefusalRecordsTheCurrentClaimsAttemptAndChangesNothingElse(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	cur := putKey(t, db, "current", ledger.StatusProcessing, time.Hour)
	old := putKey(t, db, "reclaimed", ledger.StatusProcessing, time.Hour)
	db.Exec(t, `INSERT INTO reconcile_state (key, tool, claimed_at, attempts, updated_at) VALUES
		($1, 't', $2, 3, now()), ($3, 't', $4::timestamptz - interval '1 day', 5, now())`, cur.Key, cur.ClaimedAt, old.Key, old.ClaimedAt)
	for _, key := range []string{"current", "reclaimed", "missing"} {
		err := operator.AuditRefusal(ctx, db.Pool, operator.RefusalRecord{Key: key, Action: "slack_refused", Actor: "slack:U1", What: "not allowed"})
		if err != nil {
			t.Fatalf("%s: %v", key, err)
		}
	}
	if err := operator.AuditRefusal(ctx, db.Pool, operator.RefusalRecord{Key: "current", Action: "slack_refused"}); !errors.Is(err, operator.ErrNoActor) {
		t.Fatalf("refusal without an actor = %v", err)
	}
	for key, want := range map[string]int{"current": 3, "reclaimed": 0} {
		hist, err := store.History(ctx, db.Pool, key, 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(hist) != 1 || hist[0].Attempt != want || hist[0].Verdict != store.VerdictOperator ||
			hist[0].Action != "slack_refused" || hist[0].Actor != "slack:U1" || hist[0].Error != "not allowed" {
			t.Fatalf("%s: audit %+v, want one slack_refused row at attempt %d", key, hist, want)
		}
	}
	if n := db.Count(t, "reconcile_audit WHERE key = 'missing'"); n != 0 {
		t.Fatalf("a key not in the ledger has %d audit rows", n)
	}
	if k := get(t, db, "current"); k.Status != ledger.StatusProcessing || !k.UpdatedAt.Equal(cur.UpdatedAt) {
		t.Fatalf("the refusal changed the key: %+v", k)
	}
}
