package store_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/store"
)

func decideOperator(t *testing.T, db *pgtest.DB, d store.OperatorDecision) store.DecideResult {
	t.Helper()
	var res store.DecideResult
	err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		var err error
		res, err = store.DecideOperator(ctx, tx, d)
		return err
	})
	if err != nil {
		t.Fatalf("decide operator: %v", err)
	}
	return res
}

// An operator's decision refuses a key whose heartbeat is fresh by
// heartbeat_timeout even when its claim is long past the window, and writes
// nothing.
func TestOperatorDecisionRefusesFreshHeartbeat(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name              string
		beat              string
		window, heartbeat time.Duration
		inFlight          bool
	}{
		{"heartbeat just now", "1 second", time.Minute, time.Minute, true},
		{"heartbeat older than the window, within the timeout", "2 minutes", time.Minute, 5 * time.Minute, true},
		{"heartbeat within the window, older than the timeout", "2 minutes", 5 * time.Minute, time.Minute, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db := pgtest.New(t)
			claim(t, db.Pool, "k", "h")
			age(t, db, "k", time.Hour)
			db.Exec(t, `UPDATE idempotency_keys SET heartbeat_at = now() - $1::interval WHERE key = 'k'`, tc.beat)
			k, err := ledger.Get(ctx, db.Pool, "k")
			if err != nil {
				t.Fatal(err)
			}
			res := decideOperator(t, db, store.OperatorDecision{Key: "k", Tool: "create_ticket", ClaimedAt: k.ClaimedAt, Actor: "op", Reason: "r",
				Transition: ledger.StatusCompleted, ResponseCode: 201, ResponseBody: json.RawMessage(`{"id":1}`),
				Window: tc.window, HeartbeatTimeout: tc.heartbeat})
			after, _ := ledger.Get(ctx, db.Pool, "k")
			if !tc.inFlight {
				if !res.Applied || after.Status != ledger.StatusCompleted {
					t.Fatalf("idle key not resolved: %+v, status %s", res, after.Status)
				}
				return
			}
			if res.Applied || res.Action != store.ActionInFlight {
				t.Fatalf("operator resolved a key heartbeating %s ago (heartbeat_timeout %s): %+v", tc.beat, tc.heartbeat, res)
			}
			if after.Status != ledger.StatusProcessing || db.Count(t, "reconcile_audit") != 0 || db.Count(t, "reconcile_state") != 0 {
				t.Fatalf("a refused decision wrote: status %s, %d audit rows, %d state rows", after.Status,
					db.Count(t, "reconcile_audit"), db.Count(t, "reconcile_state"))
			}
		})
	}
}

// An operator's decision refuses a key in flight by the database's clock
// unless forced, and may complete a failed_retryable key not re-claimed.
func TestOperatorDecisionGuards(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	fresh := claim(t, db.Pool, "young", "h")
	young := store.OperatorDecision{Key: "young", Tool: "create_ticket", ClaimedAt: fresh.Row.ClaimedAt, Actor: "op", Reason: "r",
		Transition: ledger.StatusFailedRetryable, Window: time.Minute, HeartbeatTimeout: time.Minute}
	res := decideOperator(t, db, young)
	if res.Applied || res.Action != store.ActionInFlight || db.Count(t, "reconcile_audit") != 0 {
		t.Fatalf("in-flight operator decision: %+v", res)
	}
	// Forced: applied, and the audit says so.
	young.Force = true
	if res = decideOperator(t, db, young); !res.Applied || res.Current.Status != ledger.StatusFailedRetryable || res.Action != store.ActionOperatorMarkedRetryable {
		t.Fatalf("forced operator decision: %+v", res)
	}
	hist, err := store.History(ctx, db.Pool, "young", 10)
	if err != nil || len(hist) != 1 || hist[0].Verdict != "operator" || hist[0].Actor != "op" || hist[0].Action != "operator_marked_retryable" {
		t.Fatalf("forced decision's audit = %+v, %v", hist, err)
	}
	var ev struct {
		Reason string
		Forced bool
	}
	if err := json.Unmarshal(hist[0].Evidence, &ev); err != nil || ev.Reason != "r" || !ev.Forced {
		t.Fatalf("forced decision's evidence = %s (%v)", hist[0].Evidence, err)
	}

	old := claim(t, db.Pool, "old", "h")
	if err := ledger.Abandon(ctx, db.Pool, "old", old.Row.ClaimedAt); err != nil {
		t.Fatal(err)
	}
	age(t, db, "old", time.Hour)
	k, _ := ledger.Get(ctx, db.Pool, "old")
	complete := store.OperatorDecision{Key: "old", Tool: "create_ticket", ClaimedAt: k.ClaimedAt, Actor: "op", Reason: "found it",
		Transition: ledger.StatusCompleted, ResponseCode: 201, ResponseBody: json.RawMessage(`{"id":1}`), Window: time.Minute}
	// Without AllowFailedRetryable a failed_retryable key is not processing:
	// nothing changes.
	if res = decideOperator(t, db, complete); res.Applied || res.Action != store.ActionResolvedByOriginal {
		t.Fatalf("completing a failed_retryable key without AllowFailedRetryable: %+v", res)
	}
	complete.AllowFailedRetryable = true
	if res = decideOperator(t, db, complete); !res.Applied || res.Current.Status != ledger.StatusCompleted || res.Action != store.ActionOperatorCompleted {
		t.Fatalf("completing a failed_retryable key: %+v", res)
	}
}

