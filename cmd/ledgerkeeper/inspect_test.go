package main

import (
	"strings"
	"testing"
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
)

// inspect of a key no longer in the ledger whose audit trail remains shows
// the trail and says so (exit 1, as for a key never claimed), naming the
// trail's newest entry;
// a key in flight and a stuck one are told apart by the database's clock.
func TestInspectPurgedAndJudged(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	stuckKey(t, db, "create_ticket", "gone", time.Hour)
	stuckKey(t, db, "create_ticket", "young", 0)
	stuckKey(t, db, "create_ticket", "old", time.Hour)
	if code, _, stderr := cli(t, "hold", "gone", "--reason", "r", "--actor", "alice", "--database-url", db.URL); code != 0 {
		t.Fatalf("hold: %d %s", code, stderr)
	}
	if code, _, stderr := cli(t, "release", "gone", "--actor", "bob", "--database-url", db.URL); code != 0 {
		t.Fatalf("release: %d %s", code, stderr)
	}
	db.Exec(t, `DELETE FROM idempotency_keys WHERE key = 'gone'`)

	code, out, stderr := cli(t, "inspect", "gone", "--database-url", db.URL)
	// The trail is shown (issue 10 item 6: no raw SQL needed), then exit 1.
	if code != 1 || !strings.Contains(out, "key gone: the row was purged") || !strings.Contains(out, "History (2):") ||
		!strings.Contains(out, "bob    0        operator  release") || !strings.Contains(stderr, `no key "gone" in the ledger: purged`) ||
		!strings.Contains(stderr, "audit trail remains: 2 entries, the newest release by operator:bob") {
		t.Fatalf("inspect of a purged key: %d %q %q", code, out, stderr)
	}
	// One entry is one entry; a hold whose row is gone says so in status.
	stuckKey(t, db, "create_ticket", "gone-held", time.Hour)
	if code, _, stderr := cli(t, "hold", "gone-held", "--reason", "kept", "--actor", "carol", "--database-url", db.URL); code != 0 {
		t.Fatalf("hold: %d %s", code, stderr)
	}
	db.Exec(t, `DELETE FROM idempotency_keys WHERE key = 'gone-held'`)
	if code, _, stderr := cli(t, "inspect", "gone-held", "--database-url", db.URL); code != 1 || !strings.Contains(stderr, "audit trail remains: 1 entry, the newest hold by operator:carol") {
		t.Fatalf("inspect of a purged key with one audit entry: %d %q", code, stderr)
	}
	if code, out, _ := cli(t, "status", "--database-url", db.URL); code != 0 ||
		!strings.Contains(out, "gone-held (no such key in the ledger: release the hold) held by operator:carol") || strings.Contains(out, "(, )") {
		t.Fatalf("status of a hold without its row: %d\n%s", code, out)
	}
	code, out, _ = cli(t, "inspect", "young", "--database-url", db.URL)
	if code != 0 || !strings.Contains(out, "processing (in flight") {
		t.Fatalf("inspect of a young key: %d\n%s", code, out)
	}
	code, out, _ = cli(t, "inspect", "old", "--database-url", db.URL)
	if code != 0 || !strings.Contains(out, "processing (stuck: past its window") {
		t.Fatalf("inspect of a stuck key: %d\n%s", code, out)
	}
}
