// Package pgtest gives every test a real PostgreSQL: one server per test
// binary, a fresh migrated database per test.
//
// The server is, in order: the one at LEDGERKEEPER_TEST_DATABASE_URL if set;
// a testcontainers-go PostgreSQL container when a Docker engine answers; an
// ephemeral cluster from the local PostgreSQL binaries (package pgembed).
// When none works, the test binary fails loudly with what was tried: the
// database tests are never skipped.
//
// With LEDGERKEEPER_TEST_ENGINE=citus the server is instead a Citus cluster
// (package internal/citustest: a coordinator and two workers, Citus built
// once into a cache directory), and every database, the template included,
// is made on all its nodes: the same tests run against a distributed
// ledger. A failed Citus build fails the binary, saying what to install.
//
// Use it from TestMain:
//
//	func TestMain(m *testing.M) { pgtest.Main(m) }
package pgtest

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/testcontainers/testcontainers-go"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"
	"go.uber.org/goleak"

	"github.com/ledgerkeeper/ledgerkeeper/internal/citustest"
	"github.com/ledgerkeeper/ledgerkeeper/internal/engine"
	"github.com/ledgerkeeper/ledgerkeeper/ledger/ledgertest"
	"github.com/ledgerkeeper/ledgerkeeper/ledger/ledgertest/pgembed"
	"github.com/ledgerkeeper/ledgerkeeper/migrations"
)

// EnvURL names the variable that points the tests at an existing server. The
// user must be allowed to create databases. It is the tool module's
// (ledgertest.EnvURL): one variable points both modules' tests at a server.
const EnvURL = ledgertest.EnvURL

// EnvEngine names the variable that chooses the engine the tests run
// against: unset or "postgres" for PostgreSQL, "citus" for a Citus cluster.
const EnvEngine = "LEDGERKEEPER_TEST_ENGINE"

const templateDB = "ledgerkeeper_template"

var (
	serverURL string             // admin URL of the server, database "postgres"
	cluster   *citustest.Cluster // the Citus cluster, when EnvEngine is "citus"
	prefix    string             // per test binary, so binaries can share one server
	counter   atomic.Int64
)

// Main starts the server, runs the tests, stops the server and exits. It
// also checks for leaked goroutines after a successful run.
func Main(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	ctx := context.Background()
	// Goroutines alive before the tests (the runtime's, the harness's) are
	// not the tests' leaks; anything started by a test and still running
	// after all of them is.
	ignore := goleak.IgnoreCurrent()
	stop, err := start(ctx)
	if err != nil {
		fmt.Fprintf(os.Stderr, "pgtest: no PostgreSQL for the tests: %v\n", err)
		return 1
	}
	code := m.Run()
	if err := dropOwnDatabases(ctx); err != nil {
		fmt.Fprintf(os.Stderr, "pgtest: cleanup: %v\n", err)
	}
	stop()
	if code == 0 {
		if err := goleak.Find(ignore); err != nil {
			fmt.Fprintf(os.Stderr, "pgtest: goroutines leaked: %v\n", err)
			return 1
		}
	}
	return code
}

// Citus reports whether the tests run against a Citus cluster.
func Citus() bool { return cluster != nil }

// LockWaiters is what DB.Count counts to find the sessions of the current
// database that wait on a lock: pg_stat_activity's, or on Citus
// citus_stat_activity's, which holds every node's (a statement on a
// distributed table waits on the worker holding the shard, its session on
// the coordinator waiting on the network).
func LockWaiters() string {
	view := "pg_stat_activity"
	if Citus() {
		view = "citus_stat_activity"
	}
	return view + " WHERE datname = current_database() AND wait_event_type = 'Lock'"
}

func start(ctx context.Context) (func(), error) {
	prefix = fmt.Sprintf("lkt_%d_%d", os.Getpid(), time.Now().UnixNano()%1e6)
	switch e := os.Getenv(EnvEngine); e {
	case "", "postgres":
		engine.SetCitus(false) // known: the store never detects it mid-test
	case "citus":
		return startCitus(ctx)
	default:
		return nil, fmt.Errorf("%s=%q: want postgres or citus", EnvEngine, e)
	}
	var tried []string
	if u := os.Getenv(EnvURL); u != "" {
		serverURL = u
		if err := prepareTemplate(ctx); err != nil {
			return nil, fmt.Errorf("%s is set but unusable: %w", EnvURL, err)
		}
		return func() {}, nil
	}
	tried = append(tried, EnvURL+" is not set")

	if stop, err := startContainer(ctx); err == nil {
		if err := prepareTemplate(ctx); err != nil {
			stop()
			return nil, err
		}
		return stop, nil
	} else {
		tried = append(tried, "testcontainers: "+err.Error())
	}

	srv, err := pgembed.Start(ctx, pgembed.Options{})
	if err != nil {
		tried = append(tried, "local PostgreSQL binaries: "+err.Error())
		return nil, fmt.Errorf("tried, in order:\n  - %s", strings.Join(tried, "\n  - "))
	}
	serverURL = srv.URL
	if err := prepareTemplate(ctx); err != nil {
		srv.Stop()
		return nil, err
	}
	return srv.Stop, nil
}

