package main

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
)

// deniedConfig is a configuration whose create_ticket probe asks a
// downstream that answers 401 for the key "denied" and an empty list for
// every other key (the self-check's made-up key included).
func deniedConfig(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("idempotency_key") == "denied" {
			http.Error(w, `{"error":"token expired"}`, http.StatusUnauthorized)
			return
		}
		_, _ = w.Write([]byte(`{"data":[]}`))
	}))
	t.Cleanup(srv.Close)
	return writeFile(t, "ledgerkeeper.yaml", fmt.Sprintf(`reconcile:
  grace: 2s
  alert_after_attempts: 5
tools:
  create_ticket:
    processing_window: 15s
    probe:
      type: http
      url: "%s/v1/tickets?idempotency_key={key}&expand=everything&include=all_the_fields"
      match: data
      response_code: 201
      response_body: {ticket_id: id}
`, srv.URL))
}

// reconcile --key of a key not in the ledger exits 1; the
// DETAIL column and inspect put the cause first, inspect in full, with
// window and grace named, and a held key is held, not stuck.
func TestReconcileAndInspectPutAStuckKeysCauseFirst(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	cfg := deniedConfig(t)
	stuckKey(t, db, "create_ticket", "denied", time.Hour)
	stuckKey(t, db, "create_ticket", "parked", time.Hour)

	code, out, stderr := cli(t, "reconcile", "--config", cfg, "--database-url", db.URL, "--key", "denied", "--no-alerts")
	if code != 0 {
		t.Fatalf("reconcile: %d\n%s\n%s", code, out, stderr)
	}
	var row string
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "denied") && strings.Contains(l, "unknown") {
			row = l
		}
	}
	if i, j := strings.Index(row, "unexpected status 401 Unauthorized"), strings.Index(row, "(http"); i < 0 || j < i {
		t.Errorf("DETAIL does not start with the cause:\n%s", out)
	}

	code, out, stderr = cli(t, "reconcile", "--config", cfg, "--database-url", db.URL, "--key", "nope", "--key", "denied", "--no-alerts")
	if code != exitOperational || !strings.Contains(stderr, `no key "nope" in the ledger`) {
		t.Errorf("reconcile --key nope: %d\n%s\n%s", code, out, stderr)
	}

	code, out, stderr = cli(t, "inspect", "denied", "--config", cfg, "--database-url", db.URL)
	if code != 0 {
		t.Fatalf("inspect: %d %s", code, stderr)
	}
	for _, want := range []string{
		"stuck: past its window + grace of 17s: processing window 15s + grace 2s)",
		"last_error     unexpected status 401 Unauthorized",
		"include=all_the_fields)", // the whole error, not clipped
	} {
		if !strings.Contains(out, want) {
			t.Errorf("inspect lacks %q:\n%s", want, out)
		}
	}
	for _, l := range strings.Split(out, "\n") {
		if !strings.Contains(l, "evidence:") {
			continue
		}
		if e, c := strings.Index(l, "evidence:"), strings.Index(l, "unexpected status 401"); c < 0 || c > e {
			t.Errorf("history lists evidence before the error: %q", l)
		}
	}

	if code, _, stderr := cli(t, "hold", "parked", "--reason", "checking", "--database-url", db.URL); code != 0 {
		t.Fatalf("hold: %d %s", code, stderr)
	}
	code, out, _ = cli(t, "inspect", "parked", "--config", cfg, "--database-url", db.URL)
	if code != 0 || !strings.Contains(out, "processing (held:") || strings.Contains(out, "stuck") {
		t.Errorf("inspect of a held key: %d\n%s", code, out)
	}

	// --history must be positive: a usage error, before any SQL.
	for _, n := range []string{"0", "-5"} {
		code, _, stderr = cli(t, "inspect", "denied", "--history", n, "--database-url", db.URL)
		if code != exitUsage || !strings.Contains(stderr, "--history must be at least 1") {
			t.Errorf("--history %s: %d %q", n, code, stderr)
		}
	}
}
