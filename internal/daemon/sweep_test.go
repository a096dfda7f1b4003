package daemon

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
	"github.com/ledgerkeeper/ledgerkeeper/reconcile"
)

// countingTracer counts the statements a pool sends: all of them, and those
// naming an alert table or idempotency_keys.
type countingTracer struct{ all, alerts, keys atomic.Int64 }

func (c *countingTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	c.all.Add(1)
	if strings.Contains(d.SQL, "alert_state") || strings.Contains(d.SQL, "alert_outbox") {
		c.alerts.Add(1)
	}
	if strings.Contains(d.SQL, "idempotency_keys") {
		c.keys.Add(1)
	}
	return ctx
}

func (c *countingTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// The reconciler's alert sweep (reconcile/sweep.go) over 2,400 open key
// alerts: each pass examines at most 1,000 of them, resuming where the last
// one stopped, and resolves every settled key's alerts (completed,
// failed_retryable, gone) with a constant number of statements per page of
// 200, not one query and one transaction per alert. Alerts of keys still
// processing stay open.
func TestAlertSweepIsSetBasedAndBounded(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	// 2,000 keys; by i % 4: completed, failed_retryable, processing (in
	// its window: not due), not in the ledger. Every key has a
	// probe_failing alert, every fifth a no_probe one too: 2,400 alerts.
	db.Exec(t, `INSERT INTO idempotency_keys (key, tool, request_hash, status, created_at, claimed_at, expires_at)
		SELECT 'k' || lpad(i::text, 4, '0'), 't', 'h', (ARRAY['completed', 'failed_retryable', 'processing'])[i % 4 + 1],
		       now(), now(), now() + interval '1 day'
		FROM generate_series(0, 1999) i WHERE i % 4 <> 3`)
	db.Exec(t, `INSERT INTO alert_state (reason, subject, tool, key)
		SELECT r, 'key:k' || lpad(i::text, 4, '0'), 't', 'k' || lpad(i::text, 4, '0')
		FROM generate_series(0, 1999) i, unnest(ARRAY['probe_failing', 'no_probe']) r
		WHERE r = 'probe_failing' OR i % 5 = 0`)
	if n := db.Count(t, "alert_state WHERE resolved_at IS NULL"); n != 2400 {
		t.Fatalf("%d open alerts set up; want 2400", n)
	}

	pc, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	tracer := &countingTracer{}
	pc.ConnConfig.Tracer = tracer
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	e := reconcile.New(reconcile.Config{Actor: "sweep-test"}, pool, nil, nil)

	// Settled alerts among the first 1,000 open ones (by subject, reason):
	// keys k0000..k0832 hold them (833 keys, 167 with two alerts).
	total := 0
	for pass := 1; pass <= 4; pass++ {
		before := [3]int64{tracer.all.Load(), tracer.alerts.Load(), tracer.keys.Load()}
		rep, err := e.Run(ctx, reconcile.Options{})
		if err != nil {
			t.Fatalf("pass %d: %v", pass, err)
		}
		all, al, keys := tracer.all.Load()-before[0], tracer.alerts.Load()-before[1], tracer.keys.Load()-before[2]
		t.Logf("pass %d: resolved %d alerts with %d statements (%d on alert tables, %d on idempotency_keys)", pass, rep.ResolvedAlerts, all, al, keys)
		// 5 pages × (list + resolve) on the alert tables, 5 status reads
		// of a page's keys; the rest of the pass is the engine's own.
		if al > 10 || keys > 5+20 || all > 100 {
			t.Errorf("pass %d sent %d statements (%d on alert tables, %d on idempotency_keys): the sweep is not set-based", pass, all, al, keys)
		}
		total += rep.ResolvedAlerts
		if pass == 1 && (rep.ResolvedAlerts < 700 || rep.ResolvedAlerts > 800) {
			t.Errorf("pass 1 resolved %d; want the settled ones of the first 1,000 open alerts (about 750)", rep.ResolvedAlerts)
		}
		if pass == 4 && rep.ResolvedAlerts != 0 {
			t.Errorf("pass 4 resolved %d; everything settled was resolved already", rep.ResolvedAlerts)
		}
	}
	// Processing keys: 500, of which 100 with two alerts.
	if open := db.Count(t, "alert_state WHERE resolved_at IS NULL"); open != 600 || total != 1800 {
		t.Fatalf("after the passes: %d open alerts (want 600, the processing keys'), %d resolved (want 1800)", open, total)
	}
	if n := db.Count(t, "alert_state s JOIN idempotency_keys k USING (key) WHERE s.resolved_at IS NULL AND k.status <> 'processing'"); n != 0 {
		t.Fatalf("%d alerts of settled keys still open", n)
	}
	if n := db.Count(t, "alert_outbox WHERE kind = 'resolved'"); n != 1800 {
		t.Fatalf("%d resolved notices; want one per resolved alert (1800)", n)
	}
	if n := db.Count(t, "(SELECT reason, key FROM alert_outbox GROUP BY 1, 2 HAVING count(*) > 1) d"); n != 0 {
		t.Fatalf("%d alerts got more than one resolved notice", n)
	}
	for key, want := range map[string]string{
		"k0000": "completed (by the original attempt or an operator)",
		"k0001": "marked failed_retryable",
		"k0003": "the key is no longer in the ledger",
		"k1999": "the key is no longer in the ledger",
	} {
		if n := db.Count(t, "alert_outbox WHERE key = $1 AND tool = 't' AND kind = 'resolved' AND details = jsonb_build_object('resolution', $2::text)", key, want); n < 1 {
			t.Errorf("%s: no resolved notice saying %q", key, want)
		}
	}
	if n := db.Count(t, "alert_outbox WHERE key = 'k0000'"); n != 2 {
		t.Errorf("k0000 has two alerts: %d notices; want 2", n)
	}
}
