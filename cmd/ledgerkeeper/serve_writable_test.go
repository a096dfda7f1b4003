package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerkeeper/ledgerkeeper/ledger/ledgertest/pgembed"
	"github.com/ledgerkeeper/ledgerkeeper/ledger/ledgertest/testwait"
)

// The database turns read-only under a running serve, its sessions left
// open (the old writer of a role flip): /readyz says 503 while the ledger
// cannot be written, although every query still answers;
// ledgerkeeper_database_writable drops to 0; the failover is logged once.
// When the database takes writes again, /readyz is 200 within seconds, with
// no restart.
func TestReadyzIsUnreadyWhileTheLedgerCannotBeWritten(t *testing.T) {
	t.Parallel()
	srv, err := pgembed.Start(context.Background(), pgembed.Options{})
	if err != nil {
		t.Fatalf("start PostgreSQL (needs its binaries: apt-get install postgresql): %v", err)
	}
	t.Cleanup(srv.Stop)
	// One host, no target_session_attrs: new connections reach the
	// read-only node too (as through a DNS name that has not moved yet),
	// so only a check of writability can tell.
	url := srv.URL
	addr := freeAddr(t)
	cfg := writeFile(t, "serve.yaml", fmt.Sprintf(`schedule:
  reconcile: "@every 1s"
  purge: "@every 1h"
  alerts: "@every 1s"
http:
  listen: "%s"
`, addr))

	ctx, cancel := context.WithCancel(context.Background())
	exited := make(chan int, 1)
	var stderr syncBuffer
	go func() {
		exited <- run(ctx, []string{"serve", "--migrate", "--config", cfg, "--database-url", url}, io.Discard, &stderr)
	}()
	t.Cleanup(func() {
		cancel()
		testwait.Recv(t, exited, 40*time.Second)
		if t.Failed() {
			t.Logf("serve's stderr:\n%s", stderr.String())
		}
	})
	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + addr + path) //nolint:noctx // a test's local GET
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	readyz := func() int { code, _ := get("/readyz"); return code }
	metric := func(line string) bool {
		_, body := get("/metrics")
		return strings.Contains(body, line+"\n")
	}
	testwait.Eventually(t, func() bool { return readyz() == http.StatusOK }, 30*time.Second, "serve to be ready")
	if !metric("ledgerkeeper_database_writable 1") {
		t.Fatal("ledgerkeeper_database_writable is not 1 on a writable database")
	}

	setReadOnlyCluster(t, srv, true)
	testwait.Eventually(t, func() bool { return readyz() == http.StatusServiceUnavailable }, 10*time.Second, "/readyz to be 503 on a read-only database")
	if !metric("ledgerkeeper_database_writable 0") {
		t.Error("ledgerkeeper_database_writable is not 0 on a read-only database")
	}
	// It stays unready as long as the database is read-only (every check
	// of several seconds' worth), though the database answers queries.
	for range 5 {
		if code := readyz(); code != http.StatusServiceUnavailable {
			t.Fatalf("/readyz answered %d on a read-only database", code)
		}
	}

	setReadOnlyCluster(t, srv, false)
	back := time.Now()
	testwait.Eventually(t, func() bool { return readyz() == http.StatusOK }, 10*time.Second, "/readyz to be 200 again")
	t.Logf("/readyz 200 again %v after the database took writes", time.Since(back).Round(time.Millisecond))
	testwait.Eventually(t, func() bool { return metric("ledgerkeeper_database_writable 1") }, 10*time.Second, "ledgerkeeper_database_writable back to 1")
	if metric(`ledgerkeeper_database_reconnects_total{reason="not_writable"} 0`) && metric(`ledgerkeeper_database_reconnects_total{reason="read_only"} 0`) {
		t.Error("no reconnect counted for the failover")
	}
	log := stderr.String()
	if n := strings.Count(log, "database failed over"); n != 1 {
		t.Errorf("%d 'database failed over' lines, want 1", n)
	}
	if n := strings.Count(log, "database writable again"); n != 1 {
		t.Errorf("%d 'database writable again' lines, want 1", n)
	}
	select {
	case code := <-exited:
		t.Fatalf("serve exited (%d) during the failover", code)
	default:
	}
}

func setReadOnlyCluster(t *testing.T, s *pgembed.Server, on bool) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, s.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	stmt := `ALTER SYSTEM RESET default_transaction_read_only`
	if on {
		stmt = `ALTER SYSTEM SET default_transaction_read_only = on`
	}
	for _, q := range []string{stmt, `SELECT pg_reload_conf()`} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}
