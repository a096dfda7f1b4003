package reconcile_test

// Benchmarks of issue 3, point 6. Reproduce with
//
//	go test -run '^$' -bench . -benchtime 1x -count 2 ./reconcile/
//
// BenchmarkReconcileThroughput: one full pass over stuck keys of one tool
// against a real HTTP downstream that answers after 20 ms, at concurrency 1,
// 8, 32 and 64, reported as keys/s and as a fraction of the ideal
// concurrency / 20 ms (target at 32: at least 0.80).
//
// BenchmarkLeaseBatch: ledger.LeaseDue of 100 due keys among 1,000
// processing keys in a ledger of 10,000 rows and of 1,000,000 rows (the rest
// completed); the second reports its cost relative to the first (target
// under 2: the partial index makes the lease independent of table size).
//
// Nothing here runs without -bench.

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/probes"
	"github.com/ledgerkeeper/ledgerkeeper/reconcile"
)

// benchLatency is the downstream's answer time the throughput target is
// stated against.
const benchLatency = 20 * time.Millisecond

// benchTool is the one tool of the benchmark ledgers.
const benchTool = "create_ticket"

func BenchmarkReconcileThroughput(b *testing.B) {
	// Concurrency 1 and 8 pass over fewer keys: 10,000 keys one at a time
	// at 20 ms would be 200 s. The fractions of ideal are comparable.
	cases := []struct{ concurrency, keys int }{
		{1, 500},
		{8, 2_000},
		{32, 10_000},
		{64, 10_000},
	}
	for _, tc := range cases {
		b.Run(fmt.Sprintf("concurrency=%d/keys=%d", tc.concurrency, tc.keys), func(b *testing.B) {
			benchThroughput(b, tc.concurrency, tc.keys)
		})
	}
}

func benchThroughput(b *testing.B, concurrency, keys int) {
	ctx := context.Background()
	db := pgtest.New(b)
	// The daemon's pool: database.max_conns defaults to
	// reconcile.concurrency + 4 (internal/config).
	pool := benchPool(b, db.URL, int32(concurrency+4))
	ds := newLatencyDownstream(b, benchLatency)

	// One idle connection per probe in flight: the default transport keeps
	// two per host and would close and redial the others on every probe.
	tr := &http.Transport{MaxIdleConns: 2 * concurrency, MaxIdleConnsPerHost: 2 * concurrency, IdleConnTimeout: time.Minute}
	b.Cleanup(tr.CloseIdleConnections)
	hp, err := probes.NewHTTP(probes.HTTPConfig{
		URL:          ds.srv.URL + "/v1/tickets?idempotency_key={key}",
		Match:        "data",
		ResponseCode: 201,
		ResponseBody: map[string]string{"ticket_id": "id"},
		Timeout:      5 * time.Second,
		Client:       &http.Client{Transport: tr},
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = hp.Close() })
	timed := &timedProbe{p: hp}

	e := reconcile.New(reconcile.Config{
		Actor:       "bench-replica",
		Concurrency: concurrency,
		BackoffBase: time.Hour,
		Tools: map[string]reconcile.Policy{benchTool: {
			ProcessingWindow: 10 * time.Second, Concurrency: concurrency, Probe: timed,
		}},
	}, pool, nil, nil)

	pass := func(n int) {
		rep, err := e.Run(ctx, reconcile.Options{})
		if err != nil {
			b.Fatalf("pass: %v", err)
		}
		done, retry := rep.Actions[reconcile.ActionCompleted], rep.Actions[reconcile.ActionMarkedRetryable]
		if len(rep.Keys) != n || done != n/2 || retry != n-n/2 {
			b.Fatalf("pass over %d keys: %d decisions, %d completed, %d marked retryable (actions %v)",
				n, len(rep.Keys), done, retry, rep.Actions)
		}
	}
	// Warm-up, untimed: opens the pool's and the transport's connections.
	resetStuckKeys(b, db, 4*concurrency)
	pass(4 * concurrency)
	ds.maxInFlight.Store(0)
	timed.reset()

	passes := 0
	for b.Loop() {
		b.StopTimer()
		resetStuckKeys(b, db, keys)
		b.StartTimer()
		pass(keys)
		passes++
	}
	if ds.hits.Load() != int64(4*concurrency+passes*keys) {
		b.Fatalf("downstream saw %d requests, want %d", ds.hits.Load(), 4*concurrency+passes*keys)
	}
	secs := b.Elapsed().Seconds()
	perSec := float64(passes*keys) / secs
	b.ReportMetric(perSec, "keys/s")
	b.ReportMetric(perSec/(float64(concurrency)/benchLatency.Seconds()), "ideal_frac")
	// Where the time goes: the mean probe as the engine sees it (ideal:
	// 20 ms), and how many probes were in flight on average (ideal: the
	// concurrency). ideal_frac ≈ (20 ms / probe_ms) × (inflight / concurrency).
	n, busy := timed.stats()
	b.ReportMetric(float64(busy)/float64(n)/1e6, "probe_ms")
	b.ReportMetric(busy.Seconds()/secs, "inflight")
	b.ReportMetric(float64(ds.maxInFlight.Load()), "server_max_inflight")
}

