package ledger_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/ledger/ledgertest"
)

func TestQualifySQLQualifiesLedgerTablesOnly(t *testing.T) {
	tables := map[string]bool{"idempotency_keys": true, "key_holds": true}
	const p = `"billing".`
	for _, c := range []struct{ in, want string }{
		{`SELECT key FROM idempotency_keys WHERE key = $1`, `SELECT key FROM "billing".idempotency_keys WHERE key = $1`},
		{`UPDATE idempotency_keys k SET status = 'x' FROM key_holds h WHERE h.key = k.key`,
			`UPDATE "billing".idempotency_keys k SET status = 'x' FROM "billing".key_holds h WHERE h.key = k.key`},
		// Already qualified: left alone, so rewriting is idempotent.
		{`SELECT 1 FROM "billing".idempotency_keys`, `SELECT 1 FROM "billing".idempotency_keys`},
		{`SELECT 1 FROM other.idempotency_keys`, `SELECT 1 FROM other.idempotency_keys`},
		// Literals, quoted identifiers, comments and dollar quotes are text.
		{`SELECT 'idempotency_keys', "idempotency_keys", $$idempotency_keys$$, $t$ key_holds $t$ -- idempotency_keys
/* key_holds /* nested */ idempotency_keys */ FROM idempotency_keys`,
			`SELECT 'idempotency_keys', "idempotency_keys", $$idempotency_keys$$, $t$ key_holds $t$ -- idempotency_keys
/* key_holds /* nested */ idempotency_keys */ FROM "billing".idempotency_keys`},
		{`SELECT E'it\'s idempotency_keys' FROM key_holds`, `SELECT E'it\'s idempotency_keys' FROM "billing".key_holds`},
		{`SELECT 'it''s' FROM key_holds`, `SELECT 'it''s' FROM "billing".key_holds`},
		// Longer identifiers that merely start or end with a table's name.
		{`CREATE INDEX idempotency_keys_expires_at_idx ON idempotency_keys (expires_at)`,
			`CREATE INDEX idempotency_keys_expires_at_idx ON "billing".idempotency_keys (expires_at)`},
		{`SELECT my_key_holds, key_holds2 FROM t`, `SELECT my_key_holds, key_holds2 FROM t`},
		// Parameters are not dollar quotes.
		{`SELECT $1, $2 FROM key_holds`, `SELECT $1, $2 FROM "billing".key_holds`},
		// A table's name cast to regclass addresses the ledger's table.
		{`SELECT reltuples FROM pg_class WHERE oid = 'idempotency_keys'::regclass`,
			`SELECT reltuples FROM pg_class WHERE oid = '"billing".idempotency_keys'::regclass`},
		{`SELECT relname = 'idempotency_keys' FROM pg_class`, `SELECT relname = 'idempotency_keys' FROM pg_class`},
		// Upper case is the same identifier.
		{`select * from IDEMPOTENCY_KEYS`, `select * from "billing".IDEMPOTENCY_KEYS`},
	} {
		got := ledger.QualifySQL(p, tables, c.in)
		if got != c.want {
			t.Errorf("QualifySQL(%q)\n got %q\nwant %q", c.in, got, c.want)
		}
		if again := ledger.QualifySQL(p, tables, got); again != got {
			t.Errorf("not idempotent: %q became %q", got, again)
		}
	}
}

func TestCheckSchemaRefusesNamesThatNeedQuoting(t *testing.T) {
	for _, ok := range []string{"billing", "tenant_42", "_x"} {
		if err := ledger.CheckSchema(ok); err != nil {
			t.Errorf("CheckSchema(%q) = %v, want nil", ok, err)
		}
	}
	for _, bad := range []string{"", "Billing", "a-b", "a b", `a"b`, "1a", "pg_catalog", "information_schema", strings.Repeat("a", 64), "a;drop"} {
		if err := ledger.CheckSchema(bad); err == nil {
			t.Errorf("CheckSchema(%q) = nil, want an error", bad)
		}
	}
}

