package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/store"
)

// processingKey inserts a processing key of a tool.
func processingKey(t *testing.T, db *pgtest.DB, key, tool string) {
	t.Helper()
	db.Exec(t, `INSERT INTO idempotency_keys (key, tool, request_hash, claimed_at, expires_at)
		VALUES ($1, $2, 'h', now() - interval '1 hour', now() + interval '1 day')`, key, tool)
}

type holdRow struct {
	reason, actor string
	createdAt     time.Time
}

func readHold(t *testing.T, db *pgtest.DB, key string) holdRow {
	t.Helper()
	var h holdRow
	err := db.Pool.QueryRow(context.Background(), `SELECT reason, actor, created_at FROM key_holds WHERE key = $1`, key).
		Scan(&h.reason, &h.actor, &h.createdAt)
	if err != nil {
		t.Fatalf("hold of %s: %v", key, err)
	}
	return h
}

// A second hold of a held key is refused with the hold in force, and
// changes nothing: no row, no audit entry.
func TestPutHoldRefusesAHeldKey(t *testing.T) {
	t.Parallel()
	bg := context.Background()
	db := pgtest.New(t)
	processingKey(t, db, "k", "create_ticket")
	if err := pgx.BeginFunc(bg, db.Pool, func(tx pgx.Tx) error { return store.PutHold(bg, tx, "k", "checking the ticket", "alice") }); err != nil {
		t.Fatal(err)
	}
	before := readHold(t, db, "k")

	err := pgx.BeginFunc(bg, db.Pool, func(tx pgx.Tx) error { return store.PutHold(bg, tx, "k", "something else", "bob") })
	var held *store.HeldError
	if !errors.As(err, &held) || !errors.Is(err, store.ErrHeld) {
		t.Fatalf("second hold: %v, want a *HeldError matching ErrHeld", err)
	}
	if held.Hold.Actor != "alice" || held.Hold.Reason != "checking the ticket" || !held.Hold.CreatedAt.Equal(before.createdAt) || held.Hold.Tool != "create_ticket" {
		t.Fatalf("refusal names %+v, want alice's hold", held.Hold)
	}
	if after := readHold(t, db, "k"); after != before {
		t.Fatalf("hold changed by a refused hold: %+v -> %+v", before, after)
	}
	if n := db.Count(t, `reconcile_audit WHERE key = 'k' AND action = 'hold'`); n != 1 {
		t.Fatalf("hold audit entries = %d, want 1 (the refusal is not audited)", n)
	}
}

// ReplaceHold replaces the hold in force, returns it, and audits a hold
// whose evidence names the replaced one; on a key without a hold it holds.
func TestReplaceHold(t *testing.T) {
	t.Parallel()
	bg := context.Background()
	db := pgtest.New(t)
	processingKey(t, db, "k", "create_ticket")
	processingKey(t, db, "free", "create_ticket")
	if err := pgx.BeginFunc(bg, db.Pool, func(tx pgx.Tx) error { return store.PutHold(bg, tx, "k", "checking the ticket", "alice") }); err != nil {
		t.Fatal(err)
	}
	db.Exec(t, `UPDATE key_holds SET created_at = now() - interval '3 days' WHERE key = 'k'`)
	old := readHold(t, db, "k")

	var prev *store.Hold
	err := pgx.BeginFunc(bg, db.Pool, func(tx pgx.Tx) error {
		var err error
		prev, err = store.ReplaceHold(bg, tx, "k", "vendor ticket #42", "bob")
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if prev == nil || prev.Actor != "alice" || prev.Reason != "checking the ticket" || !prev.CreatedAt.Equal(old.createdAt) {
		t.Fatalf("replaced hold = %+v, want alice's", prev)
	}
	now := readHold(t, db, "k")
	if now.actor != "bob" || now.reason != "vendor ticket #42" || time.Since(now.createdAt) > time.Hour {
		t.Fatalf("hold after replace = %+v, want bob's, since now", now)
	}
	hist, err := store.History(bg, db.Pool, "k", 10)
	if err != nil || len(hist) != 2 {
		t.Fatalf("history = %+v, %v", hist, err)
	}
	last := hist[1]
	if last.Action != "hold" || last.Verdict != "operator" || last.Actor != "bob" || last.Error != "vendor ticket #42" {
		t.Fatalf("replace audit = %+v", last)
	}
	var ev struct {
		Replaced struct {
			Reason, Actor string
			Since         time.Time
		}
	}
	if err := json.Unmarshal(last.Evidence, &ev); err != nil || ev.Replaced.Actor != "alice" || ev.Replaced.Reason != "checking the ticket" || !ev.Replaced.Since.Equal(old.createdAt) {
		t.Fatalf("replace evidence = %s (%v), want alice's hold", last.Evidence, err)
	}

	// No hold to replace: ReplaceHold holds, nil previous.
	err = pgx.BeginFunc(bg, db.Pool, func(tx pgx.Tx) error {
		var err error
		prev, err = store.ReplaceHold(bg, tx, "free", "r", "carol")
		return err
	})
	if err != nil || prev != nil {
		t.Fatalf("replace without a hold: %+v, %v", prev, err)
	}
	if h := readHold(t, db, "free"); h.actor != "carol" {
		t.Fatalf("hold = %+v", h)
	}
	if hist, _ := store.History(bg, db.Pool, "free", 10); len(hist) != 1 || hist[0].Evidence != nil {
		t.Fatalf("history of a first hold = %+v (no replaced evidence)", hist)
	}
	// A key not in the ledger is still refused.
	err = pgx.BeginFunc(bg, db.Pool, func(tx pgx.Tx) error { _, err := store.ReplaceHold(bg, tx, "missing", "r", "carol"); return err })
	if !errors.Is(err, ledger.ErrNotFound) {
		t.Fatalf("replace of a missing key: %v", err)
	}
}

// HoldStats counts holds per tool with the oldest's age, and counts holds
// whose key is gone under the empty tool.
func TestHoldStats(t *testing.T) {
	t.Parallel()
	bg := context.Background()
	db := pgtest.New(t)
	stats, err := store.HoldStats(bg, db.Pool)
	if err != nil || len(stats) != 0 {
		t.Fatalf("no holds: %+v, %v", stats, err)
	}
	for _, k := range []string{"t1", "t2", "t3"} {
		processingKey(t, db, k, "create_ticket")
	}
	processingKey(t, db, "c1", "charge_card")
	db.Exec(t, `INSERT INTO key_holds (key, reason, actor, created_at) VALUES
		('t1', 'r', 'alice', now() - interval '30 hours'),
		('t2', 'r', 'alice', now() - interval '2 hours'),
		('c1', 'r', 'bob', now() - interval '10 minutes'),
		('gone', 'r', 'bob', now() - interval '5 days')`)
	stats, err = store.HoldStats(bg, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		tool string
		held int
		age  float64
	}{
		{"", 1, 5 * 86400},
		{"charge_card", 1, 600},
		{"create_ticket", 2, 30 * 3600},
	}
	if len(stats) != len(want) {
		t.Fatalf("stats = %+v", stats)
	}
	for i, w := range want {
		s := stats[i]
		if s.Tool != w.tool || s.Held != w.held || math.Abs(s.OldestAgeSeconds-w.age) > 60 {
			t.Errorf("stats[%d] = %+v, want tool %q, %d held, oldest about %vs", i, s, w.tool, w.held, w.age)
		}
	}
}
