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
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
	"github.com/ledgerkeeper/ledgerkeeper/ledger/ledgertest/pgembed"
	"github.com/ledgerkeeper/ledgerkeeper/ledger/ledgertest/testwait"
)

// fleetLedger is one ledger of the fleet test: where its tables are.
type fleetLedger struct {
	name, schema string
	pool         *pgxpool.Pool
}

func (l fleetLedger) table(name string) string { return pgx.Identifier{l.schema, name}.Sanitize() }

func (l fleetLedger) count(t *testing.T, from string, args ...any) int {
	t.Helper()
	var n int
	if err := l.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+from, args...).Scan(&n); err != nil {
		t.Fatalf("ledger %s: count %s: %v", l.name, from, err)
	}
	return n
}

func (l fleetLedger) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	if _, err := l.pool.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("ledger %s: %s: %v", l.name, sql, err)
	}
}

// stuck inserts a processing key past its window whose ticket exists, and
// an expired completed key for the purge.
func (l fleetLedger) stuck(t *testing.T, rt *router, key string) {
	t.Helper()
	l.exec(t, `INSERT INTO `+l.table("idempotency_keys")+` (key, tool, request_hash, created_at, claimed_at, expires_at)
		VALUES ($1, 'create_ticket', 'h', now() - interval '1 minute', now() - interval '1 minute', now() + interval '1 day')`, key)
	l.exec(t, `INSERT INTO `+l.table("idempotency_keys")+` (key, tool, request_hash, status, response_code, response_body, created_at, expires_at)
		VALUES ($1, 'create_ticket', 'h', 'completed', 201, '{}', now() - interval '1 hour', now() - interval '1 minute')`, key+":expired")
	rt.set(func(rt *router) { rt.tickets[key], rt.tickets[key+":expired"] = true, true })
}

func (l fleetLedger) status(t *testing.T, key string) string {
	t.Helper()
	var s string
	err := l.pool.QueryRow(context.Background(), `SELECT status FROM `+l.table("idempotency_keys")+` WHERE key = $1`, key).Scan(&s)
	if err != nil {
		return "error: " + err.Error()
	}
	return s
}