func startCitus(ctx context.Context) (func(), error) {
	c, err := citustest.Start(ctx)
	if err != nil {
		return nil, fmt.Errorf("%s=citus: %w", EnvEngine, err)
	}
	cluster, serverURL = c, c.Coordinator.URL
	engine.SetCitus(true) // the store's Citus shapes, as the daemon chooses them on a Citus ledger
	if err := prepareTemplate(ctx); err != nil {
		c.Stop()
		return nil, fmt.Errorf("%s=citus: %w", EnvEngine, err)
	}
	return c.Stop, nil
}

func startContainer(ctx context.Context) (func(), error) {
	hctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	provider, err := testcontainers.NewDockerProvider()
	if err != nil {
		return nil, fmt.Errorf("no Docker engine: %w", err)
	}
	defer provider.Close()
	if err := provider.Health(hctx); err != nil {
		return nil, fmt.Errorf("no Docker engine answers: %w", err)
	}
	c, err := tcpostgres.Run(ctx, "postgres:15-alpine",
		tcpostgres.WithDatabase("postgres"),
		tcpostgres.WithUsername("postgres"),
		tcpostgres.WithPassword("postgres"),
		tcpostgres.BasicWaitStrategies(),
	)
	if err != nil {
		return nil, fmt.Errorf("start container: %w", err)
	}
	u, err := c.ConnectionString(ctx, "sslmode=disable")
	if err != nil {
		_ = testcontainers.TerminateContainer(c)
		return nil, err
	}
	serverURL = u
	return func() { _ = testcontainers.TerminateContainer(c) }, nil
}

// prepareTemplate creates this binary's migrated template database.
func prepareTemplate(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, serverURL)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(ctx)
	tmpl := prefix + "_" + templateDB
	if cluster != nil {
		err = cluster.CreateDatabase(ctx, tmpl, "")
	} else {
		_, err = conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{tmpl}.Sanitize())
	}
	if err != nil {
		return fmt.Errorf("create template database: %w", err)
	}
	pool, err := pgxpool.New(ctx, WithDatabase(serverURL, tmpl))
	if err != nil {
		return err
	}
	defer pool.Close()
	if _, err := migrations.Up(ctx, pool, nil); err != nil {
		return fmt.Errorf("migrate template: %w", err)
	}
	return nil
}

func dropOwnDatabases(ctx context.Context) error {
	if cluster != nil {
		return cluster.DropDatabases(ctx, prefix)
	}
	return ledgertest.DropDatabases(ctx, serverURL, prefix)
}

// WithDatabase returns u with its database name replaced
// (pgembed.WithDatabase, under the harness's name for tests).
func WithDatabase(u, db string) string { return pgembed.WithDatabase(u, db) }

// DB is one test's database (the tool side's harness's: Pool, URL, Name,
// Exec, Count).
type DB = ledgertest.DB

// New returns a fresh database with the ledgerkeeper schema applied.
func New(t testing.TB) *DB {
	t.Helper()
	return create(t, prefix+"_"+templateDB)
}

// NewEmpty returns a fresh database without the schema (a downstream, or a
// target for migration tests). On Citus it is a Citus database: the
// extension on every node and the workers known to the coordinator.
func NewEmpty(t testing.TB) *DB {
	t.Helper()
	return create(t, "template0")
}

func create(t testing.TB, template string) *DB {
	t.Helper()
	if serverURL == "" {
		t.Fatal("pgtest: no server: call pgtest.Main(m) from TestMain")
	}
	name := fmt.Sprintf("%s_%d", prefix, counter.Add(1))
	if cluster == nil {
		return ledgertest.CreateDB(t, serverURL, name, template)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if template == "template0" {
		template = ""
	}
	if err := cluster.CreateDatabase(ctx, name, template); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	u := WithDatabase(serverURL, name)
	pool, err := pgxpool.New(ctx, u)
	if err != nil {
		t.Fatalf("pgtest: pool: %v", err)
	}
	t.Cleanup(pool.Close)
	return &DB{Pool: pool, URL: u, Name: name}
}
