package citustest_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerkeeper/ledgerkeeper/internal/citustest"
)

// A database copied from a template with a distributed table is a working
// Citus database of its own: its shards are on the workers, its rows are
// its own (the template's stay as they were), and a second copy starts from
// the template again.
func TestCopiesOfADistributedTemplateAreIndependentClusters(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := citustest.Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	t.Cleanup(func() {
		if err := c.DropDatabases(context.Background(), "ct_"); err != nil {
			t.Errorf("drop: %v", err)
		}
	})

	if err := c.CreateDatabase(ctx, "ct_tmpl", ""); err != nil {
		t.Fatal(err)
	}
	tmpl := connect(t, ctx, citustest.WithDatabase(c.Coordinator.URL, "ct_tmpl"))
	var workers int
	if err := tmpl.QueryRow(ctx, `SELECT count(*) FROM citus_get_active_worker_nodes()`).Scan(&workers); err != nil {
		t.Fatal(err)
	}
	if workers != citustest.Workers {
		t.Fatalf("active workers = %d, want %d", workers, citustest.Workers)
	}
	for _, s := range []string{
		`CREATE TABLE t (k text PRIMARY KEY, v int NOT NULL)`,
		`SELECT create_distributed_table('t', 'k')`,
		`INSERT INTO t SELECT 'k' || i, 0 FROM generate_series(1, 100) i`,
	} {
		if _, err := tmpl.Exec(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	tmpl.Close(ctx)

	for _, name := range []string{"ct_a", "ct_b"} {
		if err := c.CreateDatabase(ctx, name, "ct_tmpl"); err != nil {
			t.Fatal(err)
		}
		db := connect(t, ctx, citustest.WithDatabase(c.Coordinator.URL, name))
		var n, sum int
		if err := db.QueryRow(ctx, `SELECT count(*), coalesce(sum(v), 0) FROM t`).Scan(&n, &sum); err != nil {
			t.Fatalf("%s: read: %v", name, err)
		}
		if n != 100 || sum != 0 {
			t.Fatalf("%s: %d rows summing to %d, want the template's 100 rows summing to 0", name, n, sum)
		}
		if _, err := db.Exec(ctx, `UPDATE t SET v = 1`); err != nil {
			t.Fatalf("%s: update: %v", name, err)
		}
		// The shards are on the workers, and each worker's copy is this
		// database's: count per worker what the coordinator routes there.
		var nodes int
		if err := db.QueryRow(ctx, `SELECT count(DISTINCT nodeport) FROM citus_shards WHERE table_name = 't'::regclass`).Scan(&nodes); err != nil {
			t.Fatal(err)
		}
		if nodes != citustest.Workers {
			t.Fatalf("%s: shards on %d nodes, want %d", name, nodes, citustest.Workers)
		}
		for _, w := range c.Workers {
			wdb := connect(t, ctx, citustest.WithDatabase(w.URL, name))
			var shardSum int
			if err := wdb.QueryRow(ctx, `SELECT coalesce(sum(v), 0) FROM t`).Scan(&shardSum); err != nil {
				t.Fatalf("%s on worker %d: %v", name, w.Port, err)
			}
			if shardSum == 0 {
				t.Fatalf("%s on worker %d: the update reached none of its shards", name, w.Port)
			}
			wdb.Close(ctx)
		}
		db.Close(ctx)
	}
}

func connect(t *testing.T, ctx context.Context, url string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}