// An operator's decision holds no lease: it applies whoever leased the key
// (and releases that lease, the claim being settled), but never to a held
// key or to a claim other than the one the operator saw.
func TestOperatorDecisionConditions(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	for _, k := range []string{"leased", "held", "reclaimed"} {
		claim(t, db.Pool, k, "h")
		age(t, db, k, time.Hour)
	}
	at := map[string]time.Time{}
	for _, l := range lease(t, db.Pool, "replica-a", store.LeaseParams{}) {
		at[l.Key.Key] = l.ClaimedAt
	}
	op := func(key string) store.OperatorDecision {
		return store.OperatorDecision{Key: key, Tool: "create_ticket", ClaimedAt: at[key], Actor: "op", Reason: "r",
			Transition: ledger.StatusFailedRetryable, Window: time.Minute, HeartbeatTimeout: time.Minute}
	}
	if res := decideOperator(t, db, op("leased")); !res.Applied {
		t.Fatalf("operator decision on a key leased by a replica: %+v", res)
	}
	if st, err := store.GetState(ctx, db.Pool, "leased"); err != nil || st.LeaseOwner != nil {
		t.Fatalf("the settled claim is still leased: %+v, %v", st, err)
	}

	db.Exec(t, `INSERT INTO key_holds (key, reason, actor) VALUES ('held', 'r', 'alice')`)
	if res := decideOperator(t, db, op("held")); res.Applied || res.Action != store.ActionHeld {
		t.Fatalf("operator decision on a held key: %+v", res)
	}
	// Refused but audited; the replica's lease is not the operator's to give back.
	if st, _ := store.GetState(ctx, db.Pool, "held"); st.LeaseOwner == nil || *st.LeaseOwner != "replica-a" {
		t.Fatalf("a refused operator decision touched the replica's lease: %+v", st)
	}
	if h, _ := store.History(ctx, db.Pool, "held", 10); len(h) != 1 || h[0].Action != store.ActionHeld {
		t.Fatalf("held refusal's audit = %+v", h)
	}

	db.Exec(t, `UPDATE idempotency_keys SET claimed_at = now() - interval '2 hours' WHERE key = 'reclaimed'`)
	if res := decideOperator(t, db, op("reclaimed")); res.Applied || res.Action != store.ActionResolvedByOriginal {
		t.Fatalf("operator decision on another claim: %+v", res)
	}
	if k, _ := ledger.Get(ctx, db.Pool, "reclaimed"); k.Status != ledger.StatusProcessing {
		t.Fatalf("another claim changed: %s", k.Status)
	}
}

// The two kinds of decision cannot be confused: a reconciler's decision
// without its lease owner, an operator's without a window to judge "in
// flight" or with an unknown transition, are refused before anything is
// read or written.
func TestDecisionKindsRefuseMissingGuards(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	k := claim(t, db.Pool, "k", "h").Row
	age(t, db, "k", time.Hour)
	for name, f := range map[string]func(tx pgx.Tx) error{
		"reconciler decision without an owner": func(tx pgx.Tx) error {
			_, err := store.Decide(ctx, tx, store.Decision{Key: "k", Tool: "create_ticket", ClaimedAt: k.ClaimedAt, Actor: "r",
				Verdict: "not_found", Transition: ledger.StatusFailedRetryable, Action: "marked_retryable"})
			return err
		},
		"operator decision without a window": func(tx pgx.Tx) error {
			_, err := store.DecideOperator(ctx, tx, store.OperatorDecision{Key: "k", Tool: "create_ticket", ClaimedAt: k.ClaimedAt,
				Actor: "op", Reason: "r", Transition: ledger.StatusFailedRetryable})
			return err
		},
		"operator decision without a transition": func(tx pgx.Tx) error {
			_, err := store.DecideOperator(ctx, tx, store.OperatorDecision{Key: "k", Tool: "create_ticket", ClaimedAt: k.ClaimedAt,
				Actor: "op", Reason: "r", Force: true})
			return err
		},
	} {
		err := pgx.BeginFunc(ctx, db.Pool, f)
		if err == nil || !strings.Contains(err.Error(), `"k"`) {
			t.Errorf("%s: err = %v, want a refusal naming the key", name, err)
		}
	}
	if after, _ := ledger.Get(ctx, db.Pool, "k"); after.Status != ledger.StatusProcessing || db.Count(t, "reconcile_audit") != 0 {
		t.Fatalf("a refused decision wrote: %s, %d audit rows", after.Status, db.Count(t, "reconcile_audit"))
	}
}
