package ledgertest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerkeeper/ledgerkeeper/ledger/ledgertest/pgembed"
)

// EnvCitusWorkers names the variable that runs the tests against a Citus
// cluster: the workers' host:port pairs, comma-separated
// ("127.0.0.1:9701,127.0.0.1:9702"), with LEDGERKEEPER_TEST_DATABASE_URL
// the coordinator's admin URL (a postgres:// URL of a superuser). Each
// worker is reached as that URL with its host and port. The daemon's
// module's internal/citustest/cmd/citus-cluster starts a throwaway cluster
// and prints both (.ci/run shows how to run it).
//
// In this mode every database New returns is a Citus database, made on
// every node, whose idempotency_keys is distributed by key
// (create_distributed_table('idempotency_keys', 'key')), as the daemon's
// migrations leave a Citus ledger.
const EnvCitusWorkers = "LEDGERKEEPER_TEST_CITUS_WORKERS"

// cluster is the Citus cluster the tests run against; nil on PostgreSQL.
var cluster *citusCluster

// Citus reports whether the tests run against a Citus cluster
// (EnvCitusWorkers set): a test that pins a property a Citus ledger does
// not have by design skips on it, saying which.
func Citus() bool { return cluster != nil }

// citusCluster is a coordinator and its workers, as admin URLs.
type citusCluster struct {
	coordinator     string // admin URL, database "postgres"
	coordinatorHost string
	coordinatorPort int
	workers         []string // admin URLs, in EnvCitusWorkers' order
	workerAddrs     []string // host:port, as given
}

// parseCitus reads the cluster from the coordinator's admin URL and
// EnvCitusWorkers' value.
func parseCitus(coordinator, workers string) (*citusCluster, error) {
	u, err := url.Parse(coordinator)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") || u.Host == "" {
		return nil, fmt.Errorf("with %s set, %s must be the coordinator's postgres:// URL (the workers' are made from it)", EnvCitusWorkers, EnvURL)
	}
	c := &citusCluster{coordinator: coordinator, coordinatorHost: u.Hostname(), coordinatorPort: 5432}
	if p := u.Port(); p != "" {
		if c.coordinatorPort, err = strconv.Atoi(p); err != nil {
			return nil, fmt.Errorf("%s: port %q: %w", EnvURL, p, err)
		}
	}
	for _, addr := range strings.Split(workers, ",") {
		addr = strings.TrimSpace(addr)
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return nil, fmt.Errorf("%s=%q: want host:port pairs, comma-separated: %w", EnvCitusWorkers, workers, err)
		}
		w := *u
		w.Host = addr
		c.workers = append(c.workers, w.String())
		c.workerAddrs = append(c.workerAddrs, addr)
	}
	return c, nil
}

// nodes returns the workers, then the coordinator: the order databases are
// made in (a coordinator's database must find its workers' ready).
func (c *citusCluster) nodes() []string {
	return append(append([]string{}, c.workers...), c.coordinator)
}

