package ledger_test

import (
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
)

// A heartbeat is fresh for the tool's heartbeat_timeout, not its processing
// window: with the two set apart, a heartbeat between them decides.
func TestHeartbeatFreshnessUsesHeartbeatTimeout(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name              string
		window, heartbeat time.Duration
		due               bool
	}{
		// heartbeat 2m ago: older than the window, younger than the timeout
		{"timeout longer than window", 30 * time.Second, 5 * time.Minute, false},
		// heartbeat 2m ago: younger than the window, older than the timeout
		{"timeout shorter than window", 5 * time.Minute, 30 * time.Second, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db := pgtest.New(t)
			claim(t, db.Pool, "k", "h")
			age(t, db, "k", time.Hour)
			db.Exec(t, `UPDATE idempotency_keys SET heartbeat_at = now() - interval '2 minutes' WHERE key = 'k'`)
			p := ledger.LeaseParams{Tool: "create_ticket", Window: tc.window, HeartbeatTimeout: tc.heartbeat, Limit: 10}
			peeked, err := ledger.PeekDue(ctx, db.Pool, p, ledger.Leased{})
			if err != nil {
				t.Fatal(err)
			}
			leased := lease(t, db.Pool, "me", p)
			want := []string{}
			if tc.due {
				want = []string{"k"}
			}
			if got := keysOf(leased); !slices.Equal(got, want) {
				t.Errorf("LeaseDue took %v, want %v (window %s, heartbeat_timeout %s, heartbeat 2m ago)", got, want, tc.window, tc.heartbeat)
			}
			if got := keysOf(peeked); !slices.Equal(got, want) {
				t.Errorf("PeekDue listed %v, want %v", got, want)
			}
		})
	}
}

// An operator's decision (RequireIdle) refuses a key whose heartbeat is
// fresh by heartbeat_timeout even when its claim is long past the window,
// and writes nothing.
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
			res := decide(t, db, ledger.Decision{Key: "k", Tool: "create_ticket", ClaimedAt: k.ClaimedAt, Actor: "op", Verdict: "operator",
				Transition: ledger.StatusCompleted, ResponseCode: 201, ResponseBody: json.RawMessage(`{"id":1}`), Action: "operator_completed",
				RequireIdle: true, Window: tc.window, HeartbeatTimeout: tc.heartbeat})
			after, _ := ledger.Get(ctx, db.Pool, "k")
			if !tc.inFlight {
				if !res.Applied || after.Status != ledger.StatusCompleted {
					t.Fatalf("idle key not resolved: %+v, status %s", res, after.Status)
				}
				return
			}
			if res.Applied || res.Action != ledger.ActionInFlight {
				t.Fatalf("operator resolved a key heartbeating %s ago (heartbeat_timeout %s): %+v", tc.beat, tc.heartbeat, res)
			}
			if after.Status != ledger.StatusProcessing || db.Count(t, "reconcile_audit") != 0 || db.Count(t, "reconcile_state") != 0 {
				t.Fatalf("a refused decision wrote: status %s, %d audit rows, %d state rows", after.Status,
					db.Count(t, "reconcile_audit"), db.Count(t, "reconcile_state"))
			}
		})
	}
}

// Only an unknown keeps a not_found awaiting confirmation: any conclusive
// verdict in between (found, duplicate) resets it, so the next not_found
// starts its confirmation wait afresh.
func TestConclusiveVerdictResetsNotFoundConfirmation(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	claim(t, db.Pool, "k", "h")
	age(t, db, "k", time.Minute)
	l := lease(t, db.Pool, "me", ledger.LeaseParams{})[0]
	bookkeeping := func(verdict string, notFound bool) ledger.Decision {
		return ledger.Decision{Key: "k", Tool: "create_ticket", ClaimedAt: l.ClaimedAt, Actor: "r", Verdict: verdict,
			Action: "backoff", CountAttempt: true, NotFoundSeen: notFound}
	}
	decide(t, db, bookkeeping("not_found", true))
	first, err := ledger.GetState(ctx, db.Pool, "k")
	if err != nil || first.FirstNotFoundAt == nil {
		t.Fatalf("after not_found: %+v, %v", first, err)
	}
	for _, verdict := range []string{"found", "duplicate"} {
		decide(t, db, bookkeeping("not_found", true))
		decide(t, db, bookkeeping(verdict, false))
		st, _ := ledger.GetState(ctx, db.Pool, "k")
		if st.FirstNotFoundAt != nil {
			t.Fatalf("a %s between two not_founds kept the first not_found (%s): the confirmation must start again", verdict, st.FirstNotFoundAt)
		}
	}
	decide(t, db, bookkeeping("not_found", true))
	again, _ := ledger.GetState(ctx, db.Pool, "k")
	if again.FirstNotFoundAt == nil || !again.FirstNotFoundAt.After(*first.FirstNotFoundAt) {
		t.Fatalf("the not_found after a reset is dated %v, want after the first one (%s)", again.FirstNotFoundAt, first.FirstNotFoundAt)
	}
	// And an unknown keeps it.
	decide(t, db, bookkeeping("unknown", false))
	if st, _ := ledger.GetState(ctx, db.Pool, "k"); st.FirstNotFoundAt == nil || !st.FirstNotFoundAt.Equal(*again.FirstNotFoundAt) {
		t.Fatalf("an unknown lost the pending not_found: %+v", st)
	}
}