// One serve keeps three ledgers: billing and support in two schemas of one
// database, ops in a schema of a second database on another server. The
// ledgers' URLs say search_path=nowhere: a statement that left its schema
// to search_path would fail. migrate migrates all three; serve resolves a
// stuck key and purges an expired one in each; Slack's messages and the
// metrics name the ledger. Then the second database's server stops: ops is
// reported not ready, and billing and support go on being reconciled and
// purged, the process ready.
func TestServeKeepsLedgersOfTwoDatabasesIsolated(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db1 := pgtest.NewEmpty(t)
	srv2, err := pgembed.Start(ctx, pgembed.Options{})
	if err != nil {
		t.Fatalf("second PostgreSQL server: %v", err)
	}
	t.Cleanup(srv2.Stop)
	admin2, err := pgx.Connect(ctx, srv2.URL)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin2.Exec(ctx, `CREATE DATABASE fleet_two`); err != nil {
		t.Fatal(err)
	}
	admin2.Close(ctx)
	url1 := withSearchPathNowhere(db1.URL)
	url2 := withSearchPathNowhere(pgembed.WithDatabase(srv2.URL, "fleet_two"))

	rt := newRouter(t)
	slack := newSlackServer(t)
	addr := freeAddr(t)
	cfg := fleetServeConfig(t, slack, rt, addr, `schedule:
  reconcile: "@every 1s"
  purge: "@every 1s"
  alerts: "@every 1s"
reconcile:
  grace: 1s
  alert_after_attempts: 1
retention:
  min_age: 2s
`, fmt.Sprintf(`  billing:
    schema: billing
  support:
    schema: support
  ops:
    database_url: "%s"
    schema: ops
`, url2))

	var out, errb strings.Builder
	if code := run(ctx, []string{"migrate", "--config", cfg, "--database-url", url1}, &out, &errb); code != 0 {
		t.Fatalf("migrate exited %d: %s %s", code, out.String(), errb.String())
	}
	for _, name := range []string{"billing", "ops", "support"} {
		if !strings.Contains(out.String(), "ledger "+name+": applied") {
			t.Errorf("migrate's output does not name ledger %s:\n%s", name, out.String())
		}
	}
	pool2, err := pgxpool.New(ctx, pgembed.WithDatabase(srv2.URL, "fleet_two"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool2.Close)
	billing := fleetLedger{"billing", "billing", db1.Pool}
	support := fleetLedger{"support", "support", db1.Pool}
	ops := fleetLedger{"ops", "ops", pool2}
	all := []fleetLedger{billing, support, ops}
	// The same key in every ledger: each is its own.
	for _, l := range all {
		l.stuck(t, rt, "wf-1:step-1")
	}
	if n := db1.Count(t, `pg_tables WHERE schemaname = 'public'`); n != 0 {
		t.Fatalf("%d tables in database one's public schema: migrate left its ledgers' schemas", n)
	}

	serveUntilCleanup(t, cfg, url1)
	resolvedAndPurged := func(ls []fleetLedger, key string) func() bool {
		return func() bool {
			for _, l := range ls {
				if l.status(t, key) != "completed" || l.count(t, l.table("idempotency_keys")+` WHERE key = $1`, key+":expired") != 0 {
					return false
				}
			}
			return true
		}
	}
	testwait.Eventually(t, resolvedAndPurged(all, "wf-1:step-1"), 40*time.Second, "the stuck key of every ledger completed and its expired key purged")
	for _, l := range all {
		if n := l.count(t, l.table("reconcile_audit")+` WHERE key = 'wf-1:step-1'`); n != 1 {
			t.Errorf("ledger %s: %d audit rows for its key, want 1", l.name, n)
		}
	}
	var st strings.Builder
	if code := run(ctx, []string{"status", "--config", cfg, "--database-url", url1}, &st, io.Discard); code != 0 {
		t.Errorf("status over every ledger exited %d:\n%s", code, st.String())
	}
	for _, name := range []string{"billing", "support", "ops"} {
		if !strings.Contains(st.String(), "\n"+name+" ") {
			t.Errorf("status over every ledger has no line for %s:\n%s", name, st.String())
		}
	}
	metrics := get(t, "http://"+addr+"/metrics")
	for _, name := range []string{"billing", "support", "ops"} {
		if want := `ledgerkeeper_reconcile_passes_total{ledger="` + name + `"`; !strings.Contains(metrics, want) {
			t.Errorf("/metrics has no series with %s", want)
		}
	}
	// Each ledger works on a pool of its own, named after it; none of
	// them on another's database.
	var sessions map[string]int
	rows, err := db1.Pool.Query(ctx, `SELECT application_name, count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND application_name LIKE 'ledgerkeeper/%' GROUP BY 1`)
	if err == nil {
		sessions = map[string]int{}
		var name string
		var n int
		_, err = pgx.ForEachRow(rows, []any{&name, &n}, func() error { sessions[name] = n; return nil })
	}
	if err != nil {
		t.Fatal(err)
	}
	if len(sessions) != 2 || sessions["ledgerkeeper/billing"] == 0 || sessions["ledgerkeeper/support"] == 0 {
		t.Errorf("database one's ledger sessions by application_name: %v; want billing's and support's own pools only", sessions)
	}

	// The second database's server stops.
	pool2.Close()
	srv2.Stop()
	testwait.Eventually(t, func() bool {
		body, code := getStatus(t, "http://"+addr+"/readyz")
		return code == http.StatusOK && strings.Contains(body, "ledger ops: not ready") && strings.Contains(body, "ledger billing: ready")
	}, 30*time.Second, "/readyz to say ops is not ready while the process is")
	for _, l := range []fleetLedger{billing, support} {
		l.stuck(t, rt, "wf-2:step-1")
	}
	testwait.Eventually(t, resolvedAndPurged([]fleetLedger{billing, support}, "wf-2:step-1"), 40*time.Second,
		"billing and support reconciled and purged while ops's database is stopped")
	st.Reset()
	if code := run(ctx, []string{"status", "--config", cfg, "--database-url", url1}, &st, io.Discard); code != 1 {
		t.Errorf("status with ops's database stopped exited %d, want 1:\n%s", code, st.String())
	}
	if !strings.Contains(st.String(), "unreadable") || !strings.Contains(st.String(), "\nbilling ") {
		t.Errorf("status with ops's database stopped:\n%s", st.String())
	}
}

func get(t *testing.T, url string) string {
	t.Helper()
	body, code := getStatus(t, url)
	if code != http.StatusOK {
		t.Fatalf("GET %s: %d %s", url, code, body)
	}
	return body
}

func getStatus(t *testing.T, url string) (string, int) {
	t.Helper()
	resp, err := http.Get(url) //nolint:noctx // a test's request to its own server
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b), resp.StatusCode
}

