package probes_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
	"github.com/ledgerkeeper/ledgerkeeper/probes"
)

// downstream is a payments database with a charges table.
func downstream(t *testing.T) *pgtest.DB {
	t.Helper()
	db := pgtest.NewEmpty(t)
	db.Exec(t, `CREATE TABLE charges (
		id uuid PRIMARY KEY,
		idempotency_key text NOT NULL,
		account_id text NOT NULL,
		amount_cents bigint NOT NULL,
		amount numeric NOT NULL,
		meta jsonb,
		created_at timestamptz NOT NULL
	)`)
	db.Exec(t, `INSERT INTO charges VALUES
		('0b7e6a8c-4f5e-4a47-9a3e-6f1c2d3e4f50', 'key-one', 'acc-1', 1200, 12345678901234567890.10,
		 '{"ref":"r-1","big":123456789012345678901234567890,"nested":{"ok":true}}', '2025-01-02 03:04:05.123456+00'),
		('1b7e6a8c-4f5e-4a47-9a3e-6f1c2d3e4f51', 'key-two', 'acc-1', 500, 5, NULL, '2025-01-03 00:00:00+00'),
		('2b7e6a8c-4f5e-4a47-9a3e-6f1c2d3e4f52', 'key-two', 'acc-2', 500, 5, NULL, '2025-01-03 00:00:01+00')`)
	return db
}

