package main

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
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

// The cause is the server's refusal, not the first attempt's
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

// rootCause names the server's refusal, not the TLS attempt before it, and
// each distinct cause of a joined error once.
func TestRootCauseIsTheServersAnswerEachCauseOnce(t *testing.T) {
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

// The scratch database replaces the database, never the user.
func TestScratchURLReplacesTheDatabaseNeverTheUser(t *testing.T) {
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
