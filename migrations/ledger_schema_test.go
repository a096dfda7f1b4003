package migrations_test

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
	"github.com/ledgerkeeper/ledgerkeeper/ledger/ledgertest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// describeTable lists what makes idempotency_keys what it is, as PostgreSQL
// itself prints it back (so whitespace and spelling in the DDL do not
// matter): each column with its type, NOT NULL and default, in order; each
// constraint (primary key, CHECK) by name with its definition; each index by
// name with its definition; the storage parameters.
func describeTable(t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	ctx := context.Background()
	var out []string
	collect := func(what, sql string) {
		rows, err := pool.Query(ctx, sql)
		if err != nil {
			t.Fatalf("describe %s: %v", what, err)
		}
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatalf("describe %s: %v", what, err)
		}
		if len(lines) == 0 {
			t.Fatalf("describe %s: nothing found: is there an idempotency_keys table?", what)
		}
		for _, l := range lines {
			out = append(out, what+" "+l)
		}
	}
	collect("column", `
		SELECT format('%s %s%s%s', a.attname, format_type(a.atttypid, a.atttypmod),
		              CASE WHEN a.attnotnull THEN ' NOT NULL' ELSE '' END,
		              COALESCE(' DEFAULT ' || pg_get_expr(d.adbin, d.adrelid), ''))
		FROM pg_attribute a
		LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
		WHERE a.attrelid = 'idempotency_keys'::regclass AND a.attnum > 0 AND NOT a.attisdropped
		ORDER BY a.attnum`)
	collect("constraint", `
		SELECT conname || ' ' || pg_get_constraintdef(oid)
		FROM pg_constraint WHERE conrelid = 'idempotency_keys'::regclass
		ORDER BY conname`)
	collect("index", `
		SELECT indexrelid::regclass::text || ' ' || pg_get_indexdef(indexrelid)
		FROM pg_index WHERE indrelid = 'idempotency_keys'::regclass
		ORDER BY 1`)
	collect("storage", `
		SELECT COALESCE(array_to_string(reloptions, ', '), '(none)')
		FROM pg_class WHERE oid = 'idempotency_keys'::regclass`)
	return out
}

// The tool module (ledger/go.mod) owns the DDL of its own table,
// ledgertest.Schema, for tests of tool servers; the daemon's migrations
// create the same table in production. Any difference between the two is a
// drift: a tool server's tests would pass against a table the daemon does
// not create.
func TestLedgerSchemaMatchesMigrations(t *testing.T) {
	t.Parallel()
	migrated := pgtest.New(t)
	own := pgtest.NewEmpty(t)
	if _, err := own.Pool.Exec(context.Background(), ledgertest.Schema, pgx.QueryExecModeSimpleProtocol); err != nil {
		t.Fatalf("apply ledgertest.Schema: %v", err)
	}
	want, got := describeTable(t, migrated.Pool), describeTable(t, own.Pool)
	if slices.Equal(want, got) {
		return
	}
	var diff string
	for _, l := range want {
		if !slices.Contains(got, l) {
			diff += fmt.Sprintf("\n  migrations only:       %s", l)
		}
	}
	for _, l := range got {
		if !slices.Contains(want, l) {
			diff += fmt.Sprintf("\n  ledgertest.Schema only: %s", l)
		}
	}
	if diff == "" {
		diff = fmt.Sprintf("\n  same lines, another order:\n  migrations:        %q\n  ledgertest.Schema: %q", want, got)
	}
	t.Fatalf("ledger/ledgertest/idempotency_keys.sql has drifted from the migrations:%s", diff)
}
