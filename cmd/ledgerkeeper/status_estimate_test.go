package main

import (
	"context"
	"encoding/json"
	"regexp"
	"strings"
	"testing"

	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
)

// On a ledger past store.DefaultExactBelow rows with gathered statistics,
// status marks its estimated completed figures (`~` and a note in text,
// completed_estimated in JSON, beside every field it had) and keeps the
// figures an operator acts on exact; --exact counts every row.
func TestStatusMarksEstimates(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	db.Exec(t, `INSERT INTO idempotency_keys (key, tool, request_hash, status, expires_at)
		SELECT 'k' || g, 'create_ticket', 'h', CASE WHEN g <= 3 THEN 'failed_retryable' ELSE 'completed' END, now() + interval '1 day'
		FROM generate_series(1, 120000) g`)
	db.Exec(t, `INSERT INTO idempotency_keys (key, tool, request_hash, claimed_at, expires_at)
		VALUES ('stuck', 'create_ticket', 'h', now() - interval '1 hour', now() + interval '1 day')`)
	db.Exec(t, `ANALYZE idempotency_keys`)

	code, out, stderr := cli(t, "status", "--database-url", db.URL)
	if code != 0 {
		t.Fatalf("status: %d %s %s", code, out, stderr)
	}
	// TOOL, IN FLIGHT, STUCK, OLDEST STUCK, FAILED_RETRYABLE, COMPLETED
	if !regexp.MustCompile(`(?m)^create_ticket\s+0\s+1\s+\S+\s+3\s+~1\d{5}\s`).MatchString(out) ||
		!strings.Contains(out, "~ estimated from PostgreSQL's statistics") {
		t.Fatalf("status does not mark the estimate:\n%s", out)
	}

	var doc struct {
		Tools  []map[string]any `json:"tools"`
		Counts struct {
			CompletedEstimated bool  `json:"completed_estimated"`
			Exact              bool  `json:"exact"`
			EstimatedKeys      int64 `json:"estimated_keys"`
		} `json:"counts"`
	}
	code, out, stderr = cli(t, "status", "--json", "--database-url", db.URL)
	if code != 0 || json.Unmarshal([]byte(out), &doc) != nil || len(doc.Tools) != 1 {
		t.Fatalf("status --json: %d %s %s", code, out, stderr)
	}
	tool := doc.Tools[0]
	for _, f := range []string{"tool", "processing_in_window", "stuck", "failed_retryable", "completed", "held", "configured", "pending_alerts"} {
		if _, ok := tool[f]; !ok {
			t.Errorf("status --json lost the field %q: %v", f, tool)
		}
	}
	if tool["completed_estimated"] != true || tool["stuck"] != 1.0 || tool["failed_retryable"] != 3.0 ||
		!doc.Counts.CompletedEstimated || doc.Counts.Exact || doc.Counts.EstimatedKeys < 100000 {
		t.Fatalf("status --json: tool %v, counts %+v; want completed estimated, exactly 1 stuck and 3 failed_retryable", tool, doc.Counts)
	}

	code, out, _ = cli(t, "status", "--exact", "--database-url", db.URL)
	if code != 0 || !regexp.MustCompile(`(?m)^create_ticket\s+0\s+1\s+\S+\s+3\s+119997\s`).MatchString(out) || strings.Contains(out, "~") {
		t.Fatalf("status --exact does not count every row:\n%s", out)
	}
	code, out, _ = cli(t, "status", "--exact", "--json", "--database-url", db.URL)
	if code != 0 || json.Unmarshal([]byte(out), &doc) != nil || doc.Tools[0]["completed"] != 119997.0 ||
		doc.Tools[0]["completed_estimated"] != false || !doc.Counts.Exact || doc.Counts.CompletedEstimated {
		t.Fatalf("status --exact --json: %s", out)
	}
}

// ledgerkeeper's sessions run without JIT (it compiled a 0.2 s statement
// of status for 2.2 s), unless the database URL asks for it.
func TestConnectTurnsJITOff(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	for _, c := range []struct{ url, want string }{
		{db.URL, "off"},
		{db.URL + map[bool]string{true: "&", false: "?"}[strings.Contains(db.URL, "?")] + "jit=on", "on"},
	} {
		pool, err := connect(context.Background(), c.url, 1)
		if err != nil {
			t.Fatal(err)
		}
		var jit string
		err = pool.QueryRow(context.Background(), `SHOW jit`).Scan(&jit)
		pool.Close()
		if err != nil || jit != c.want {
			t.Errorf("jit = %q (%v) for %s; want %s", jit, err, c.url, c.want)
		}
	}
}
