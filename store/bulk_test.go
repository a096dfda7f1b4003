package store_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/store"
)

// BulkKeys yields, per set, exactly the keys the act would not refuse by
// their state, in key order, and at most limit+1 of them.
func TestBulkKeysSelectsWhatEachActAppliesTo(t *testing.T) {
	db := pgtest.New(t)
	ctx := context.Background()
	for _, k := range []string{"b-3", "b-1", "b-2", "b-held", "b-fresh", "b-beat", "b-done"} {
		processingKey(t, db, k, "t")
	}
	db.Exec(t, `UPDATE idempotency_keys SET claimed_at = now() WHERE key = 'b-fresh'`)
	db.Exec(t, `UPDATE idempotency_keys SET heartbeat_at = now() WHERE key = 'b-beat'`)
	db.Exec(t, `UPDATE idempotency_keys SET status = 'completed', response_code = 201, response_body = '{}' WHERE key = 'b-done'`)
	db.Exec(t, `INSERT INTO key_holds (key, reason, actor) VALUES ('b-held', 'r', 'a')`)
	stuck := store.KeyFilter{Tool: "t", Window: time.Minute, Heartbeat: time.Minute}
	held := true
	cases := []struct {
		name string
		f    store.KeyFilter
		set  store.BulkSet
		want []string
	}{
		{"not held", store.KeyFilter{Prefix: "b-"}, store.BulkNotHeld, []string{"b-1", "b-2", "b-3", "b-beat", "b-done", "b-fresh"}},
		{"not held of held keys", store.KeyFilter{Held: &held}, store.BulkNotHeld, nil},
		{"held", store.KeyFilter{}, store.BulkHeld, []string{"b-held"}},
		{"held of stuck keys", store.KeyFilter{Tool: "t", Stuck: true, Window: time.Minute, Heartbeat: time.Minute}, store.BulkHeld, nil},
		{"stuck", stuck, store.BulkStuck, []string{"b-1", "b-2", "b-3"}},
		{"stuck of completed keys", store.KeyFilter{Tool: "t", Status: ledger.StatusCompleted, Window: time.Minute, Heartbeat: time.Minute}, store.BulkStuck, nil},
	}
	for _, c := range cases {
		keys, now, err := store.BulkKeys(ctx, db.Pool, c.f, c.set, 10)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		var got []string
		for _, k := range keys {
			got = append(got, k.Key)
			if k.Held != (c.set == store.BulkHeld) {
				t.Errorf("%s: %s held %v", c.name, k.Key, k.Held)
			}
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
		if now.IsZero() {
			t.Errorf("%s: no clock", c.name)
		}
	}
	keys, _, err := store.BulkKeys(ctx, db.Pool, store.KeyFilter{Prefix: "b-"}, store.BulkNotHeld, 2)
	if err != nil || len(keys) != 3 {
		t.Errorf("limit 2: %d keys (%v), want 3", len(keys), err)
	}
	for _, bad := range []struct {
		f     store.KeyFilter
		set   store.BulkSet
		limit int
	}{
		{store.KeyFilter{}, store.BulkNotHeld, 0},
		{store.KeyFilter{Window: time.Minute}, store.BulkStuck, 10},
		{store.KeyFilter{Tool: "t"}, store.BulkStuck, 10},
		{store.KeyFilter{}, "purge", 10},
	} {
		if _, _, err := store.BulkKeys(ctx, db.Pool, bad.f, bad.set, bad.limit); !errors.Is(err, ledger.ErrInvalid) {
			t.Errorf("BulkKeys(%+v, %s, %d): %v, want ErrInvalid", bad.f, bad.set, bad.limit, err)
		}
	}
}
