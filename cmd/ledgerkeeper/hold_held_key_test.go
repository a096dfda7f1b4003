package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
)

type holdRow struct {
	Reason, Actor string
	CreatedAt     time.Time
}

func holdOf(t *testing.T, db *pgtest.DB, key string) holdRow {
	t.Helper()
	var h holdRow
	err := db.Pool.QueryRow(context.Background(), `SELECT reason, actor, created_at FROM key_holds WHERE key = $1`, key).
		Scan(&h.Reason, &h.Actor, &h.CreatedAt)
	if err != nil {
		t.Fatalf("hold of %s: %v", key, err)
	}
	return h
}

type holdAudit struct {
	Actor, Reason string
	Evidence      []byte
}

func holdAudits(t *testing.T, db *pgtest.DB, key string) []holdAudit {
	t.Helper()
	rows, err := db.Pool.Query(context.Background(), `SELECT actor, coalesce(error, ''), evidence FROM reconcile_audit
		WHERE key = $1 AND action = 'hold' AND verdict = 'operator' ORDER BY id`, key)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []holdAudit
	for rows.Next() {
		var a holdAudit
		if err := rows.Scan(&a.Actor, &a.Reason, &a.Evidence); err != nil {
			t.Fatal(err)
		}
		out = append(out, a)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// `hold` on a held key refuses (exit 1) with the hold in force and changes
// nothing; --replace replaces it, audited as a hold naming the replaced
// one.
func TestHoldOfAHeldKey(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	url := db.URL
	stuckKey(t, db, "create_ticket", "k", time.Minute)

	code, out, stderr := cli(t, "hold", "k", "--reason", "checking with payments", "--actor", "alice", "--database-url", url)
	if code != 0 || !strings.Contains(out, "key k is on hold (by operator:alice: checking with payments)") {
		t.Fatalf("first hold: %d %q %q", code, out, stderr)
	}
	db.Exec(t, `UPDATE key_holds SET created_at = '2026-01-02T03:04:05Z' WHERE key = 'k'`)
	before := holdOf(t, db, "k")

	// Held again without --replace: refused, the existing hold shown.
	code, out, stderr = cli(t, "hold", "k", "--reason", "retrying by hand", "--actor", "bob", "--database-url", url)
	if code != 1 || out != "" {
		t.Fatalf("hold of a held key: exit %d, stdout %q, want exit 1 and nothing on stdout", code, out)
	}
	for _, want := range []string{"already on hold", "alice", "2026-01-02T03:04:05Z", "checking with payments", "--replace"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("refusal %q does not say %q", stderr, want)
		}
	}
	if after := holdOf(t, db, "k"); after != before {
		t.Fatalf("refused hold changed the hold: %+v -> %+v", before, after)
	}
	if a := holdAudits(t, db, "k"); len(a) != 1 || a[0].Actor != "operator:alice" {
		t.Fatalf("hold audit after the refusal = %+v, want alice's only", a)
	}

	// --replace: bob's hold replaces alice's.
	code, out, stderr = cli(t, "hold", "k", "--reason", "retrying by hand", "--actor", "bob", "--replace", "--database-url", url)
	if code != 0 {
		t.Fatalf("hold --replace: %d %q %q", code, out, stderr)
	}
	for _, want := range []string{"key k is on hold (by operator:bob: retrying by hand)", "replacing the hold by operator:alice since 2026-01-02T03:04:05Z (checking with payments)"} {
		if !strings.Contains(out, want) {
			t.Errorf("hold --replace said %q, want %q", out, want)
		}
	}
	if h := holdOf(t, db, "k"); h.Actor != "operator:bob" || h.Reason != "retrying by hand" || !h.CreatedAt.After(before.CreatedAt) {
		t.Fatalf("hold after --replace = %+v, want bob's, newer", h)
	}
	audits := holdAudits(t, db, "k")
	if len(audits) != 2 || audits[1].Actor != "operator:bob" || audits[1].Reason != "retrying by hand" {
		t.Fatalf("hold audit after --replace = %+v", audits)
	}
	var ev struct {
		Replaced struct {
			Actor, Reason string
			Since         time.Time
		}
	}
	if err := json.Unmarshal(audits[1].Evidence, &ev); err != nil || ev.Replaced.Actor != "operator:alice" || ev.Replaced.Reason != "checking with payments" || !ev.Replaced.Since.Equal(before.CreatedAt) {
		t.Fatalf("replace evidence = %s (%v), want alice's hold", audits[1].Evidence, err)
	}
	if n := db.Count(t, "key_holds"); n != 1 {
		t.Fatalf("key_holds rows = %d, want 1", n)
	}

	// --replace on a key without a hold is a plain hold; the key must exist.
	stuckKey(t, db, "create_ticket", "free", time.Minute)
	code, out, _ = cli(t, "hold", "free", "--reason", "r", "--actor", "carol", "--replace", "--database-url", url)
	if code != 0 || strings.Contains(out, "replacing") || holdOf(t, db, "free").Actor != "operator:carol" {
		t.Fatalf("hold --replace of an unheld key: %d %q", code, out)
	}
	code, _, stderr = cli(t, "hold", "missing", "--reason", "r", "--replace", "--database-url", url)
	if code != 1 || !strings.Contains(stderr, `no key "missing" in the ledger`) {
		t.Fatalf("hold of a missing key: %d %q", code, stderr)
	}
	// --reason is still required: a usage error.
	if code, _, _ = cli(t, "hold", "k", "--replace", "--database-url", url); code != 2 {
		t.Fatalf("hold --replace without --reason: exit %d, want 2", code)
	}
}
