package reconcile_test

// Benchmarks of issue 3, point 6. Reproduce with
//
//	go test -run '^$' -bench . -benchtime 1x -count 2 ./reconcile/
//
// BenchmarkReconcileThroughput: one full pass over stuck keys of one tool
// against a real HTTP downstream that answers after 20 ms, at concurrency 1,
// 8, 32 and 64, reported as keys/s and as a fraction of the ideal
// concurrency / 20 ms (target at 32: at least 0.80). It runs on the test
// harness's cluster (fsync and synchronous_commit off); the same pass with
// durable commits, beside a non-durable cluster in one run, with CPU per
// key, is `lkbench reconcile` (cmd/lkbench/reconcile.go).
//
// BenchmarkLeaseBatch: store.LeaseDue of 100 due keys among 1,000
// processing keys in a ledger of 10,000 rows and of 1,000,000 rows (the rest
// completed), interleaved, with the ratio big/small (target under 2: the
// partial index makes the lease independent of table size).
//
// BenchmarkReconcileDecisionCeiling is a diagnostic: the same passes with a
// probe that answers at once, to show the engine's own cost per key.
//
// Nothing here runs without -bench.

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
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
	"github.com/ledgerkeeper/ledgerkeeper/store"
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
			benchThroughput(b, tc.concurrency, tc.keys, benchLatency)
		})
	}
}

// BenchmarkReconcileDecisionCeiling is a diagnostic for the throughput
// benchmark: the same passes with a probe that answers at once, without
// HTTP, so what is left is the engine's own cost per key (lease, decision
// transaction, audit). decision_ms is the time one worker spends per key;
// at 20 ms per probe, a worker that holds its probe slot during the
// decision reaches at most 20 / (20 + decision_ms) of ideal.
func BenchmarkReconcileDecisionCeiling(b *testing.B) {
	for _, concurrency := range []int{8, 32} {
		b.Run(fmt.Sprintf("concurrency=%d/keys=10000", concurrency), func(b *testing.B) {
			benchThroughput(b, concurrency, 10_000, 0)
		})
	}
}

