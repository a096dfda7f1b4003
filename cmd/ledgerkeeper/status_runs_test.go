package main

import (
	"strings"
	"testing"

	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
)

// A pass stopped by SIGTERM is recorded as stopped, and status says so
// instead of showing a failure or a bare "ok".
func TestStatusShowsAStoppedRunAsStopped(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	db.Exec(t, `INSERT INTO ledgerkeeper_runs (kind, actor, started_at, stats) VALUES ('reconcile', 'replica-1', now(), '{"stopped": true, "keys": 1}')`)
	code, out, stderr := cli(t, "status", "--database-url", db.URL)
	if code != 0 {
		t.Fatalf("status: %d %s %s", code, out, stderr)
	}
	if !strings.Contains(out, "stopped (graceful") || strings.Contains(out, "error:") {
		t.Fatalf("status does not show the run as stopped:\n%s", out)
	}
}
