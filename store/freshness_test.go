package store_test

import (
	"slices"
	"testing"
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
	"github.com/ledgerkeeper/ledgerkeeper/store"
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
			p := store.LeaseParams{Tool: "create_ticket", Window: tc.window, HeartbeatTimeout: tc.heartbeat, Limit: 10}
			peeked, err := store.PeekDue(ctx, db.Pool, p, store.Leased{})
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

// Only an unknown keeps a not_found awaiting confirmation: any conclusive
// verdict in between (found, duplicate) resets it, so the next not_found
// starts its confirmation wait afresh.
func TestConclusiveVerdictResetsNotFoundConfirmation(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	claim(t, db.Pool, "k", "h")
	age(t, db, "k", time.Minute)
	// Each verdict is a probe of its own: leased (its back-off ignored, as
	// by reconcile --key), then decided.
	bookkeeping := func(verdict string, notFound bool) {
		t.Helper()
		l := lease(t, db.Pool, "me", store.LeaseParams{IgnoreBackoff: true, Keys: []string{"k"}})
		if len(l) != 1 {
			t.Fatalf("key not leased for the %s: %+v", verdict, l)
		}
		res := decide(t, db, store.Decision{Key: "k", Tool: "create_ticket", ClaimedAt: l[0].ClaimedAt, Owner: "me", Actor: "r", Verdict: verdict,
			Action: "backoff", CountAttempt: true, NotFoundSeen: notFound})
		if !res.Applied {
			t.Fatalf("%s not applied: %+v", verdict, res)
		}
	}
	bookkeeping("not_found", true)
	first, err := store.GetState(ctx, db.Pool, "k")
	if err != nil || first.FirstNotFoundAt == nil {
		t.Fatalf("after not_found: %+v, %v", first, err)
	}
	for _, verdict := range []string{"found", "duplicate"} {
		bookkeeping("not_found", true)
		bookkeeping(verdict, false)
		st, _ := store.GetState(ctx, db.Pool, "k")
		if st.FirstNotFoundAt != nil {
			t.Fatalf("a %s between two not_founds kept the first not_found (%s): the confirmation must start again", verdict, st.FirstNotFoundAt)
		}
	}
	bookkeeping("not_found", true)
	again, _ := store.GetState(ctx, db.Pool, "k")
	if again.FirstNotFoundAt == nil || !again.FirstNotFoundAt.After(*first.FirstNotFoundAt) {
		t.Fatalf("the not_found after a reset is dated %v, want after the first one (%s)", again.FirstNotFoundAt, first.FirstNotFoundAt)
	}
	// And an unknown keeps it.
	bookkeeping("unknown", false)
	if st, _ := store.GetState(ctx, db.Pool, "k"); st.FirstNotFoundAt == nil || !st.FirstNotFoundAt.Equal(*again.FirstNotFoundAt) {
		t.Fatalf("an unknown lost the pending not_found: %+v", st)
	}
}
