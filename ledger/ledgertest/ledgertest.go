// Package ledgertest gives tests of a tool server (and of package ledger
// itself) a real PostgreSQL with the idempotency_keys table: one server per
// test binary, a fresh database per test. It needs nothing but pgx, so a
// tool server's module gains no test dependencies by using it.
//
// The server is the one at LEDGERKEEPER_TEST_DATABASE_URL if set (its user
// must be allowed to create databases), else a throwaway cluster from the
// local PostgreSQL binaries (package pgembed). When neither works, the test
// binary fails with what was tried: the database tests are never skipped.
//
// With LEDGERKEEPER_TEST_CITUS_WORKERS set as well (EnvCitusWorkers), that
// server is a Citus coordinator and the tests run on a distributed ledger:
// each database is made on every node and its idempotency_keys distributed
// by key. Citus reports the mode.
//
// Use it from TestMain:
//
//	func TestMain(m *testing.M) { ledgertest.Main(m) }
//
// and take a database in each test with New(t).
package ledgertest

import (
	"context"
	_ "embed"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerkeeper/ledgerkeeper/ledger/ledgertest/pgembed"
)

// EnvURL names the variable that points the tests at an existing server,
// the same one the daemon's own test harness reads.
const EnvURL = "LEDGERKEEPER_TEST_DATABASE_URL"

// Schema is the DDL of the idempotency_keys table, exactly as the daemon's
// migrations leave it (a test in the daemon's module fails on any drift).
// It is what New's databases hold; a tool server's tests can apply it to a
// database of their own.
//
//go:embed idempotency_keys.sql
var Schema string

var (
	serverURL string // admin URL of the server, database "postgres"
	prefix    string // per test binary, so binaries can share one server
	counter   atomic.Int64
	createMu  sync.Mutex
)

// Main starts the server, runs the tests, drops their databases, stops the
// server and exits. After a successful run it fails the binary when a
// goroutine is still running this module's code (a heartbeat or handler
// the tests started and never stopped): the leak check the daemon's
// harness gets from goleak, without goleak in this module's requirements.
func Main(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	ctx := context.Background()
	stop, err := start(ctx)
	if err != nil {
		fmt.Fprintf(os.Stderr, "ledgertest: no PostgreSQL for the tests: %v\n", err)
		return 1
	}
	code := m.Run()
	if err := dropOwnDatabases(ctx); err != nil {
		fmt.Fprintf(os.Stderr, "ledgertest: cleanup: %v\n", err)
	}
	stop()
	if code == 0 {
		if leaked := leakedGoroutines(5 * time.Second); leaked != "" {
			fmt.Fprintf(os.Stderr, "ledgertest: goroutines still running the tool side's code after the tests:\n%s\n", leaked)
			return 1
		}
	}
	return code
}

// ownCode marks a stack frame of this module's packages (ledger, ledger/mcpkey
// and below), as the runtime prints it: "<package path>.<function>(".
const ownCode = "github.com/ledgerkeeper/ledgerkeeper/ledger"

// leakedGoroutines polls until no goroutine but the caller's has a frame of
// this module's code, and returns those goroutines' stacks if some still do
// after timeout. Goroutines just told to stop (a pool closed by a test's
// cleanup) get the timeout to finish.
func leakedGoroutines(timeout time.Duration) string {
	deadline := time.Now().Add(timeout)
	for {
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		var leaked []string
		// The first goroutine is this one (running ledgertest.run): skipped.
		for _, g := range strings.Split(string(buf), "\n\n")[1:] {
			if strings.Contains(g, ownCode+".") || strings.Contains(g, ownCode+"/mcpkey.") {
				leaked = append(leaked, g)
			}
		}
		if len(leaked) == 0 {
			return ""
		}
		if time.Now().After(deadline) {
			return strings.Join(leaked, "\n\n")
		}
		time.Sleep(20 * time.Millisecond) // polling interval, not synchronisation
	}
}

func start(ctx context.Context) (func(), error) {
	prefix = fmt.Sprintf("lkl_%d_%d", os.Getpid(), time.Now().UnixNano()%1e6)
	stop := func() {}
	if u := os.Getenv(EnvURL); u != "" {
		serverURL = u
		if w := os.Getenv(EnvCitusWorkers); w != "" {
			c, err := parseCitus(u, w)
			if err != nil {
				return nil, err
			}
			cluster = c
		}
	} else if os.Getenv(EnvCitusWorkers) != "" {
		return nil, fmt.Errorf("%s is set but %s, the coordinator's URL, is not", EnvCitusWorkers, EnvURL)
	} else {
		srv, err := pgembed.Start(ctx, pgembed.Options{})
		if err != nil {
			return nil, fmt.Errorf("tried, in order:\n  - %s is not set\n  - local PostgreSQL binaries: %w", EnvURL, err)
		}
		serverURL, stop = srv.URL, srv.Stop
	}
	if err := prepareTemplate(ctx); err != nil {
		stop()
		return nil, fmt.Errorf("prepare the server: %w", err)
	}
	return stop, nil
}