// prepareTemplate makes the template database on every node, a Citus
// database (the extension on every node, the coordinator and its workers
// in the coordinator's metadata), applies Schema on the coordinator and
// distributes idempotency_keys by key, then readies it for copies (freeze).
func (c *citusCluster) prepareTemplate(ctx context.Context, name string) error {
	id := pgx.Identifier{name}.Sanitize()
	for _, n := range c.nodes() {
		if err := execOn(ctx, n, "CREATE DATABASE "+id); err != nil {
			return fmt.Errorf("create template database on %s: %w", redact(n), err)
		}
	}
	for _, n := range c.nodes() {
		if err := execOn(ctx, pgembed.WithDatabase(n, name), "CREATE EXTENSION citus"); err != nil {
			return fmt.Errorf("CREATE EXTENSION citus on %s (is the node started with shared_preload_libraries=citus?): %w", redact(n), err)
		}
	}
	coord, err := pgx.Connect(ctx, pgembed.WithDatabase(c.coordinator, name))
	if err != nil {
		return fmt.Errorf("connect to the template database on the coordinator: %w", err)
	}
	defer coord.Close(ctx)
	if _, err := coord.Exec(ctx, "SELECT citus_set_coordinator_host($1, $2)", c.coordinatorHost, c.coordinatorPort); err != nil {
		return fmt.Errorf("citus_set_coordinator_host: %w", err)
	}
	for _, addr := range c.workerAddrs {
		host, port, _ := net.SplitHostPort(addr) // checked by parseCitus
		p, err := strconv.Atoi(port)
		if err != nil {
			return fmt.Errorf("worker %s: port: %w", addr, err)
		}
		if _, err := coord.Exec(ctx, "SELECT citus_add_node($1, $2)", host, p); err != nil {
			return fmt.Errorf("citus_add_node(%s): %w", addr, err)
		}
	}
	// Simple protocol: the schema is several statements in one string.
	if _, err := coord.Exec(ctx, Schema, pgx.QueryExecModeSimpleProtocol); err != nil {
		return fmt.Errorf("create idempotency_keys in the template: %w", err)
	}
	if _, err := coord.Exec(ctx, "SELECT create_distributed_table('idempotency_keys', 'key')"); err != nil {
		return fmt.Errorf("distribute idempotency_keys by key: %w", err)
	}
	_ = coord.Close(ctx)
	return c.freeze(ctx, name)
}

// freeze readies a template for copies: PostgreSQL copies a database only
// while nobody else is connected to it, and Citus keeps sessions in every
// Citus database (each node's maintenance daemon; the coordinator's
// connections to the workers). So, the coordinator first, then the
// workers: no new connections, and the existing ones ended.
func (c *citusCluster) freeze(ctx context.Context, name string) error {
	for _, n := range append([]string{c.coordinator}, c.workers...) {
		if err := freezeOn(ctx, n, name); err != nil {
			return fmt.Errorf("freeze template %s on %s: %w", name, redact(n), err)
		}
	}
	return nil
}

func freezeOn(ctx context.Context, node, name string) error {
	conn, err := pgx.Connect(ctx, node)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{name}.Sanitize()+" WITH ALLOW_CONNECTIONS false"); err != nil {
		return err
	}
	if _, err := conn.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()`, name); err != nil {
		return err
	}
	// pg_terminate_backend only signals: wait for the sessions to end.
	deadline := time.Now().Add(10 * time.Second)
	for {
		var left int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = $1`, name).Scan(&left); err != nil {
			return err
		}
		if left == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d sessions still connected after 10 s", left)
		}
		time.Sleep(20 * time.Millisecond) // polling interval, not synchronisation
	}
}

// createDatabase makes name on every node, workers first, each a copy of
// its own node's template: the coordinator's copy names the same shards,
// which every worker copied too. The caller holds createMu.
func (c *citusCluster) createDatabase(ctx context.Context, name, template string) error {
	for _, n := range c.nodes() {
		if err := execOn(ctx, n, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()+" TEMPLATE "+pgx.Identifier{template}.Sanitize()); err != nil {
			return fmt.Errorf("create database %s on %s: %w", name, redact(n), err)
		}
	}
	return nil
}

// dropDatabases drops this binary's databases on every node, the
// coordinator first, so no worker database is dropped under a coordinator
// session still using it.
func (c *citusCluster) dropDatabases(ctx context.Context, prefix string) error {
	var errs []error
	for _, n := range append([]string{c.coordinator}, c.workers...) {
		if err := DropDatabases(ctx, n, prefix); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", redact(n), err))
		}
	}
	return errors.Join(errs...)
}

func execOn(ctx context.Context, u, sql string) error {
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, sql)
	return err
}

// redact is a node's URL for messages: host and port, never a password.
func redact(u string) string {
	if p, err := url.Parse(u); err == nil {
		return p.Host
	}
	return "the node"
}