// timedProbe measures the probe as the engine sees it: from the call to the
// verdict, connection reuse and JSON decoding included.
type timedProbe struct {
	p     probes.Probe
	calls atomic.Int64
	busy  atomic.Int64 // nanoseconds
}

func (t *timedProbe) Probe(ctx context.Context, k probes.Key) probes.Result {
	start := time.Now()
	r := t.p.Probe(ctx, k)
	t.busy.Add(int64(time.Since(start)))
	t.calls.Add(1)
	return r
}

func (t *timedProbe) reset() { t.calls.Store(0); t.busy.Store(0) }

func (t *timedProbe) stats() (int64, time.Duration) {
	return t.calls.Load(), time.Duration(t.busy.Load())
}

// latencyDownstream is a real HTTP API that answers every lookup after a
// fixed latency: found for keys ending in an even digit, not found for the
// others.
type latencyDownstream struct {
	srv         *httptest.Server
	hits        atomic.Int64
	inFlight    atomic.Int64
	maxInFlight atomic.Int64
}

func newLatencyDownstream(b *testing.B, latency time.Duration) *latencyDownstream {
	d := &latencyDownstream{}
	d.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d.hits.Add(1)
		n := d.inFlight.Add(1)
		defer d.inFlight.Add(-1)
		for m := d.maxInFlight.Load(); n > m; m = d.maxInFlight.Load() {
			if d.maxInFlight.CompareAndSwap(m, n) {
				break
			}
		}
		key := r.URL.Query().Get("idempotency_key")
		t := time.NewTimer(latency) // the downstream's latency, not synchronisation
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
			return
		}
		w.Header().Set("Content-Type", "application/json")
		if key != "" && strings.ContainsRune("02468", rune(key[len(key)-1])) {
			fmt.Fprintf(w, `{"data":[{"id":"T-%s","created_at":"2026-11-30T04:00:00Z"}]}`, key)
			return
		}
		_, _ = w.Write([]byte(`{"data":[]}`))
	}))
	b.Cleanup(d.srv.Close)
	return d
}

func benchPool(b *testing.B, url string, maxConns int32) *pgxpool.Pool {
	b.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = maxConns
	cfg.ConnConfig.RuntimeParams["application_name"] = "ledgerkeeper-bench"
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(p.Close)
	return p
}

// resetStuckKeys replaces the ledger with n keys of benchTool, all
// processing and claimed an hour ago (one apart in claim order).
func resetStuckKeys(b *testing.B, db *pgtest.DB, n int) {
	b.Helper()
	db.Exec(b, `TRUNCATE idempotency_keys, reconcile_state, reconcile_audit`)
	db.Exec(b, `INSERT INTO idempotency_keys (key, tool, request_hash, request_body, created_at, claimed_at, expires_at)
		SELECT 'bench-' || lpad(i::text, 6, '0'), $2, md5(i::text), '{"title":"x"}',
		       now() - interval '1 hour' + i * interval '1 ms', now() - interval '1 hour' + i * interval '1 ms',
		       now() + interval '1 day'
		FROM generate_series(1, $1::int) AS i`, n, benchTool)
	db.Exec(b, `ANALYZE idempotency_keys, reconcile_state`)
}

