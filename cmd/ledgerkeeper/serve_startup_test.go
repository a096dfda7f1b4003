package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
	"github.com/ledgerkeeper/ledgerkeeper/ledger/ledgertest/testwait"
)

// serve refuses a listen address that cannot work, and status a database
// URL that is not one, as a usage error (2), before connecting; --migrate
// logs what it applied; an idle delivery pass is recorded, so status's
// alerts run is not minutes old.
func TestServeRefusesAnUnusableListenAddressAndRecordsAnIdlePass(t *testing.T) {
	t.Parallel()
	for _, l := range []string{"bad::addr", ":99999", "nohost"} {
		code, _, stderr := cli(t, "serve", "--listen", l, "--database-url", "postgres://u@127.0.0.1:1/x")
		if code != exitUsage || !strings.Contains(stderr, "--listen:") {
			t.Errorf("serve --listen %s: %d %q", l, code, stderr)
		}
	}
	cfg := writeFile(t, "serve.yaml", "http:\n  listen: \"bad::addr\"\n")
	code, _, stderr := cli(t, "serve", "--config", cfg, "--database-url", "postgres://u@127.0.0.1:1/x")
	if code != exitUsage || !strings.Contains(stderr, "http.listen") {
		t.Errorf("http.listen bad::addr: %d %q", code, stderr)
	}
	code, _, stderr = cli(t, "status", "--database-url", "no-such-thing")
	if code != exitUsage || !strings.Contains(stderr, "the database URL (database.url, $LEDGERKEEPER_DATABASE_URL or --database-url) is not a valid PostgreSQL URL or DSN: expected postgres://USER@HOST:PORT/DBNAME") || strings.Contains(stderr, "[redacted]") {
		// The example URL is not a credential: nothing in it is masked.
		t.Errorf("invalid URL: %d %q", code, stderr)
	}

	db := pgtest.NewEmpty(t)
	cfg = writeFile(t, "serve.yaml", fmt.Sprintf("schedule:\n  reconcile: \"@every 1h\"\n  purge: \"@every 1h\"\n  alerts: \"@every 1h\"\nhttp:\n  listen: %q\n", freeAddr(t)))
	ctx, cancel := context.WithCancel(context.Background())
	exited := make(chan int, 1)
	var logs syncBuffer
	go func() {
		exited <- run(ctx, []string{"serve", "--migrate", "--config", cfg, "--database-url", db.URL}, io.Discard, &logs)
	}()
	t.Cleanup(func() {
		cancel()
		if code := testwait.Recv(t, exited, 40*time.Second); code != 0 {
			t.Errorf("serve exited %d:\n%s", code, logs.String())
		}
	})
	testwait.Eventually(t, func() bool {
		var n int
		err := db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM ledgerkeeper_runs WHERE kind = 'alerts'`).Scan(&n)
		return err == nil && n > 0
	}, 30*time.Second, "serve to record its idle alert-delivery pass")
	if !strings.Contains(logs.String(), "migration applied") || !strings.Contains(logs.String(), "00001_ledger.sql") {
		t.Errorf("serve --migrate logged no applied migration:\n%s", logs.String())
	}
}

// syncBuffer is a bytes.Buffer a running command may write while the test
// reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// An idle pass is recorded at most once a recording interval; a pass that
// did something always is.
func TestIdleRecorderRecordsAnIdlePassOncePerInterval(t *testing.T) {
	t.Parallel()
	r := &idleRecorder{every: time.Minute}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		at   time.Duration
		idle bool
		want bool
	}{
		{0, true, true},                 // the first pass is always recorded
		{15 * time.Second, true, false}, // idle, recorded 15s ago
		{30 * time.Second, false, true}, // did something
		{75 * time.Second, true, false}, // idle, 45s after the last record
		{90 * time.Second, true, true},  // idle, a minute after it
	} {
		if got := r.due(t0.Add(c.at), c.idle); got != c.want {
			t.Errorf("at %s idle=%v: due %v, want %v", c.at, c.idle, got, c.want)
		}
	}
}