// benchThroughput measures passes over keys stuck keys at concurrency;
// latency 0 means a probe that answers at once without HTTP.
func benchThroughput(b *testing.B, concurrency, keys int, latency time.Duration) {
	ctx := context.Background()
	db := pgtest.New(b)
	// The daemon's pool: database.max_conns defaults to
	// reconcile.concurrency + 4 (internal/config).
	pool := benchPool(b, db.URL, int32(concurrency+4))

	var ds *latencyDownstream
	timed := &timedProbe{p: probes.ProbeFunc(instantProbe)}
	if latency > 0 {
		ds = newLatencyDownstream(b, latency)
		// One idle connection per probe in flight: the default transport
		// keeps two per host and would close and redial the others.
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
		timed.p = hp
	}

	e := reconcile.New(reconcile.Config{
		Actor:       "bench-replica",
		Concurrency: concurrency,
		BackoffBase: time.Hour,
		Tools: map[string]reconcile.Policy{benchTool: {
			ProcessingWindow: 10 * time.Second, Concurrency: concurrency, Probe: timed, SelfCheckDisabled: true,
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
	timed.reset()
	if ds != nil {
		ds.hits.Store(0)
		ds.maxInFlight.Store(0)
	}

	passes := 0
	for b.Loop() {
		b.StopTimer()
		resetStuckKeys(b, db, keys)
		b.StartTimer()
		pass(keys)
		passes++
	}
	secs := b.Elapsed().Seconds()
	perSec := float64(passes*keys) / secs
	b.ReportMetric(perSec, "keys/s")
	n, busy := timed.stats()
	if ds == nil {
		b.ReportMetric(float64(concurrency)/perSec*1e3, "decision_ms")
		return
	}
	if got := ds.hits.Load(); got != int64(passes*keys) {
		b.Fatalf("downstream saw %d requests, want %d", got, passes*keys)
	}
	b.ReportMetric(perSec/(float64(concurrency)/latency.Seconds()), "ideal_frac")
	// Where the time goes: the mean probe as the engine sees it (ideal:
	// 20 ms), and how many probes were in flight on average (ideal: the
	// concurrency). ideal_frac ≈ (20 ms / probe_ms) × (inflight / concurrency).
	b.ReportMetric(float64(busy)/float64(n)/1e6, "probe_ms")
	b.ReportMetric(busy.Seconds()/secs, "inflight")
	b.ReportMetric(float64(ds.maxInFlight.Load()), "server_max_inflight")
}

// instantProbe answers like the latency downstream, at once.
func instantProbe(_ context.Context, k probes.Key) probes.Result {
	if strings.ContainsRune("02468", rune(k.Key[len(k.Key)-1])) {
		return probes.Result{Verdict: probes.Found, Outcome: &probes.Outcome{Code: 201, Body: []byte(`{"ticket_id":"T-` + k.Key + `"}`)}}
	}
	return probes.Result{Verdict: probes.NotFound}
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

// BenchmarkLeaseBatch leases 100 due keys alternately from a 10,000-row and
// a 1,000,000-row ledger, each with 1,000 processing keys, so that both
// sizes see the same machine at the same moment (the machine is shared:
// two sub-benchmarks run one after the other drift apart). ns/op is one
// lease from each; the metrics split it.
func BenchmarkLeaseBatch(b *testing.B) {
	const processing = 1_000
	ctx := context.Background()
	type ledgerDB struct {
		rows int
		db   *pgtest.DB
		took []time.Duration
	}
	ledgers := []*ledgerDB{{rows: 10_000}, {rows: 1_000_000}}
	lp := store.LeaseParams{
		Tool: benchTool, Window: 20 * time.Second, HeartbeatTimeout: 10 * time.Second,
		Owner: "bench-replica/lease", Lease: time.Minute, Limit: 100,
	}
	lease := func(on ledger.DBTX) {
		got, err := store.LeaseDue(ctx, on, lp)
		if err != nil {
			b.Fatal(err)
		}
		if len(got) != lp.Limit {
			b.Fatalf("leased %d keys, want %d", len(got), lp.Limit)
		}
	}
	release := func(db *pgtest.DB) {
		db.Exec(b, `UPDATE reconcile_state SET lease_owner = NULL, lease_expires_at = NULL WHERE lease_owner IS NOT NULL`)
	}
	for _, l := range ledgers {
		l.db = pgtest.New(b)
		fillLedger(b, l.db, l.rows, processing)
		explainLease(b, l.db, l.rows, func(conn *pgx.Conn) { lease(conn) })
		release(l.db)
	}

	i := 0
	for b.Loop() {
		for j := range ledgers {
			l := ledgers[(i+j)%len(ledgers)] // alternate which goes first
			start := time.Now()
			lease(l.db.Pool)
			l.took = append(l.took, time.Since(start))
		}
		i++
		b.StopTimer()
		for _, l := range ledgers {
			release(l.db)
		}
		b.StartTimer()
	}
	small, big := ledgers[0].took, ledgers[1].took
	b.ReportMetric(meanNs(small), "ns/lease_10k_rows")
	b.ReportMetric(meanNs(big), "ns/lease_1M_rows")
	b.ReportMetric(meanNs(big)/meanNs(small), "ratio_mean")
	b.ReportMetric(medianNs(big)/medianNs(small), "ratio_p50")
}

func meanNs(d []time.Duration) float64 {
	var sum time.Duration
	for _, x := range d {
		sum += x
	}
	return float64(sum) / float64(len(d))
}

func medianNs(d []time.Duration) float64 {
	s := slices.Clone(d)
	slices.Sort(s)
	return float64(s[len(s)/2])
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
		// LeaseDue's first statement leases; a second re-checks holds.
		if strings.Contains(n.Message, "plan:") && strings.Contains(n.Message, "candidates") {
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
		switch {
		case strings.Contains(l, "duration:"):
			key = append(key, strings.TrimSpace(l))
		case strings.Contains(l, " on idempotency_keys k "):
			key = append(key, strings.TrimSpace(l))
			for _, next := range lines[i+1:] {
				if strings.Contains(next, "Buffers:") {
					key = append(key, strings.TrimSpace(next))
					break
				}
			}
		}
	}
	b.Logf("rows=%d: %s", rows, strings.Join(key, "\n\t"))
	if !strings.Contains(plan, "Index Scan using idempotency_keys_processing_idx on idempotency_keys k") {
		b.Fatalf("rows=%d: the lease does not scan the partial index:\n%s", rows, plan)
	}
}