func BenchmarkLeaseBatch(b *testing.B) {
	const processing = 1_000
	var smallNs float64 // ns/op of the 10,000-row ledger, run first
	for _, rows := range []int{10_000, 1_000_000} {
		b.Run(fmt.Sprintf("rows=%d", rows), func(b *testing.B) {
			ctx := context.Background()
			db := pgtest.New(b)
			fillLedger(b, db, rows, processing)
			lp := ledger.LeaseParams{
				Tool: benchTool, Window: 20 * time.Second, HeartbeatTimeout: 10 * time.Second,
				Owner: "bench-replica/lease", Lease: time.Minute, Limit: 100,
			}
			release := func() {
				db.Exec(b, `UPDATE reconcile_state SET lease_owner = NULL, lease_expires_at = NULL WHERE lease_owner IS NOT NULL`)
			}
			lease := func(on ledger.DBTX) {
				got, err := ledger.LeaseDue(ctx, on, lp)
				if err != nil {
					b.Fatal(err)
				}
				if len(got) != lp.Limit {
					b.Fatalf("leased %d keys, want %d", len(got), lp.Limit)
				}
			}
			explainLease(b, db, rows, func(conn *pgx.Conn) { lease(conn) })
			release()

			for b.Loop() {
				lease(db.Pool)
				b.StopTimer()
				release()
				b.StartTimer()
			}
			ns := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
			if rows == 10_000 {
				smallNs = ns
			} else if smallNs > 0 {
				b.ReportMetric(ns/smallNs, "x_10k_rows")
			}
		})
	}
}

// fillLedger writes rows keys of benchTool in one statement: every
// (rows/processing)-th is processing and claimed an hour ago or more, the
// rest completed; processing keys are spread through the heap as in a live
// ledger. Then VACUUM ANALYZE, as autovacuum would have.
func fillLedger(b *testing.B, db *pgtest.DB, rows, processing int) {
	b.Helper()
	db.Exec(b, `INSERT INTO idempotency_keys (key, tool, request_hash, request_body, status, response_code, response_body,
		    created_at, claimed_at, updated_at, expires_at)
		SELECT 'k-' || lpad(i::text, 8, '0'), $3, md5(i::text), '{"title":"x"}',
		       CASE WHEN i % ($1::int / $2::int) = 0 THEN 'processing' ELSE 'completed' END,
		       CASE WHEN i % ($1::int / $2::int) = 0 THEN NULL ELSE 201 END,
		       CASE WHEN i % ($1::int / $2::int) = 0 THEN NULL ELSE '{"ticket_id":"T"}'::jsonb END,
		       ts, ts, ts, ts + interval '7 days'
		FROM generate_series(1, $1::int) AS i,
		     LATERAL (SELECT now() - interval '2 hours' + i * (interval '1 hour' / $1::int)) AS t(ts)`,
		rows, processing, benchTool)
	db.Exec(b, `VACUUM ANALYZE idempotency_keys`)
	if n := db.Count(b, "idempotency_keys WHERE status = 'processing'"); n != processing {
		b.Fatalf("%d processing keys, want %d", n, processing)
	}
}

// explainLease runs one lease with auto_explain (ANALYZE, BUFFERS) on a
// connection of its own, logs the plan's scan of idempotency_keys, and fails
// unless it is an index scan of the partial index. The plan comes from the
// statement LeaseDue really sends, with its real parameters.
func explainLease(b *testing.B, db *pgtest.DB, rows int, lease func(*pgx.Conn)) {
	b.Helper()
	ctx := context.Background()
	cfg, err := pgx.ParseConfig(db.URL)
	if err != nil {
		b.Fatal(err)
	}
	var mu sync.Mutex
	var plan string
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		mu.Lock()
		defer mu.Unlock()
		if strings.Contains(n.Message, "plan:") {
			plan = n.Message
		}
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, s := range []string{
		`LOAD 'auto_explain'`,
		`SET auto_explain.log_min_duration = 0`,
		`SET auto_explain.log_analyze = on`,
		`SET auto_explain.log_buffers = on`,
		`SET auto_explain.log_level = notice`,
	} {
		if _, err := conn.Exec(ctx, s); err != nil {
			b.Fatalf("%s: %v", s, err)
		}
	}
	lease(conn)
	mu.Lock()
	defer mu.Unlock()
	if testing.Verbose() {
		b.Logf("rows=%d: lease plan:\n%s", rows, plan)
	}
	lines := strings.Split(plan, "\n")
	var key []string
	for i, l := range lines {
		if strings.Contains(l, "duration:") || strings.Contains(l, " on idempotency_keys k") {
			key = append(key, strings.TrimSpace(l))
			if i+1 < len(lines) && strings.Contains(lines[i+1], "Buffers:") && strings.Contains(l, "idempotency_keys") {
				key = append(key, "  "+strings.TrimSpace(lines[i+1]))
			}
		}
	}
	b.Logf("rows=%d: %s", rows, strings.Join(key, "\n\t"))
	if !strings.Contains(plan, "Index Scan using idempotency_keys_processing_idx on idempotency_keys k") {
		b.Fatalf("rows=%d: the lease does not scan the partial index:\n%s", rows, plan)
	}
}
