package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
	"github.com/ledgerkeeper/ledgerkeeper/store"
)

// TestMain is the package's only TestMain: the CLI's other tests go beside
// it without another.
func TestMain(m *testing.M) { pgtest.Main(m) }

func runCLI(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(context.Background(), args, &out, &errb)
	return code, out.String(), errb.String()
}

func seedPurge(t *testing.T) *pgtest.DB {
	t.Helper()
	db := pgtest.New(t)
	db.Exec(t, `INSERT INTO idempotency_keys (key, tool, request_hash, status, created_at, expires_at)
		SELECT 'old-' || i, CASE WHEN i % 2 = 0 THEN 'create_ticket' ELSE 'charge_card' END, 'h', 'completed',
		       now() - interval '10 days', now() - interval '2 days'
		FROM generate_series(1, 5) i`)
	db.Exec(t, `INSERT INTO idempotency_keys (key, tool, request_hash, status, created_at, expires_at) VALUES
		('stuck', 'create_ticket', 'h', 'processing', now() - interval '10 days', now() - interval '2 days'),
		('fresh', 'create_ticket', 'h', 'completed', now() - interval '1 hour', now() + interval '1 day')`)
	return db
}

func TestPurgeDryRunReadsWell(t *testing.T) {
	t.Parallel()
	db := seedPurge(t)
	code, out, errOut := runCLI(t, "purge", "--dry-run", "--database-url", db.URL)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{
		"Dry run: 5 expired key(s) would be purged",
		"Nothing was deleted.",
		"TOOL", "charge_card", "completed",
		"1 expired but still processing (never purged)",
		"stuck",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("dry run output lacks %q:\n%s", want, out)
		}
	}
	if n := db.Count(t, "idempotency_keys"); n != 7 {
		t.Fatalf("dry run deleted rows: %d left", n)
	}
	t.Logf("\n%s", out)
}

func TestPurgeJSON(t *testing.T) {
	t.Parallel()
	db := seedPurge(t)
	code, out, errOut := runCLI(t, "purge", "--json", "--no-alerts", "--database-url", db.URL)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var rep struct {
		KeysDeleted       int64 `json:"keys_deleted"`
		ExpiredProcessing int64 `json:"expired_processing"`
		AlertsRaised      int   `json:"alerts_raised"`
		Deleted           []struct {
			Table string `json:"table"`
			Rows  int64  `json:"rows"`
		} `json:"deleted"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("stdout is not one JSON document: %v\n%s", err, out)
	}
	if rep.KeysDeleted != 5 || rep.ExpiredProcessing != 1 || rep.AlertsRaised != 1 ||
		rep.Deleted[0].Table != "idempotency_keys" || rep.Deleted[0].Rows != 5 {
		t.Fatalf("report: %+v", rep)
	}
	// --no-alerts leaves the alert in the outbox.
	if n := db.Count(t, "alert_outbox WHERE status = 'pending'"); n != 1 {
		t.Fatalf("%d pending alerts; want 1", n)
	}
}

func TestPurgeHumanOutput(t *testing.T) {
	t.Parallel()
	db := seedPurge(t)
	code, out, errOut := runCLI(t, "purge", "--database-url", db.URL)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{"Purged 5 expired key(s)", "1 expired key(s) are still processing", "idempotency_keys", "ROWS DELETED"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	t.Logf("\n%s", out)
}

func TestPurgeAlreadyRunningExitsZero(t *testing.T) {
	t.Parallel()
	db := seedPurge(t)
	ctx := context.Background()
	conn, err := db.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if ok, err := store.TryPurgeLock(ctx, conn); err != nil || !ok {
		t.Fatalf("lock: %v %v", ok, err)
	}
	defer store.ReleasePurgeLock(ctx, conn) //nolint:errcheck // cleanup; the connection closes with the test
	code, out, errOut := runCLI(t, "purge", "--database-url", db.URL)
	if code != exitOK || !strings.Contains(out, "already running") {
		t.Fatalf("exit %d, out %q, err %q", code, out, errOut)
	}
	if n := db.Count(t, "idempotency_keys"); n != 7 {
		t.Fatalf("%d left; want nothing deleted", n)
	}
}

func TestPurgeExitCodes(t *testing.T) {
	t.Parallel()
	if code, _, _ := runCLI(t, "purge", "--bogus"); code != exitUsage {
		t.Errorf("unknown flag: exit %d; want %d", code, exitUsage)
	}
	if code, _, _ := runCLI(t, "purge", "extra"); code != exitUsage {
		t.Errorf("positional argument: exit %d; want %d", code, exitUsage)
	}
	code, _, errOut := runCLI(t, "purge", "--database-url", "postgres://nobody@127.0.0.1:1/none?connect_timeout=2")
	if code != exitOperational || !strings.Contains(errOut, "is PostgreSQL running?") {
		t.Errorf("database down: exit %d, %q; want %d and advice", code, errOut, exitOperational)
	}
}
