package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
	"github.com/ledgerkeeper/ledgerkeeper/internal/testwait"
)

// refusingPostgres speaks PostgreSQL's protocol just far enough to refuse
// TLS (as a server without ssl does) and then refuse the password, the
// way a server answers after a password rotation. The test PostgreSQL
// trusts every local connection, so it cannot refuse a password itself.
func refusingPostgres(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func(c net.Conn) {
				defer c.Close()
				be := pgproto3.NewBackend(c, c)
				for {
					msg, err := be.ReceiveStartupMessage()
					if err != nil {
						return
					}
					switch m := msg.(type) {
					case *pgproto3.SSLRequest, *pgproto3.GSSEncRequest:
						if _, err := c.Write([]byte("N")); err != nil {
							return
						}
					case *pgproto3.StartupMessage:
						be.Send(&pgproto3.ErrorResponse{Severity: "FATAL", Code: "28P01",
							Message: fmt.Sprintf("password authentication failed for user %q", m.Parameters["user"])})
						_ = be.Flush()
						return
					default:
						return
					}
				}
			}(c)
		}
	}()
	return ln.Addr().String()
}

// Item 1: the cause is the server's refusal, not the first attempt's
// "server refused TLS connection".
func TestConnectErrorNamesTheRealCause(t *testing.T) {
	t.Parallel()
	addr := refusingPostgres(t)
	code, _, stderr := cli(t, "status", "--database-url", "postgres://ledgerkeeper:WRONGpw@"+addr+"/app")
	if code != exitOperational || !strings.Contains(stderr, `password authentication failed for user "ledgerkeeper"`) ||
		!strings.Contains(stderr, "refused the connection") {
		t.Errorf("wrong password: code %d, stderr %q", code, stderr)
	}
	for _, bad := range []string{"tls error", "is PostgreSQL running", "WRONGpw"} {
		if strings.Contains(stderr, bad) {
			t.Errorf("wrong password: stderr says %q: %q", bad, stderr)
		}
	}

	// A database that does not exist, on the real test server, with
	// sslmode left at its default (prefer: TLS is tried first).
	db := pgtest.NewEmpty(t)
	u := strings.TrimSuffix(pgtest.WithDatabase(db.URL, "no_such_db_here"), "?sslmode=disable")
	code, _, stderr = cli(t, "status", "--database-url", u)
	if code != exitOperational || !strings.Contains(stderr, `database "no_such_db_here" does not exist`) || strings.Contains(stderr, "tls error") {
		t.Errorf("missing database: code %d, stderr %q", code, stderr)
	}
}

func TestRootCause(t *testing.T) {
	t.Parallel()
	pgErr := &pgconn.PgError{Severity: "FATAL", Code: "28P01", Message: `password authentication failed for user "lk"`}
	chain := fmt.Errorf("ping: %w", errors.Join(
		errors.New("127.0.0.1:5432 (127.0.0.1): tls error: server refused TLS connection"),
		fmt.Errorf("127.0.0.1:5432 (127.0.0.1): %w", pgErr)))
	if got := rootCause(chain); got != `password authentication failed for user "lk" (SQLSTATE 28P01)` {
		t.Errorf("rootCause = %q", got)
	}
	joined := errors.Join(errors.New("a: connection refused"), errors.New("a: connection refused"), errors.New("b: timeout"))
	if got := rootCause(fmt.Errorf("x: %w", joined)); got != "a: connection refused; b: timeout" {
		t.Errorf("rootCause = %q", got)
	}
}

// Item 2: the scratch database replaces the database, never the user.
func TestScratchURL(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ raw, want string }{
		{"postgres://postgres:pw@127.0.0.1:55432/postgres?sslmode=disable", "postgres://postgres:pw@127.0.0.1:55432/scratch?sslmode=disable"},
		{"postgresql://postgres@db.internal/postgres", "postgresql://postgres@db.internal/scratch"},
		{"postgres://u@h:5432", "postgres://u@h:5432/scratch"},
		{"postgres://u@h/postgres?dbname=postgres", "postgres://u@h/scratch?dbname=scratch"},
		{"host=127.0.0.1 user=postgres dbname=postgres", "host=127.0.0.1 user=postgres dbname=postgres dbname=scratch"},
	} {
		got, err := scratchURL(c.raw, "scratch")
		if err != nil || got != c.want {
			t.Errorf("scratchURL(%q) = %q, %v; want %q", c.raw, got, err, c.want)
		}
	}
}

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

// Items 5 and 10: reconcile --key of a key not in the ledger exits 1; the
// DETAIL column and inspect put the cause first, inspect in full, with
// window and grace named, and a held key is held, not stuck.
func TestOutputsAtThreeAM(t *testing.T) {
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

	// Item 6: --history must be positive: a usage error, before any SQL.
	for _, n := range []string{"0", "-5"} {
		code, _, stderr = cli(t, "inspect", "denied", "--history", n, "--database-url", db.URL)
		if code != exitUsage || !strings.Contains(stderr, "--history must be at least 1") {
			t.Errorf("--history %s: %d %q", n, code, stderr)
		}
	}
}

// Item 14: serve refuses a listen address that cannot work as a usage
// error (2), before connecting; --migrate logs what it applied; an idle
// delivery pass is recorded, so status's alerts run is not minutes old.
func TestServeSmallOnes(t *testing.T) {
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
	if code != exitUsage || !strings.Contains(stderr, "the database URL (database.url, $LEDGERKEEPER_DATABASE_URL or --database-url) is not a valid PostgreSQL URL or DSN") {
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

func TestIdleRecorder(t *testing.T) {
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

// Item 8: one run reports every configuration error, structural (unknown
// key, wrong type) and semantic (the services' validation) together, each
// with its line, and none that only echoes a key already in error.
func TestConfigErrorsInOneRun(t *testing.T) {
	t.Parallel()
	cfg := writeFile(t, "ledgerkeeper.yaml", `reconcile:
  batch_size: lots
  bogus_key: 1
  concurrency: -3
tools:
  create_ticket:
    processing_window: 10x
    probe:
      type: carrier_pigeon
`)
	code, out, stderr := cli(t, "config", "check", "--config", cfg)
	if code != exitUsage || out != "" {
		t.Fatalf("config check: %d\n%s\n%s", code, out, stderr)
	}
	lines := strings.Split(strings.TrimSpace(stderr), "\n")
	want := []string{
		":2: reconcile.batch_size: expected an integer",
		":3: reconcile.bogus_key: unknown key",
		":4: reconcile.concurrency:",
		":7: tools.create_ticket.processing_window: bad duration",
		":9: tools.create_ticket.probe.type:",
	}
	for _, w := range want {
		if !strings.Contains(stderr, w) {
			t.Errorf("stderr lacks %q:\n%s", w, stderr)
		}
	}
	if strings.Count(stderr, "reconcile.batch_size") != 1 || strings.Count(stderr, "processing_window") != 1 {
		t.Errorf("an error repeated for a key already in error:\n%s", stderr)
	}
	if len(lines) > len(want)+1 { // + the "Run 'ledgerkeeper --help'" hint, if any
		t.Errorf("more errors than the file has:\n%s", stderr)
	}
}