// With several ledgers, a command that works on one refuses to guess: it
// exits 2 naming the ledgers, or the nearest name on a typo, before it
// connects anywhere.
func TestCommandsAskForALedgerWhenThereAreSeveral(t *testing.T) {
	t.Parallel()
	cfg := writeFile(t, "fleet.yaml", `database:
  url: postgres://nobody@127.0.0.1:1/none
ledgers:
  billing:
    schema: billing
  support:
    schema: support
`)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"reconcile", "--config", cfg}, "this configuration keeps 2 ledgers (billing, support): choose one with --ledger NAME"},
		{[]string{"inspect", "k", "--config", cfg}, "choose one with --ledger NAME"},
		{[]string{"reconcile", "--config", cfg, "--ledger", "biling"}, `--ledger: no ledger "biling" in the configuration (did you mean "billing"?)`},
		{[]string{"status", "--config", cfg, "--ledger", "supprt"}, `did you mean "support"?`},
	} {
		var out, errb strings.Builder
		code := run(context.Background(), tc.args, &out, &errb)
		if code != 2 || !strings.Contains(errb.String(), tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and %q", tc.args, code, errb.String(), tc.want)
		}
	}
}

// A ledger whose schema is behind when serve starts (its newest migration
// unrecorded) waits, said by /readyz: none of its jobs runs, while the
// other ledger's do; once its migrations are current, the running serve
// reconciles it without a restart.
func TestServeHoldsALedgerWhoseSchemaIsBehind(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewEmpty(t)
	rt := newRouter(t)
	slack := newSlackServer(t)
	addr := freeAddr(t)
	cfg := fleetServeConfig(t, slack, rt, addr, `schedule:
  reconcile: "@every 1s"
  alerts: "@every 1s"
reconcile:
  grace: 1s
`, `  current:
    schema: current
  behind:
    schema: behind
`)
	var out, errb strings.Builder
	if code := run(ctx, []string{"migrate", "--config", cfg, "--database-url", db.URL}, &out, &errb); code != 0 {
		t.Fatalf("migrate exited %d: %s", code, errb.String())
	}
	current := fleetLedger{"current", "current", db.Pool}
	behind := fleetLedger{"behind", "behind", db.Pool}
	current.stuck(t, rt, "k1")
	behind.stuck(t, rt, "k1")
	// The newest migration of behind, as if it had not been applied.
	var newest int64
	if err := db.Pool.QueryRow(ctx, `SELECT max(version_id) FROM behind.ledgerkeeper_schema_migrations`).Scan(&newest); err != nil {
		t.Fatal(err)
	}
	behind.exec(t, `DELETE FROM `+behind.table("ledgerkeeper_schema_migrations")+` WHERE version_id = $1`, newest)

	serveUntilCleanup(t, cfg, db.URL)
	testwait.Eventually(t, func() bool { return current.status(t, "k1") == "completed" }, 30*time.Second, "the current ledger's key completed")
	runs := current.count(t, current.table("ledgerkeeper_runs")+` WHERE kind = 'reconcile'`)
	testwait.Eventually(t, func() bool {
		return current.count(t, current.table("ledgerkeeper_runs")+` WHERE kind = 'reconcile'`) >= runs+3
	}, 30*time.Second, "three more passes of the current ledger")
	if s := behind.status(t, "k1"); s != "processing" {
		t.Fatalf("the key of the ledger whose schema is behind is %s, want processing: its jobs ran", s)
	}
	if n := behind.count(t, behind.table("ledgerkeeper_runs")); n != 0 {
		t.Fatalf("the ledger whose schema is behind recorded %d runs, want 0", n)
	}
	body, code := getStatus(t, "http://"+addr+"/readyz")
	if code != http.StatusOK || !strings.Contains(body, "ledger behind: not ready") || !strings.Contains(body, "ledger current: ready") {
		t.Fatalf("/readyz %d:\n%s", code, body)
	}
	// The migration's record back: the schema is current again.
	behind.exec(t, `INSERT INTO `+behind.table("ledgerkeeper_schema_migrations")+` (version_id, is_applied) VALUES ($1, true)`, newest)
	testwait.Eventually(t, func() bool { return behind.status(t, "k1") == "completed" }, 30*time.Second, "the key completed by the running serve once the schema is current")
	testwait.Eventually(t, func() bool {
		body, code := getStatus(t, "http://"+addr+"/readyz")
		return code == http.StatusOK && strings.HasPrefix(body, "ready\n")
	}, 10*time.Second, "/readyz to say every ledger is ready")
}

