package migrations_test

import (
	"context"
	"strings"
	"testing"

	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
	"github.com/ledgerkeeper/ledgerkeeper/migrations"
)

// --distributed on plain PostgreSQL is refused before anything is applied:
// the operator asked for a distributed ledger and would otherwise get a
// plain one without noticing.
func TestDistributedRefusedWithoutCitus(t *testing.T) {
	t.Parallel()
	if pgtest.Citus() {
		t.Log("on Citus: the refusal is PostgreSQL's side; TestCitusLayout covers Citus")
		return
	}
	db := pgtest.NewEmpty(t)
	_, err := migrations.Apply(context.Background(), db.Pool, migrations.Options{Distributed: true})
	if err == nil || !strings.Contains(err.Error(), "citus") {
		t.Fatalf("Apply --distributed on PostgreSQL: err = %v, want a refusal naming citus", err)
	}
	if n := db.Count(t, "pg_tables WHERE schemaname = 'public'"); n != 0 {
		t.Fatalf("%d tables created; want none", n)
	}
}

// On a Citus coordinator, migrating lays the ledger out once: the ledger
// and the reconciler's per-key tables distributed by key in one
// co-location group (a key's decision, state, hold and audit row on one
// shard), every other table on the coordinator, the work recorded; a
// second run changes nothing. On PostgreSQL there is no layout step.
func TestCitusLayout(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewEmpty(t)
	r, err := migrations.Apply(ctx, db.Pool, migrations.Options{Distributed: pgtest.Citus()})
	if err != nil {
		t.Fatal(err)
	}
	if !pgtest.Citus() {
		if r.Citus || len(r.Distributed) != 0 {
			t.Fatalf("on PostgreSQL: %+v; want no Citus layout", r)
		}
		return
	}
	var got []string
	for _, p := range r.Distributed {
		got = append(got, p.Table)
	}
	want := "idempotency_keys reconcile_state key_holds reconcile_audit"
	if strings.Join(got, " ") != want {
		t.Fatalf("distributed %v; want %s", got, want)
	}
	placed, err := migrations.Placements(ctx, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	shapes := map[string]migrations.Placed{}
	for _, p := range placed {
		shapes[p.Table] = p
	}
	group := shapes["idempotency_keys"].Colocation
	for _, tbl := range strings.Fields(want) {
		p := shapes[tbl]
		if p.Shape != "distributed" || p.Column != "key" || p.Colocation != group || group == 0 {
			t.Errorf("%s: %+v; want distributed by key in idempotency_keys' co-location group %d", tbl, p, group)
		}
	}
	// Every table the migrations create has a shape chosen in Layout, and
	// only the per-key tables are distributed.
	named := map[string]string{}
	for _, p := range migrations.Layout {
		named[p.Table] = p.Shape
	}
	for _, p := range placed {
		shape, ok := named[p.Table]
		if !ok {
			t.Errorf("table %s has no shape in migrations.Layout: choose one (and write why)", p.Table)
			continue
		}
		if (shape == migrations.ShapeDistributed) != (p.Shape == "distributed") {
			t.Errorf("table %s is %s on Citus; Layout says %s", p.Table, p.Shape, shape)
		}
	}
	if n := db.Count(t, migrations.LayoutTable); n != 4 {
		t.Errorf("%d layout records; want 4", n)
	}
	// A decision's audit row goes to its key's shard: the primary key
	// carries the distribution column.
	var pk string
	if err := db.Pool.QueryRow(ctx, `SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = 'reconcile_audit_pkey'`).Scan(&pk); err != nil {
		t.Fatal(err)
	}
	if pk != "PRIMARY KEY (key, id)" {
		t.Errorf("reconcile_audit's primary key is %s; want PRIMARY KEY (key, id)", pk)
	}

	again, err := migrations.Apply(ctx, db.Pool, migrations.Options{Distributed: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(again.Applied) != 0 || len(again.Distributed) != 0 {
		t.Fatalf("second migrate: %+v; want nothing applied", again)
	}
}