func newSQL(t *testing.T, cfg probes.SQLConfig) *probes.SQLProbe {
	t.Helper()
	p, err := probes.NewSQL(context.Background(), cfg)
	if err != nil {
		t.Fatalf("NewSQL: %v", err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func keyed(key string) probes.Key {
	k := testKey
	k.Key = key
	return k
}

const chargeQuery = "SELECT id AS charge_id, amount_cents, amount, meta, created_at FROM charges WHERE idempotency_key = $1"

func TestSQLVerdicts(t *testing.T) {
	t.Parallel()
	db := downstream(t)
	p := newSQL(t, probes.SQLConfig{DatabaseURL: db.URL, Query: chargeQuery + ";", Args: []string{"key"}, ResponseCode: 201})

	res := p.Probe(context.Background(), keyed("key-none"))
	assertVerdict(t, res, probes.NotFound)
	assertJSON(t, res.Evidence, `{"rows":0}`)

	res = p.Probe(context.Background(), keyed("key-one"))
	assertVerdict(t, res, probes.Found)
	assertJSON(t, res.Evidence, `{"rows":1}`)
	if res.Outcome.Code != 201 {
		t.Errorf("code = %d", res.Outcome.Code)
	}
	// Numbers stay exact, uuids are text, jsonb is JSON, times are RFC 3339.
	assertJSON(t, res.Outcome.Body, `{
		"charge_id": "0b7e6a8c-4f5e-4a47-9a3e-6f1c2d3e4f50",
		"amount_cents": 1200,
		"amount": 12345678901234567890.10,
		"meta": {"ref":"r-1","big":123456789012345678901234567890,"nested":{"ok":true}},
		"created_at": "2025-01-02T03:04:05.123456Z"
	}`)

	res = p.Probe(context.Background(), keyed("key-two"))
	assertVerdict(t, res, probes.Duplicate)
	assertJSON(t, res.Evidence, `{"rows":2}`)
}

func TestSQLRequestArgs(t *testing.T) {
	t.Parallel()
	db := downstream(t)
	p := newSQL(t, probes.SQLConfig{
		DatabaseURL: db.URL,
		Query: `SELECT id FROM charges
			WHERE account_id = $1 AND idempotency_key = $2 AND amount_cents = $3 AND $4::boolean AND $5 = 'create_ticket'`,
		Args: []string{"request.account.id", "key", "request.amount", "request.flag", "tool"},
	})
	k := keyed("key-two")
	k.RequestBody = json.RawMessage(`{"account":{"id":"acc-2"},"amount":500,"flag":true}`)
	res := p.Probe(context.Background(), k)
	assertVerdict(t, res, probes.Found)
	assertJSON(t, res.Outcome.Body, `{"id":"2b7e6a8c-4f5e-4a47-9a3e-6f1c2d3e4f52"}`)

	for _, body := range []string{
		`{"account":{"id":""},"amount":500,"flag":true}`,        // empty
		`{"account":{"id":null},"amount":500,"flag":true}`,      // null
		`{"account":{},"amount":500,"flag":true}`,               // missing
		`{"account":{"id":["acc-2"]},"amount":500,"flag":true}`, // not a scalar
		`not json`,
	} {
		k.RequestBody = json.RawMessage(body)
		res := p.Probe(context.Background(), k)
		assertVerdict(t, res, probes.Unknown)
		if !strings.Contains(res.Err.Error(), "args[0]") {
			t.Errorf("%s: err = %q", body, res.Err)
		}
	}
}

func TestSQLRunsReadOnlyWithTimeouts(t *testing.T) {
	t.Parallel()
	db := downstream(t)
	// A caller's pool of one connection: no read-only session default, and
	// the session the probe used can be inspected afterwards.
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	p := newSQL(t, probes.SQLConfig{
		Pool: pool,
		Query: `SELECT current_setting('transaction_read_only') AS read_only,
			current_setting('statement_timeout') AS statement_timeout,
			current_setting('lock_timeout') AS lock_timeout`,
		Timeout: 1500 * time.Millisecond,
	})
	res := p.Probe(context.Background(), testKey)
	assertVerdict(t, res, probes.Found)
	assertJSON(t, res.Outcome.Body, `{"read_only":"on","statement_timeout":"1500ms","lock_timeout":"1500ms"}`)
	// The settings were LOCAL and the transaction is over: the session is
	// back to its defaults.
	var ro, st, lt string
	err = pool.QueryRow(context.Background(), "SELECT current_setting('transaction_read_only'), current_setting('statement_timeout'), current_setting('lock_timeout')").Scan(&ro, &st, &lt)
	if err != nil || ro != "off" || st != "0" || lt != "0" {
		t.Errorf("session after the probe: read_only %q, statement_timeout %q, lock_timeout %q, %v", ro, st, lt, err)
	}
}

func TestSQLStatementTimeout(t *testing.T) {
	t.Parallel()
	db := downstream(t)
	p := newSQL(t, probes.SQLConfig{
		DatabaseURL: db.URL,
		Query:       "SELECT id, pg_sleep(30) FROM charges WHERE idempotency_key = $1",
		Args:        []string{"key"},
		Timeout:     200 * time.Millisecond,
	})
	start := time.Now()
	res := p.Probe(context.Background(), keyed("key-one"))
	assertVerdict(t, res, probes.Unknown)
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("probe took %s", d)
	}
	if !strings.Contains(res.Err.Error(), "200ms") {
		t.Errorf("err = %q, want it to name the timeout", res.Err)
	}
	// The probe still works afterwards (the pool replaced a broken conn).
	p2 := newSQL(t, probes.SQLConfig{DatabaseURL: db.URL, Query: chargeQuery, Args: []string{"key"}, Timeout: 2 * time.Second})
	assertVerdict(t, p2.Probe(context.Background(), keyed("key-one")), probes.Found)
}

func TestSQLLockTimeout(t *testing.T) {
	t.Parallel()
	db := downstream(t)
	ctx := context.Background()
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	if _, err := tx.Exec(ctx, "LOCK TABLE charges IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	p := newSQL(t, probes.SQLConfig{DatabaseURL: db.URL, Query: chargeQuery, Args: []string{"key"}, Timeout: 300 * time.Millisecond})
	res := p.Probe(ctx, keyed("key-one"))
	assertVerdict(t, res, probes.Unknown)
	if !strings.Contains(res.Err.Error(), "timeout") {
		t.Errorf("err = %q", res.Err)
	}
}

func TestSQLWritesAreRefused(t *testing.T) {
	t.Parallel()
	db := downstream(t)
	db.Exec(t, "CREATE SEQUENCE s")
	for _, q := range []string{
		"WITH i AS (INSERT INTO charges VALUES (gen_random_uuid(), $1, 'acc-9', 1, 1, NULL, now()) RETURNING id) SELECT id FROM i",
		"WITH d AS (DELETE FROM charges WHERE idempotency_key <> $1 RETURNING *) SELECT count(*) FROM d",
		"WITH u AS (UPDATE charges SET amount_cents = 0 WHERE idempotency_key = $1 RETURNING id) SELECT id FROM u",
		"SELECT id FROM charges WHERE idempotency_key = $1 FOR UPDATE",
		"SELECT nextval('s'), $1::text",
	} {
		p := newSQL(t, probes.SQLConfig{DatabaseURL: db.URL, Query: q, Args: []string{"key"}})
		res := p.Probe(context.Background(), keyed("key-one"))
		assertVerdict(t, res, probes.Unknown)
		if !strings.Contains(res.Err.Error(), "read-only") {
			t.Errorf("%s: err = %q", q, res.Err)
		}
	}
	if n := db.Count(t, "charges"); n != 3 {
		t.Errorf("charges has %d rows, want 3", n)
	}
	if n := db.Count(t, "charges WHERE amount_cents = 0"); n != 0 {
		t.Errorf("%d charges were updated", n)
	}
	var seq int64
	if err := db.Pool.QueryRow(context.Background(), "SELECT last_value FROM s").Scan(&seq); err != nil || seq != 1 {
		t.Errorf("sequence at %d, %v", seq, err)
	}
}

// Zero rows is evidence only from a SELECT returning columns (statements
// that are not a SELECT are refused by NewSQL, see TestNewSQLRejects).
func TestSQLNonSelectIsUnknown(t *testing.T) {
	t.Parallel()
	db := downstream(t)
	// A query that selects no columns proves nothing.
	p := newSQL(t, probes.SQLConfig{DatabaseURL: db.URL, Query: "SELECT FROM charges WHERE idempotency_key = $1", Args: []string{"key"}})
	assertVerdict(t, p.Probe(context.Background(), keyed("key-none")), probes.Unknown)
}

func TestSQLResponseBodyMapping(t *testing.T) {
	t.Parallel()
	db := downstream(t)
	mk := func(m map[string]string) *probes.SQLProbe {
		return newSQL(t, probes.SQLConfig{DatabaseURL: db.URL, Query: `SELECT id AS "charge.id", amount_cents, meta FROM charges WHERE idempotency_key = $1`, Args: []string{"key"}, ResponseBody: m})
	}
	res := mk(map[string]string{"charge_id": "charge.id", "cents": "amount_cents", "ref": "meta.ref", "big": "meta.big"}).Probe(context.Background(), keyed("key-one"))
	assertVerdict(t, res, probes.Found)
	assertJSON(t, res.Outcome.Body, `{"charge_id":"0b7e6a8c-4f5e-4a47-9a3e-6f1c2d3e4f50","cents":1200,"ref":"r-1","big":123456789012345678901234567890}`)

	res = mk(map[string]string{"cents": "amount_cents", "url": "receipt_url"}).Probe(context.Background(), keyed("key-one"))
	assertVerdict(t, res, probes.Unknown)
	if !strings.Contains(res.Err.Error(), "receipt_url") {
		t.Errorf("err = %q", res.Err)
	}
}

func TestSQLColumnTypes(t *testing.T) {
	t.Parallel()
	db := pgtest.NewEmpty(t)
	p := newSQL(t, probes.SQLConfig{DatabaseURL: db.URL, Query: `SELECT
		1::int2 AS i2, 2::int4 AS i4, 9007199254740993::int8 AS i8,
		1.5::float4 AS f4, 'NaN'::float8 AS nan, '-Infinity'::float8 AS ninf,
		'NaN'::numeric AS num_nan, 0.000000000000000000001::numeric AS tiny,
		true AS b, 'x'::text AS t, NULL::text AS n, 'é'::varchar AS v,
		'\x0102'::bytea AS bin,
		'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'::uuid AS u,
		'2025-01-02'::date AS d, 'infinity'::timestamptz AS inf,
		'2025-01-02 03:04:05'::timestamp AS ts,
		'1 day 02:03:04'::interval AS iv,
		'12:34:56'::time AS tod,
		'10.1.2.3/32'::inet AS ip,
		ARRAY[1,2,3] AS ints, ARRAY['a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'::uuid] AS uuids,
		'{"n": 1.10}'::json AS js, '[1, {"a": 12345678901234567890}]'::jsonb AS jb,
		'{"a": "b"}'::jsonb -> 'a' AS jstr`})
	res := p.Probe(context.Background(), testKey)
	assertVerdict(t, res, probes.Found)
	assertJSON(t, res.Outcome.Body, `{
		"i2":1, "i4":2, "i8":9007199254740993,
		"f4":1.5, "nan":"NaN", "ninf":"-Infinity",
		"num_nan":"NaN", "tiny":0.000000000000000000001,
		"b":true, "t":"x", "n":null, "v":"é",
		"bin":"AQI=",
		"u":"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
		"d":"2025-01-02T00:00:00Z", "inf":"infinity",
		"ts":"2025-01-02T03:04:05Z",
		"iv":"1 day 02:03:04",
		"tod":"12:34:56.000000",
		"ip":"10.1.2.3/32",
		"ints":[1,2,3], "uuids":["a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"],
		"js":{"n":1.10}, "jb":[1,{"a":12345678901234567890}],
		"jstr":"b"
	}`)
}

func TestSQLDuplicateColumnsAreUnknown(t *testing.T) {
	t.Parallel()
	db := downstream(t)
	p := newSQL(t, probes.SQLConfig{DatabaseURL: db.URL, Query: "SELECT id, account_id AS id FROM charges WHERE idempotency_key = $1", Args: []string{"key"}})
	res := p.Probe(context.Background(), keyed("key-one"))
	assertVerdict(t, res, probes.Unknown)
	if !strings.Contains(res.Err.Error(), `"id" appears twice`) {
		t.Errorf("err = %q", res.Err)
	}
}

func TestSQLRuntimeErrorIsUnknown(t *testing.T) {
	t.Parallel()
	db := downstream(t)
	for _, q := range []string{
		"SELECT id FROM no_such_table WHERE k = $1",
		"SELECT 1/0 AS x, $1::text",
		"SELECT id FROM charges WHERE idempotency_key = $1 AND amount_cents / 0 = 1",
		"SELECT id FROM charges",                                       // args has more entries than the query has parameters
		"SELECT id FROM charges WHERE k = $1 AND idempotency_key = $2", // fewer
		"SELECT id FROM charges WHERE idempotency_key = $2",            // a gap: $1's type is unknown
	} {
		p := newSQL(t, probes.SQLConfig{DatabaseURL: db.URL, Query: q, Args: []string{"key"}})
		assertVerdict(t, p.Probe(context.Background(), keyed("key-one")), probes.Unknown)
	}
}

func TestSQLUnreachableDatabase(t *testing.T) {
	t.Parallel()
	const password = "pr0be-s3cret-pw"
	p := newSQL(t, probes.SQLConfig{
		// Nothing listens on port 1.
		DatabaseURL: "postgres://prober:" + password + "@127.0.0.1:1/payments?sslmode=disable&connect_timeout=2",
		Query:       chargeQuery,
		Args:        []string{"key"},
		Timeout:     2 * time.Second,
	})
	res := p.Probe(context.Background(), keyed("key-one"))
	assertVerdict(t, res, probes.Unknown)
	if strings.Contains(res.Err.Error(), password) || strings.Contains(string(res.Evidence), password) {
		t.Errorf("err leaks the password: %q", res.Err)
	}
	if !strings.Contains(res.Err.Error(), "cannot reach") {
		t.Errorf("err = %q", res.Err)
	}
}

func TestSQLPasswordScrubbed(t *testing.T) {
	t.Parallel()
	// A server that does not exist, named after the password, so that any
	// message quoting the host would quote the password too.
	const password = "zz-s3cret-host-pw"
	p := newSQL(t, probes.SQLConfig{
		DatabaseURL: "postgres://prober:" + password + "@" + password + ".invalid:5432/payments?connect_timeout=1",
		Query:       chargeQuery,
		Args:        []string{"key"},
		Timeout:     2 * time.Second,
	})
	res := p.Probe(context.Background(), keyed("key-one"))
	assertVerdict(t, res, probes.Unknown)
	if strings.Contains(res.Err.Error(), password) {
		t.Errorf("err leaks the password: %q", res.Err)
	}

	_, err := probes.NewSQL(context.Background(), probes.SQLConfig{DatabaseURL: "postgres://prober:" + password + "@host:notaport/db", Query: "SELECT 1"})
	if err == nil || strings.Contains(err.Error(), password) {
		t.Errorf("NewSQL with a bad URL: %v", err)
	}
}

func TestSQLSharedPoolStaysOpen(t *testing.T) {
	t.Parallel()
	db := downstream(t)
	p, err := probes.NewSQL(context.Background(), probes.SQLConfig{Pool: db.Pool, Query: chargeQuery, Args: []string{"key"}})
	if err != nil {
		t.Fatal(err)
	}
	assertVerdict(t, p.Probe(context.Background(), keyed("key-one")), probes.Found)
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := db.Pool.Ping(context.Background()); err != nil {
		t.Errorf("Close closed the caller's pool: %v", err)
	}
}

func TestSQLCloseClosesOwnPool(t *testing.T) {
	t.Parallel()
	db := downstream(t)
	p, err := probes.NewSQL(context.Background(), probes.SQLConfig{DatabaseURL: db.URL, Query: chargeQuery, Args: []string{"key"}})
	if err != nil {
		t.Fatal(err)
	}
	assertVerdict(t, p.Probe(context.Background(), keyed("key-one")), probes.Found)
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	assertVerdict(t, p.Probe(context.Background(), keyed("key-one")), probes.Unknown)
}

func TestSQLConcurrent(t *testing.T) {
	t.Parallel()
	db := downstream(t)
	p := newSQL(t, probes.SQLConfig{DatabaseURL: db.URL, Query: chargeQuery, Args: []string{"key"}, MaxConns: 2})
	want := map[string]probes.Verdict{"key-none": probes.NotFound, "key-one": probes.Found, "key-two": probes.Duplicate}
	var wg sync.WaitGroup
	for i := range 12 {
		key := []string{"key-none", "key-one", "key-two"}[i%3]
		wg.Go(func() {
			if got := p.Probe(context.Background(), keyed(key)); got.Verdict != want[key] {
				t.Errorf("%s: %+v", key, got)
			}
		})
	}
	wg.Wait()
}

func TestNewSQLRejects(t *testing.T) {
	t.Parallel()
	const url = "postgres://prober:s3cr3t@127.0.0.1:1/payments"
	tests := []struct {
		name   string
		cfg    probes.SQLConfig
		errHas string
	}{
		{"delete", probes.SQLConfig{Query: "DELETE FROM charges WHERE k = $1", Args: []string{"key"}}, `query starts with "DELETE"`},
		{"delete after a comment", probes.SQLConfig{Query: "/* SELECT */ DELETE FROM charges"}, `"DELETE"`},
		{"show", probes.SQLConfig{Query: "SHOW server_version"}, "one SELECT"},
		{"commit", probes.SQLConfig{Query: "COMMIT"}, "one SELECT"},
		{"set", probes.SQLConfig{Query: "SET search_path = public"}, "one SELECT"},
		{"do", probes.SQLConfig{Query: "DO $$ BEGIN END $$"}, "one SELECT"},
		{"empty", probes.SQLConfig{Query: "  -- nothing\n"}, "empty"},
		{"only semicolon", probes.SQLConfig{Query: ";"}, "empty"},
		{"unterminated comment", probes.SQLConfig{Query: "/* SELECT 1"}, "unterminated"},
		{"simple protocol", probes.SQLConfig{Query: "SELECT 1", DatabaseURL: url + "?default_query_exec_mode=simple_protocol"}, "default_query_exec_mode=simple_protocol"},
		{"simple protocol, key=value", probes.SQLConfig{Query: "SELECT 1", DatabaseURL: "host=127.0.0.1 port=1 user=prober password=s3cr3t default_query_exec_mode=simple_protocol"}, "default_query_exec_mode=simple_protocol"},
		{"exec", probes.SQLConfig{Query: "SELECT 1", DatabaseURL: url + "?default_query_exec_mode=exec"}, "default_query_exec_mode=exec"},
		{"bad arg", probes.SQLConfig{Query: "SELECT $1", Args: []string{"claimed_at"}}, "claimed_at"},
		{"bad request arg", probes.SQLConfig{Query: "SELECT $1", Args: []string{"request."}}, "request."},
		{"code", probes.SQLConfig{Query: "SELECT 1", ResponseCode: 42}, "response_code"},
		{"mapping", probes.SQLConfig{Query: "SELECT 1", ResponseBody: map[string]string{"x": "a..b"}}, `"x"`},
		{"timeout", probes.SQLConfig{Query: "SELECT 1", Timeout: -1}, "timeout"},
		{"max conns", probes.SQLConfig{Query: "SELECT 1", MaxConns: -1}, "max_conns"},
	}
	for _, tt := range tests {
		cfg := tt.cfg
		if cfg.DatabaseURL == "" {
			cfg.DatabaseURL = url
		}
		p, err := probes.NewSQL(context.Background(), cfg)
		if err == nil {
			_ = p.Close()
			t.Errorf("%s: NewSQL(%q) succeeded", tt.name, cfg.Query)
			continue
		}
		if !strings.Contains(err.Error(), tt.errHas) {
			t.Errorf("%s: err = %q, want it to mention %q", tt.name, err, tt.errHas)
		}
		if strings.Contains(err.Error(), "s3cr3t") {
			t.Errorf("%s: err leaks the password: %q", tt.name, err)
		}
	}
	if _, err := probes.NewSQL(context.Background(), probes.SQLConfig{Query: "SELECT 1"}); err == nil || !strings.Contains(err.Error(), "database_url") {
		t.Errorf("no database_url: %v", err)
	}
}

// The statements NewSQL must accept: a ';' or '$n' inside strings,
// identifiers, comments and dollar quotes is not one.
func TestNewSQLAcceptsAndRuns(t *testing.T) {
	t.Parallel()
	db := downstream(t)
	for _, q := range []string{
		"SELECT id FROM charges WHERE idempotency_key = $1;",
		"SELECT id FROM charges WHERE idempotency_key = $1 ; -- trailing comment; with a semicolon\n",
		"SELECT id, ';' AS semi, 'it''s; $2' AS s FROM charges WHERE idempotency_key = $1",
		`SELECT id AS "weird;""$2" FROM charges WHERE idempotency_key = $1`,
		"SELECT id /* a; /* nested; */ $2 */ FROM charges WHERE idempotency_key = $1",
		"SELECT id, $$;$2$$ AS d, $tag$ $$ ; $tag$ AS t FROM charges WHERE idempotency_key = $1",
		`SELECT id, E'\';$2' AS e FROM charges WHERE idempotency_key = $1`,
		"SELECT id FROM charges WHERE idempotency_key = $1 -- $2; DELETE FROM charges",
	} {
		p := newSQL(t, probes.SQLConfig{DatabaseURL: db.URL, Query: q, Args: []string{"key"}})
		res := p.Probe(context.Background(), keyed("key-one"))
		assertVerdict(t, res, probes.Found)
		var row map[string]any
		if err := json.Unmarshal(res.Outcome.Body, &row); err != nil || len(row) == 0 {
			t.Errorf("%s: body %s", q, res.Outcome.Body)
		}
	}
	if n := db.Count(t, "charges"); n != 3 {
		t.Errorf("charges has %d rows", n)
	}
}

// withParams appends URL query parameters to a connection URL.
func withParams(u, params string) string {
	if strings.Contains(u, "?") {
		return u + "&" + params
	}
	return u + "?" + params
}

// multiQuery would, run over the simple protocol, end the probe's
// read-only transaction, open a read-write one (which the session's
// read-only default allows) and delete every charge: the read-only
// transaction alone does not stop it.
const multiQuery = "SELECT id FROM charges WHERE idempotency_key = $1; COMMIT; BEGIN READ WRITE; DELETE FROM charges; COMMIT"

// TestSQLMultipleStatementsRefusedByPostgreSQL: the probe's safety against
// a second statement rests on the protocol, not on a scanner: no scanner
// runs (NewSQL checks only the first keyword) and PostgreSQL's Parse
// refuses the string, whatever the DSN or the caller's pool says; the
// charges are all still there.
func TestSQLMultipleStatementsRefusedByPostgreSQL(t *testing.T) {
	t.Parallel()
	db := downstream(t)
	// A caller's pool set to the simple protocol: the probe pins its mode
	// on every query.
	simple, err := pgxpool.ParseConfig(withParams(db.URL, "default_query_exec_mode=simple_protocol"))
	if err != nil {
		t.Fatal(err)
	}
	simplePool, err := pgxpool.NewWithConfig(context.Background(), simple)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(simplePool.Close)
	for name, cfg := range map[string]probes.SQLConfig{
		"own pool":                   {DatabaseURL: db.URL, Query: multiQuery, Args: []string{"key"}},
		"own pool, cache_statement":  {DatabaseURL: withParams(db.URL, "default_query_exec_mode=cache_statement"), Query: multiQuery, Args: []string{"key"}},
		"simple protocol pool":       {Pool: simplePool, Query: multiQuery, Args: []string{"key"}},
		"no parameters":              {DatabaseURL: db.URL, Query: "SELECT 1; DELETE FROM charges"},
		"no parameters, simple pool": {Pool: simplePool, Query: "SELECT 1; DELETE FROM charges"},
	} {
		p := newSQL(t, cfg)
		res := p.Probe(context.Background(), keyed("key-one"))
		assertVerdict(t, res, probes.Unknown)
		var pgErr *pgconn.PgError
		if !errors.As(res.Err, &pgErr) || pgErr.Code != "42601" || !strings.Contains(res.Err.Error(), "cannot insert multiple commands into a prepared statement") {
			t.Errorf("%s: err = %v, want PostgreSQL's refusal (42601)", name, res.Err)
		}
	}
	if n := db.Count(t, "charges"); n != 3 {
		t.Fatalf("charges has %d rows, want 3: a second statement ran", n)
	}

	// The control: the same string over the simple protocol, inside the
	// transaction a probe opens, deletes every charge. This is what the
	// pinned mode prevents.
	ctrl := downstream(t)
	conn, err := pgx.Connect(context.Background(), withParams(ctrl.URL, "default_query_exec_mode=simple_protocol&options=-c%20default_transaction_read_only%3Don"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	if _, err := conn.Exec(context.Background(), "BEGIN READ ONLY"); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(context.Background(), multiQuery, "key-one"); err != nil {
		t.Fatalf("control: %v", err)
	}
	if n := ctrl.Count(t, "charges"); n != 0 {
		t.Fatalf("control: charges has %d rows, want 0 (the simple protocol ran every statement)", n)
	}
}

// TestSQLCheck: Check prepares the query on the downstream, without
// running it, and names the config key of each mistake.
func TestSQLCheck(t *testing.T) {
	t.Parallel()
	db := downstream(t)
	tests := []struct {
		name  string
		cfg   probes.SQLConfig
		field string // "" for no error
		has   string
	}{
		{"good", probes.SQLConfig{Query: chargeQuery, Args: []string{"key"}, ResponseBody: map[string]string{"id": "charge_id", "ref": "meta.ref", "whole": ""}}, "", ""},
		{"too many args", probes.SQLConfig{Query: chargeQuery, Args: []string{"key", "tool"}}, "args", "the query has 1 parameter(s) ($1…$1) but args has 2 entries"},
		{"too few args", probes.SQLConfig{Query: chargeQuery + " AND account_id = $2", Args: []string{"key"}}, "args", "has 2 parameter(s)"},
		{"missing column", probes.SQLConfig{Query: chargeQuery, Args: []string{"key"}, ResponseBody: map[string]string{"id": "charge_id", "url": "receipt_url"}}, "response_body.url", `no column "receipt_url" among the query's result columns (charge_id, amount_cents, amount, meta, created_at)`},
		{"missing table", probes.SQLConfig{Query: "SELECT id FROM charge WHERE idempotency_key = $1", Args: []string{"key"}}, "query", `relation "charge" does not exist`},
		{"two statements", probes.SQLConfig{Query: multiQuery, Args: []string{"key"}}, "query", "cannot insert multiple commands into a prepared statement"},
		{"no columns", probes.SQLConfig{Query: "SELECT FROM charges WHERE idempotency_key = $1", Args: []string{"key"}}, "query", "no columns"},
		{"duplicate columns", probes.SQLConfig{Query: "SELECT id, account_id AS id FROM charges WHERE idempotency_key = $1", Args: []string{"key"}}, "query", `"id" appears twice`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := tt.cfg
			cfg.DatabaseURL = db.URL
			err := newSQL(t, cfg).Check(context.Background())
			if tt.field == "" {
				if err != nil {
					t.Fatalf("Check: %v", err)
				}
				return
			}
			var ce *probes.SQLCheckError
			if !errors.As(err, &ce) || ce.Field != tt.field || !strings.Contains(err.Error(), tt.has) {
				t.Fatalf("Check = %v (%T), want a SQLCheckError on %q saying %q", err, err, tt.field, tt.has)
			}
		})
	}
	if n := db.Count(t, "charges"); n != 3 {
		t.Fatalf("charges has %d rows, want 3", n)
	}

	const password = "ch3ck-s3cret-pw"
	p := newSQL(t, probes.SQLConfig{DatabaseURL: "postgres://prober:" + password + "@127.0.0.1:1/payments?connect_timeout=2", Query: chargeQuery, Args: []string{"key"}, Timeout: 2 * time.Second})
	err := p.Check(context.Background())
	var ce *probes.SQLCheckError
	if err == nil || errors.As(err, &ce) || !strings.Contains(err.Error(), "cannot reach") || strings.Contains(err.Error(), password) {
		t.Fatalf("unreachable: %v", err)
	}
}

func TestSQLGuarded(t *testing.T) {
	t.Parallel()
	db := downstream(t)
	p := probes.Guard(newSQL(t, probes.SQLConfig{DatabaseURL: db.URL, Query: "SELECT id, pg_sleep(30) FROM charges WHERE idempotency_key = $1", Args: []string{"key"}, Timeout: time.Minute}), 150*time.Millisecond)
	res := p.Probe(context.Background(), keyed("key-one"))
	if res.Verdict != probes.Unknown || !errors.Is(res.Err, context.DeadlineExceeded) {
		t.Errorf("got %+v", res)
	}
}