// `ledgerkeeper console` with a ledgers section serves every ledger:
// /ui/ lists them, each ledger's keys page shows its own keys only, and a
// ledger whose schema is missing is left out while the others are served.
func TestConsoleCommandServesEveryLedger(t *testing.T) {
	t.Parallel()
	db := pgtest.NewEmpty(t)
	cfg := writeFile(t, "fleet.yaml", `console: {auth: none}
ledgers:
  billing:
    schema: billing
  support:
    schema: support
  missing:
    schema: missing
`)
	for _, l := range []string{"billing", "support"} {
		if code, out, errOut := cli(t, "migrate", "--config", cfg, "--database-url", db.URL, "--ledger", l); code != 0 {
			t.Fatalf("migrate %s: %d %s %s", l, code, out, errOut)
		}
	}
	billing := fleetLedger{"billing", "billing", db.Pool}
	support := fleetLedger{"support", "support", db.Pool}
	for _, l := range []fleetLedger{billing, support} {
		l.exec(t, `INSERT INTO `+l.table("idempotency_keys")+` (key, tool, request_hash, created_at, claimed_at, expires_at)
			VALUES ($1, 'create_ticket', 'h', now() - interval '1 hour', now() - interval '1 hour', now() + interval '1 day')`, "k-"+l.name)
	}
	addr := freeAddr(t)
	runInBackground(t, "console", "--config", cfg, "--database-url", db.URL, "--listen", addr)
	base := "http://" + addr
	waitListening(t, base+"/ui/")
	code, page := httpDo(t, http.MethodGet, base+"/ui/", "", "", nil)
	if code != http.StatusOK || !strings.Contains(page, "/ui/ledgers/billing/") || !strings.Contains(page, "/ui/ledgers/support/") {
		t.Errorf("/ui/: %d\n%s", code, page)
	}
	code, page = httpDo(t, http.MethodGet, base+"/ui/ledgers/billing/keys?stuck=1&tool=create_ticket", "", "", nil)
	if code != http.StatusOK || !strings.Contains(page, "k-billing") || strings.Contains(page, "k-support") {
		t.Errorf("billing's keys: %d\n%s", code, page)
	}
	if code, _ := httpDo(t, http.MethodGet, base+"/ui/ledgers/missing/", "", "", nil); code != http.StatusNotFound {
		t.Errorf("the ledger without a schema: %d, want 404 (left out)", code)
	}
}

// serveUntilCleanup runs `serve` on cfg and url until the test ends, and
// reports what it logged if the test failed.
func serveUntilCleanup(t *testing.T, cfg, url string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	exited := make(chan int, 1)
	stderr := &syncBuffer{}
	go func() {
		exited <- run(ctx, []string{"serve", "--config", cfg, "--database-url", url}, io.Discard, stderr)
	}()
	t.Cleanup(func() {
		cancel()
		if code := testwait.Recv(t, exited, 40*time.Second); code != 0 {
			t.Errorf("serve exited %d", code)
		}
		if t.Failed() {
			t.Logf("serve's stderr:\n%s", stderr.String())
		}
	})
}

// fleetServeConfig writes a serve configuration of several ledgers: head
// (schedule, reconcile, retention), Slack on slack, the listener on addr,
// create_ticket probed at rt, and ledgers (the entries of the ledgers
// section).
func fleetServeConfig(t *testing.T, slack *slackServer, rt *router, addr, head, ledgers string) string {
	t.Helper()
	return writeFile(t, "fleet.yaml", head+fmt.Sprintf(`alerts:
  slack:
    token: xoxb-test-token
    channel: "#oncall"
    api_url: "%s/api/"
http:
  listen: "%s"
tools:
  create_ticket:
    processing_window: 1s
    probe:
      type: http
      url: "%s/v1/tickets?idempotency_key={key}"
      match: data
      response_code: 201
      self_check:
        require_witness: false
ledgers:
`, slack.srv.URL, addr, rt.srv.URL)+ledgers)
}

// withSearchPathNowhere is url with search_path=nowhere: a statement that
// leaves its schema to search_path fails on it.
func withSearchPathNowhere(url string) string {
	if strings.Contains(url, "?") {
		return url + "&search_path=nowhere"
	}
	return url + "?search_path=nowhere"
}