// A tool server in schema billing and one in schema support share a
// database and a key: each claims, completes and replays its own row, and
// neither sees the other's; nothing is written to the default schema.
func TestToolServersInTwoSchemasOfOneDatabaseAreIsolated(t *testing.T) {
	db := ledgertest.New(t)
	ctx := context.Background()
	billing, support := schemaWith(t, db, "billing"), schemaWith(t, db, "support")

	rb := claim(t, billing, "run-1:step-1", "h-billing")
	rs := claim(t, support, "run-1:step-1", "h-support")
	if rb.Outcome != ledger.New || rs.Outcome != ledger.New {
		t.Fatalf("claims of one key in two schemas: %v and %v, want both claimed", rb.Outcome, rs.Outcome)
	}
	if err := ledger.Complete(ctx, billing, "run-1:step-1", rb.Row.ClaimedAt, 201, json.RawMessage(`{"ticket":"B-1"}`)); err != nil {
		t.Fatal(err)
	}
	// Inside a transaction begun from the wrapper, statements stay in the schema.
	err := pgx.BeginFunc(ctx, support, func(tx pgx.Tx) error {
		return ledger.Complete(ctx, tx, "run-1:step-1", rs.Row.ClaimedAt, 200, json.RawMessage(`{"ticket":"S-1"}`))
	})
	if err != nil {
		t.Fatal(err)
	}
	for schema, want := range map[string]string{"billing": `{"ticket": "B-1"}`, "support": `{"ticket": "S-1"}`} {
		var body string
		if err := db.Pool.QueryRow(ctx, `SELECT response_body::text FROM `+pgx.Identifier{schema, "idempotency_keys"}.Sanitize()+` WHERE status = 'completed'`).Scan(&body); err != nil {
			t.Fatalf("%s: %v", schema, err)
		}
		if body != want {
			t.Errorf("%s holds %s, want %s", schema, body, want)
		}
	}
	if n := db.Count(t, "idempotency_keys"); n != 0 {
		t.Errorf("the default schema's table holds %d rows, want 0", n)
	}
	// A batch is qualified too, and the caller's batch is left as it was.
	b := &pgx.Batch{}
	b.Queue(`SELECT count(*) FROM idempotency_keys`)
	var n int
	b.QueuedQueries[0].QueryRow(func(r pgx.Row) error { return r.Scan(&n) })
	if err := billing.SendBatch(ctx, b).Close(); err != nil {
		t.Fatal(err)
	}
	if n != 1 || b.QueuedQueries[0].SQL != `SELECT count(*) FROM idempotency_keys` {
		t.Errorf("batch: count %d (want 1), caller's SQL now %q", n, b.QueuedQueries[0].SQL)
	}
}

func TestInSchemaRefusesABadName(t *testing.T) {
	db := ledgertest.New(t)
	if _, err := ledger.InSchema(db.Pool, `x"; DROP TABLE idempotency_keys; --`); err == nil {
		t.Fatal("InSchema accepted a name that needs quoting")
	}
	if n := db.Count(t, "idempotency_keys"); n != 0 {
		t.Fatalf("rows: %d", n)
	}
}

// schemaWith creates schema in db with the ledger's table (a copy of the
// default schema's, indexes and all) and returns the database in it.
func schemaWith(t *testing.T, db *ledgertest.DB, schema string) *ledger.SchemaDB {
	t.Helper()
	id := pgx.Identifier{schema}.Sanitize()
	db.Exec(t, `CREATE SCHEMA `+id)
	db.Exec(t, `CREATE TABLE `+id+`.idempotency_keys (LIKE public.idempotency_keys INCLUDING ALL)`)
	s, err := ledger.InSchema(db.Pool, schema)
	if err != nil {
		t.Fatal(err)
	}
	if ledger.SchemaOf(s) != schema {
		t.Fatalf("SchemaOf = %q", ledger.SchemaOf(s))
	}
	return s
}