func templateName() string { return prefix + "_template" }

// prepareTemplate creates this binary's template database holding Schema
// (on Citus, on every node, the table distributed).
func prepareTemplate(ctx context.Context) error {
	if cluster != nil {
		return cluster.prepareTemplate(ctx, templateName())
	}
	conn, err := pgx.Connect(ctx, serverURL)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{templateName()}.Sanitize()); err != nil {
		return fmt.Errorf("create template database: %w", err)
	}
	tmpl, err := pgx.Connect(ctx, pgembed.WithDatabase(serverURL, templateName()))
	if err != nil {
		return fmt.Errorf("connect to the template database: %w", err)
	}
	defer tmpl.Close(ctx)
	// Simple protocol: the schema is several statements in one string.
	if _, err := tmpl.Exec(ctx, Schema, pgx.QueryExecModeSimpleProtocol); err != nil {
		return fmt.Errorf("create idempotency_keys in the template: %w", err)
	}
	return nil
}

func dropOwnDatabases(ctx context.Context) error {
	if cluster != nil {
		return cluster.dropDatabases(ctx, prefix)
	}
	return DropDatabases(ctx, serverURL, prefix)
}

// DropDatabases drops, on the server at serverURL (an admin URL), every
// database whose name starts with prefix: what one test binary created.
// The daemon's harness (internal/pgtest) shares it.
func DropDatabases(ctx context.Context, serverURL, prefix string) error {
	conn, err := pgx.Connect(ctx, serverURL)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, "SELECT datname FROM pg_database WHERE datname LIKE $1", prefix+"%")
	if err != nil {
		return err
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	for _, n := range names {
		if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{n}.Sanitize()+" WITH (FORCE)"); err != nil {
			return err
		}
	}
	return nil
}

// DB is one test's database.
type DB struct {
	// Pool is connected to the database; closed when the test ends.
	Pool *pgxpool.Pool
	// URL connects to the same database (for subprocesses and second pools).
	URL string
	// Name is the database name.
	Name string
}

// New returns a fresh database holding the idempotency_keys table (Schema);
// on Citus, a Citus database on every node, the table distributed by key,
// and the DB's URL and pool on the coordinator.
func New(t testing.TB) *DB {
	t.Helper()
	if serverURL == "" {
		t.Fatal("ledgertest: no server: call ledgertest.Main(m) from TestMain")
	}
	name := fmt.Sprintf("%s_%d", prefix, counter.Add(1))
	if cluster == nil {
		return CreateDB(t, serverURL, name, templateName())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	createMu.Lock() // as in CreateDB: one copy of the template at a time
	err := cluster.createDatabase(ctx, name, templateName())
	createMu.Unlock()
	if err != nil {
		t.Fatalf("ledgertest: %v", err)
	}
	return open(t, serverURL, name)
}

// CreateDB creates database name on the server at serverURL (an admin URL)
// as a copy of template, and returns it with a pool closed when the test
// ends. The daemon's harness (internal/pgtest) shares it.
func CreateDB(t testing.TB, serverURL, name, template string) *DB {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, serverURL)
	if err != nil {
		t.Fatalf("ledgertest: connect: %v", err)
	}
	// Copies of one template are serialised: PostgreSQL refuses a copy while
	// another session is connected to the template.
	createMu.Lock()
	_, err = conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()+" TEMPLATE "+pgx.Identifier{template}.Sanitize())
	createMu.Unlock()
	conn.Close(ctx)
	if err != nil {
		t.Fatalf("ledgertest: create database: %v", err)
	}
	return open(t, serverURL, name)
}

// open returns database name on the server at serverURL with a pool closed
// when the test ends.
func open(t testing.TB, serverURL, name string) *DB {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	u := pgembed.WithDatabase(serverURL, name)
	pool, err := pgxpool.New(ctx, u)
	if err != nil {
		t.Fatalf("ledgertest: pool: %v", err)
	}
	t.Cleanup(pool.Close)
	return &DB{Pool: pool, URL: u, Name: name}
}

// Exec runs a statement and fails the test on error.
func (d *DB) Exec(t testing.TB, sql string, args ...any) {
	t.Helper()
	if _, err := d.Pool.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("ledgertest: %s: %v", sql, err)
	}
}

// Count returns SELECT count(*) of the query's rows.
func (d *DB) Count(t testing.TB, from string, args ...any) int {
	t.Helper()
	var n int
	if err := d.Pool.QueryRow(context.Background(), "SELECT count(*) FROM "+from, args...).Scan(&n); err != nil {
		t.Fatalf("ledgertest: count %s: %v", from, err)
	}
	return n
}
