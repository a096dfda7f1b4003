package reconcile_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
	"github.com/ledgerkeeper/ledgerkeeper/ledger/ledgertest/testwait"
	"github.com/ledgerkeeper/ledgerkeeper/probes"
	"github.com/ledgerkeeper/ledgerkeeper/reconcile"
)

// politeAPI is a downstream that enforces its own allowance and records
// when each request arrived. The allowance is a sliding window: at most
// allowed() requests in any second (rps + burst, plus jitterSlack); past it
// the API answers 429 without Retry-After, an unknown, which would count an
// attempt and show in the rows. Keys whose number is even have a ticket
// (found), odd ones have none (not_found). throttle, when set, may answer
// a request 429 with a Retry-After of its choosing instead.
type politeAPI struct {
	srv *httptest.Server

	mu       sync.Mutex
	allowed  int // 0: no allowance enforced
	arrivals []time.Time
	sent429  []time.Time // when each 429 with Retry-After was written
	refused  int         // requests over the allowance
	throttle func(n int, key string) string
	first429 chan struct{}
	sent     []time.Time // when the prober's HTTP client began each request
}

// stampTransport records when the prober hands each request to HTTP: the
// prober's own pace, before the loopback and the server's scheduling add
// their jitter.
type stampTransport struct{ a *politeAPI }

func (s stampTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	s.a.mu.Lock()
	s.a.sent = append(s.a.sent, time.Now())
	s.a.mu.Unlock()
	return http.DefaultTransport.RoundTrip(r)
}

// jitterSlack is the share of the server's allowance left to jitter
// between the prober's request and the handler seeing it: the loopback and
// the scheduling of a test server that shares its process and two CPUs with
// the prober, -race and other packages' tests. A request seen late while
// the next is seen on time crowds a window by rps x the delay; at a load
// average of 10 on 2 cores the server saw 122 requests in a second while
// the prober's HTTP client sent 110 (rate + burst, exactly the promise).
// So the server allows a quarter of the rate on top, and the prober's own
// pace is checked strictly where it sends (stampTransport). A prober
// without its limiter exceeds both severalfold.
func jitterSlack(rps float64) int { return int(rps/4) + 1 }

func newPoliteAPI(t *testing.T, rps float64, burst int) *politeAPI {
	a := &politeAPI{first429: make(chan struct{})}
	if rps > 0 {
		a.allowed = int(rps) + burst + jitterSlack(rps)
	}
	from := 0 // first arrival within the last second
	a.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.URL.Query().Get("idempotency_key")
		now := time.Now()
		a.mu.Lock()
		a.arrivals = append(a.arrivals, now)
		for now.Sub(a.arrivals[from]) >= time.Second {
			from++
		}
		var retryAfter string
		if a.throttle != nil {
			retryAfter = a.throttle(len(a.arrivals), key)
		}
		switch {
		case retryAfter != "":
			a.sent429 = append(a.sent429, time.Now())
			if len(a.sent429) == 1 {
				close(a.first429)
			}
			a.mu.Unlock()
			w.Header().Set("Retry-After", retryAfter)
			w.WriteHeader(http.StatusTooManyRequests)
			return
		case a.allowed > 0 && len(a.arrivals)-from > a.allowed:
			a.refused++
			a.mu.Unlock()
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		a.mu.Unlock()
		data := []map[string]any{}
		if n, err := strconv.Atoi(key[strings.LastIndexByte(key, '-')+1:]); err == nil && n%2 == 0 {
			data = append(data, map[string]any{"id": "T-" + key, "created_at": "2026-12-01T00:00:00Z"})
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"data": data})
	}))
	t.Cleanup(a.srv.Close)
	return a
}

func (a *politeAPI) probe(t *testing.T) probes.Probe {
	t.Helper()
	p, err := probes.NewHTTP(probes.HTTPConfig{
		URL: a.srv.URL + "/v1/tickets?idempotency_key={key}", Match: "data", ResponseCode: 201,
		ResponseBody: map[string]string{"ticket_id": "id"}, Timeout: 5 * time.Second,
		Client: &http.Client{Transport: stampTransport{a}},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func (a *politeAPI) snapshot() (arrivals []time.Time, sent429 []time.Time, refused int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.arrivals), slices.Clone(a.sent429), a.refused
}

// worstWindowStart is where the fullest one-second window begins, after
// the first arrival (for diagnostics).
func worstWindowStart(ts []time.Time, w time.Duration) time.Duration {
	ts = slices.Clone(ts)
	slices.SortFunc(ts, func(a, b time.Time) int { return a.Compare(b) })
	best, at, j := 0, time.Duration(0), 0
	for i := range ts {
		for j < len(ts) && ts[j].Sub(ts[i]) < w {
			j++
		}
		if j-i > best {
			best, at = j-i, ts[i].Sub(ts[0])
		}
	}
	return at
}

// maxInWindow is the most arrivals in any window [t, t+w) that starts at an
// arrival: the exact test of a token bucket's promise (at most burst +
// rps*w in any window of length w).
func maxInWindow(ts []time.Time, w time.Duration) int {
	ts = slices.Clone(ts)
	slices.SortFunc(ts, func(a, b time.Time) int { return a.Compare(b) })
	best, j := 0, 0
	for i := range ts {
		for j < len(ts) && ts[j].Sub(ts[i]) < w {
			j++
		}
		best = max(best, j-i)
	}
	return best
}

// stuckMany inserts n processing keys of tool, claimed an hour ago, in one
// statement: tool-000001 … tool-00000n.
func stuckMany(t *testing.T, db *pgtest.DB, tool string, n int) {
	t.Helper()
	db.Exec(t, `INSERT INTO idempotency_keys (key, tool, request_hash, request_body, created_at, claimed_at, expires_at)
		SELECT $2 || '-' || lpad(i::text, 6, '0'), $2, md5(i::text), '{"title":"x"}',
		       now() - interval '1 hour', now() - interval '1 hour', now() + interval '1 day'
		FROM generate_series(1, $1::int) AS i`, n, tool)
	db.Exec(t, `ANALYZE idempotency_keys`)
}

// politeEngine builds an engine with metrics on a fresh registry.
func politeEngine(t *testing.T, db *pgtest.DB, cfg reconcile.Config) (*reconcile.Engine, *prometheus.Registry) {
	t.Helper()
	return politeEngineOn(t, db.Pool, cfg)
}

func politeEngineOn(t *testing.T, pool *pgxpool.Pool, cfg reconcile.Config) (*reconcile.Engine, *prometheus.Registry) {
	t.Helper()
	cfg.Actor = "test-replica"
	cfg.BackoffBase = time.Hour
	reg := prometheus.NewRegistry()
	return reconcile.New(cfg, pool, nil, reconcile.NewMetrics(reg)), reg
}

// countingTracer counts the statements sent on a pool.
type countingTracer struct{ n *atomic.Int64 }

func (c countingTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}

func (countingTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TestRateLimitIsNeverExceeded: 300 due keys against a downstream that
// allows 100 requests/s, probed with rate_limit 100/s (burst 10): no
// window of a second ever holds more than the rate plus the burst, the
// downstream never refuses a request, every key is probed once and resolved
// as the downstream says (even: completed, odd: failed_retryable), and the
// time spent waiting on the limit is counted. LEDGERKEEPER_RATE_LIMIT_FULL=1
// runs the issue's own figures: 10,000 keys at 100/s (about 100 s).
func TestRateLimitIsNeverExceeded(t *testing.T) {
	// Scaled to about 3 s: a rate the engine on a loaded CI machine
	// exceeds severalfold without the limiter (~200-300 keys/s here), so
	// the test can fail.
	keys, rps, burst := 300, 100.0, 10
	if os.Getenv("LEDGERKEEPER_RATE_LIMIT_FULL") != "" {
		keys, rps = 10000, 100
	}
	db := pgtest.New(t)
	api := newPoliteAPI(t, rps, burst)
	stuckMany(t, db, "tickets", keys)
	e, reg := politeEngine(t, db, reconcile.Config{Concurrency: 32, Tools: map[string]reconcile.Policy{
		"tickets": {Probe: api.probe(t), SelfCheckDisabled: true, RateLimit: reconcile.RateLimit{RPS: rps, Burst: burst}},
	}})
	start := time.Now()
	rep, err := e.Run(bg, reconcile.Options{})
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	arrivals, _, refused := api.snapshot()
	worst := maxInWindow(arrivals, time.Second)
	api.mu.Lock()
	sent := slices.Clone(api.sent)
	api.mu.Unlock()
	worstSent := maxInWindow(sent, time.Second)
	t.Logf("fullest window at the server starts %s after the first request; at the prober's HTTP client: %d in a second",
		worstWindowStart(arrivals, time.Second), worstSent)
	// The prober's own pace: the token bucket's promise, to one request
	// (the turn handed over between two waiters).
	if worstSent > int(rps)+burst+1 {
		t.Errorf("the prober sent %d requests within one second: the limit of %.0f/s (burst %d) was exceeded", worstSent, rps, burst)
	}
	t.Logf("%d keys at rate_limit %.0f/s burst %d: pass %s, %d requests, at most %d in any 1 s window (rate + burst %d, + jitter slack %d), %d refused",
		keys, rps, burst, took.Round(time.Millisecond), len(arrivals), worst, int(rps)+burst, jitterSlack(rps), refused)
	if worst > int(rps)+burst+jitterSlack(rps) {
		t.Errorf("%d requests within one second: the limit of %.0f/s (burst %d) was exceeded", worst, rps, burst)
	}
	if refused != 0 {
		t.Errorf("the downstream refused %d requests over its allowance", refused)
	}
	if len(arrivals) != keys {
		t.Errorf("%d requests for %d keys: want each key probed once", len(arrivals), keys)
	}
	// The limit, not the engine, set the pace: (keys - burst) / rps at least.
	if least := time.Duration(float64(keys-burst) / rps * float64(time.Second)); took < least {
		t.Errorf("pass took %s, less than the %s the limit allows", took, least)
	}
	if n := db.Count(t, "idempotency_keys WHERE status = 'completed' AND right(key, 1) IN ('0','2','4','6','8')"); n != keys/2 {
		t.Errorf("%d even keys completed, want %d (report %+v)", n, keys/2, rep.Actions)
	}
	if n := db.Count(t, "idempotency_keys WHERE status = 'failed_retryable' AND right(key, 1) IN ('1','3','5','7','9')"); n != keys/2 {
		t.Errorf("%d odd keys failed_retryable, want %d (report %+v)", n, keys/2, rep.Actions)
	}
	if n := db.Count(t, "reconcile_audit WHERE verdict = 'unknown'"); n != 0 {
		t.Errorf("%d unknown verdicts recorded", n)
	}
	wait := series(t, reg, "ledgerkeeper_reconcile_probe_rate_limit_wait_seconds_total", "tickets")
	if wait <= 0 {
		t.Errorf("rate_limit_wait_seconds_total = %v, want the time probes waited", wait)
	}
}

// series is the value of the series name{tool=tool} in reg (counter or
// gauge).
func series(t *testing.T, reg *prometheus.Registry, name, tool string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "tool" && l.GetValue() == tool {
					return m.GetCounter().GetValue() + m.GetGauge().GetValue()
				}
			}
		}
	}
	t.Fatalf("no series %s{tool=%q}", name, tool)
	return 0
}

// TestRetryAfterPausesTheToolNotTheKeys: the downstream of "tickets"
// answers its first two requests 429 with Retry-After: 2. No attempt is
// counted against any key (no audit row, attempts unchanged, no back-off,
// the breaker counts nothing), the keys leased are given back at once, the
// downstream sees no request of the tool during either pause (by its own
// clock), "other" goes on being probed meanwhile, and every key resolves
// in the same pass once the pauses are over.
func TestRetryAfterPausesTheToolNotTheKeys(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	tickets := newPoliteAPI(t, 0, 0)
	tickets.throttle = func(n int, _ string) string {
		if n <= 2 {
			return "2"
		}
		return ""
	}
	other := newPoliteAPI(t, 20, 1)
	stuckMany(t, db, "tickets", 6)
	stuckMany(t, db, "other", 40)
	// Every statement the engine sends is counted: a pass that spun on the
	// paused tool (lease, give back, lease...) would send thousands.
	var statements atomic.Int64
	pcfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	pcfg.ConnConfig.Tracer = countingTracer{&statements}
	pool, err := pgxpool.NewWithConfig(bg, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	e, reg := politeEngineOn(t, pool, reconcile.Config{Tools: map[string]reconcile.Policy{
		// Concurrency 1: one request in flight, so every request after a
		// 429 was sent after its answer came back.
		"tickets": {Probe: tickets.probe(t), SelfCheckDisabled: true, Concurrency: 1},
		"other":   {Probe: other.probe(t), SelfCheckDisabled: true, RateLimit: reconcile.RateLimit{RPS: 20, Burst: 1}},
	}})
	done := make(chan reconcile.Report, 1)
	go func() {
		rep, err := e.Run(bg, reconcile.Options{})
		if err != nil {
			t.Errorf("pass: %v", err)
		}
		done <- rep
	}()
	testwait.Recv(t, tickets.first429, 10*time.Second)
	// During the pause: the tool's leased keys are given back, nothing is
	// on the record, no attempt counted.
	testwait.Eventually(t, func() bool {
		return db.Count(t, `reconcile_state s JOIN idempotency_keys k USING (key)
			WHERE k.tool = 'tickets' AND (s.lease_owner IS NOT NULL OR s.attempts > 0)`) == 0
	}, 1900*time.Millisecond, "the paused tool's keys given back, attempts unchanged")
	if n := db.Count(t, "reconcile_audit WHERE tool = 'tickets'"); n != 0 {
		t.Fatalf("%d audit rows for the paused tool during its pause", n)
	}
	rep := testwait.Recv(t, done, 60*time.Second)

	arrivals, sent429, _ := tickets.snapshot()
	if len(sent429) != 2 || len(arrivals) != 8 {
		t.Fatalf("tickets: %d requests, %d answered 429; want 8 (6 keys + 2 throttled) and 2", len(arrivals), len(sent429))
	}
	// Arrival i+1 follows the 429 written for arrival i (i = 0, 1) by the
	// whole Retry-After: the pause starts when the answer is read, which
	// is after the server wrote it.
	for i, at := range sent429 {
		if gap := arrivals[i+1].Sub(at); gap < 2*time.Second {
			t.Errorf("request %d came %s after the 429 with Retry-After: 2", i+2, gap)
		}
	}
	otherArrivals, _, refused := other.snapshot()
	during := 0
	for _, at := range otherArrivals {
		if at.After(sent429[0]) && at.Before(sent429[0].Add(2*time.Second)) {
			during++
		}
	}
	if during < 10 || refused != 0 {
		t.Errorf("other tool: %d requests during the first pause (want ≥ 10: not paused), %d refused", during, refused)
	}
	if n := db.Count(t, "idempotency_keys WHERE status = 'processing'"); n != 0 {
		t.Fatalf("%d keys still processing after the pass (report %+v)", n, rep.Tools)
	}
	t.Logf("the pass sent %d statements", statements.Load())
	if n := statements.Load(); n > 600 {
		t.Errorf("the pass sent %d statements for 46 keys: it spun while the tool was paused", n)
	}
	// One decision per key, its first attempt; nothing for the 429s.
	if n := db.Count(t, "reconcile_audit WHERE tool = 'tickets' AND attempt = 1 AND verdict IN ('found', 'not_found')"); n != 6 {
		t.Errorf("%d audit rows of tickets' first attempts, want 6", n)
	}
	if n := db.Count(t, "reconcile_audit WHERE tool = 'tickets'"); n != 6 {
		t.Errorf("%d audit rows for tickets, want 6: a 429 is on no key's record", n)
	}
	if n := db.Count(t, "tool_breakers WHERE tool = 'tickets' AND (consecutive_failures > 0 OR opens > 0)"); n != 0 {
		t.Error("a polite 429 counted towards the circuit breaker")
	}
	if v := series(t, reg, "ledgerkeeper_reconcile_probe_pauses_total", "tickets"); v != 2 {
		t.Errorf("pauses_total{tickets} = %v, want 2", v)
	}
	if v := series(t, reg, "ledgerkeeper_reconcile_probe_pauses_total", "other"); v != 0 {
		t.Errorf("pauses_total{other} = %v, want 0", v)
	}
}

// TestLongPauseEndsTheToolsShareAndOutlivesThePass: Retry-After: 120 is
// longer than a pass waits: the tool's share ends at once with a note, the
// keys stay due and untouched, and the next pass of the same engine (the
// pause is the process's, not the pass's) sends nothing to the downstream
// until the pause is over.
func TestLongPauseEndsTheToolsShareAndOutlivesThePass(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	api := newPoliteAPI(t, 0, 0)
	api.throttle = func(int, string) string { return "120" }
	stuckMany(t, db, "tickets", 50)
	e, reg := politeEngine(t, db, reconcile.Config{MaxDuration: 20 * time.Second, Tools: map[string]reconcile.Policy{
		"tickets": {Probe: api.probe(t), SelfCheckDisabled: true, Concurrency: 4},
	}})
	for pass := 1; pass <= 2; pass++ {
		start := time.Now()
		rep := run(t, e, reconcile.Options{})
		if took := time.Since(start); took > 10*time.Second {
			t.Fatalf("pass %d took %s: it waited for a 2-minute pause", pass, took)
		}
		tr := toolReport(t, rep, "tickets")
		if !strings.Contains(tr.Note, "Retry-After") || rep.Decided != 0 {
			t.Fatalf("pass %d: note %q, %d decided; want the pause said and nothing decided", pass, tr.Note, rep.Decided)
		}
	}
	arrivals, sent429, _ := api.snapshot()
	// Up to Concurrency requests were in flight when the first 429 came
	// back; none after, in either pass.
	if len(arrivals) == 0 || len(arrivals) > 4 || len(sent429) != len(arrivals) {
		t.Fatalf("%d requests (%d throttled) over two passes; want 1-4, all before the pause began", len(arrivals), len(sent429))
	}
	if n := db.Count(t, `reconcile_state s JOIN idempotency_keys k USING (key)
		WHERE k.status = 'processing' AND s.lease_owner IS NULL AND s.attempts = 0 AND s.next_probe_at IS NULL`); n != 50 {
		// next_probe_at NULL: no back-off pushed onto the key.
		t.Errorf("%d keys due, unleased, unattempted; want all 50", n)
	}
	if n := db.Count(t, "reconcile_audit"); n != 0 {
		t.Errorf("%d audit rows: a pause is no decision", n)
	}
	until := series(t, reg, "ledgerkeeper_reconcile_probe_paused_until_timestamp_seconds", "tickets")
	if want := float64(time.Now().Add(100 * time.Second).Unix()); until < want {
		t.Errorf("paused_until = %v, want about two minutes from now (≥ %v)", until, want)
	}
}

// TestRateLimitSharedAcrossPasses: two passes of one engine, one key each,
// back to back: the second waits for the limiter the first drained (5/s,
// burst 1), so the downstream sees them at least 1/5 s apart.
func TestRateLimitSharedAcrossPasses(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	api := newPoliteAPI(t, 0, 0)
	stuckMany(t, db, "tickets", 2)
	e, _ := politeEngine(t, db, reconcile.Config{Tools: map[string]reconcile.Policy{
		"tickets": {Probe: api.probe(t), SelfCheckDisabled: true, RateLimit: reconcile.RateLimit{RPS: 5, Burst: 1}},
	}})
	run(t, e, reconcile.Options{Limit: 1})
	run(t, e, reconcile.Options{Limit: 1})
	arrivals, _, _ := api.snapshot()
	if len(arrivals) != 2 {
		t.Fatalf("%d requests, want 2", len(arrivals))
	}
	if gap := arrivals[1].Sub(arrivals[0]); gap < 150*time.Millisecond {
		t.Fatalf("second pass probed %s after the first: the limiter is not shared across passes", gap)
	}
}

// TestSelfCheckIsRateLimitedAndAPauseCountsNothing: the self-check's probes
// go through the tool's limiter and honour its pause. Its made-up key is
// answered 429 with Retry-After: 1 once: that check is stored nowhere,
// counts nothing for the breaker and changes no key; the next pass waits
// the pause out, checks again (trusted) and resolves the keys, every
// request at least the limit's interval (1/4 s) after the one before.
func TestSelfCheckIsRateLimitedAndAPauseCountsNothing(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	api := newPoliteAPI(t, 0, 0)
	api.throttle = func(n int, key string) string {
		if n == 1 && strings.HasPrefix(key, reconcile.SelfCheckKeyPrefix) {
			return "1"
		}
		return ""
	}
	stuckMany(t, db, "tickets", 3)
	e, _ := politeEngine(t, db, reconcile.Config{Tools: map[string]reconcile.Policy{
		// No key of the tool was completed by its tool server: no witness;
		// this test is about the pace, not the witness rule.
		"tickets": {Probe: api.probe(t), RateLimit: reconcile.RateLimit{RPS: 4, Burst: 1}, WitnessNotRequired: true},
	}})
	rep := run(t, e, reconcile.Options{})
	if rep.Decided != 0 {
		t.Fatalf("pass 1 decided %d keys while the self-check was paused", rep.Decided)
	}
	if n := db.Count(t, "probe_self_checks"); n != 0 {
		t.Fatalf("a paused self-check was stored (%d rows)", n)
	}
	if n := db.Count(t, "tool_breakers WHERE consecutive_failures > 0 OR opens > 0"); n != 0 {
		t.Fatal("a paused self-check counted towards the breaker")
	}
	run(t, e, reconcile.Options{})
	if n := db.Count(t, "idempotency_keys WHERE status = 'processing'"); n != 0 {
		t.Fatalf("%d keys still processing after the pause", n)
	}
	if n := db.Count(t, "probe_self_checks WHERE outcome = 'trusted'"); n != 1 {
		t.Fatalf("%d trusted self-check rows stored, want 1", n)
	}
	arrivals, sent429, _ := api.snapshot()
	if len(arrivals) != 6 || len(sent429) != 1 {
		t.Fatalf("%d requests (%d throttled); want 3 self-checks of the made-up key (the throttled one, the opener, the closer) + 3 keys, 1 throttled", len(arrivals), len(sent429))
	}
	if gap := arrivals[1].Sub(sent429[0]); gap < time.Second {
		t.Errorf("the second self-check came %s after Retry-After: 1", gap)
	}
	for i := 2; i < len(arrivals); i++ {
		if gap := arrivals[i].Sub(arrivals[i-1]); gap < 200*time.Millisecond {
			t.Errorf("request %d came %s after the one before: faster than 4/s", i+1, gap)
		}
	}
}

// halfOpen leaves tool's breaker half-open: it opened once, its cooldown
// is over, the next probe is its trial.
func halfOpen(t *testing.T, db *pgtest.DB, tool string) {
	t.Helper()
	db.Exec(t, `INSERT INTO tool_breakers (tool, consecutive_failures, opens, open_until)
		VALUES ($1, 5, 1, now() - interval '1 second')`, tool)
}

// TestHalfOpenTrialIsRateLimited: the half-open breaker's trial is a probe
// like any other: it takes its token, and the keys after it wait for theirs
// (4/s, burst 1).
func TestHalfOpenTrialIsRateLimited(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	api := newPoliteAPI(t, 0, 0)
	stuckMany(t, db, "tickets", 3)
	halfOpen(t, db, "tickets")
	e, _ := politeEngine(t, db, reconcile.Config{Tools: map[string]reconcile.Policy{
		"tickets": {Probe: api.probe(t), SelfCheckDisabled: true, RateLimit: reconcile.RateLimit{RPS: 4, Burst: 1}},
	}})
	run(t, e, reconcile.Options{})
	if n := db.Count(t, "idempotency_keys WHERE status = 'processing'"); n != 0 {
		t.Fatalf("%d keys still processing: the trial did not close the breaker", n)
	}
	arrivals, _, _ := api.snapshot()
	if len(arrivals) != 3 {
		t.Fatalf("%d requests, want 3 (the trial and two keys)", len(arrivals))
	}
	for i := 1; i < len(arrivals); i++ {
		if gap := arrivals[i].Sub(arrivals[i-1]); gap < 200*time.Millisecond {
			t.Errorf("request %d came %s after the one before: faster than 4/s", i+1, gap)
		}
	}
}

// TestThrottledTrialLeavesTheBreakerAlone: a trial answered 429 with
// Retry-After neither re-opens the breaker (no doubled cooldown, no
// failure counted) nor closes it; the pass stops probing the tool (the
// breaker is still half-open: no full batch goes out untried) and every
// key stays as it was.
func TestThrottledTrialLeavesTheBreakerAlone(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	api := newPoliteAPI(t, 0, 0)
	api.throttle = func(int, string) string { return "1" }
	stuckMany(t, db, "tickets", 5)
	halfOpen(t, db, "tickets")
	e, _ := politeEngine(t, db, reconcile.Config{MaxDuration: 20 * time.Second, Tools: map[string]reconcile.Policy{
		"tickets": {Probe: api.probe(t), SelfCheckDisabled: true},
	}})
	rep := run(t, e, reconcile.Options{})
	if tr := toolReport(t, rep, "tickets"); !strings.Contains(tr.Note, "Retry-After") {
		t.Errorf("note %q, want the pause said", tr.Note)
	}
	arrivals, _, _ := api.snapshot()
	if len(arrivals) != 1 {
		t.Fatalf("%d requests, want the one trial", len(arrivals))
	}
	b := readBreaker(t, db, "tickets")
	if b.opens != 1 || b.consecutive != 5 {
		t.Errorf("breaker opens=%d consecutive=%d after a throttled trial, want 1 and 5 as before", b.opens, b.consecutive)
	}
	if n := db.Count(t, "reconcile_audit"); n != 0 {
		t.Errorf("%d audit rows", n)
	}
	if n := db.Count(t, "reconcile_state WHERE attempts > 0 OR lease_owner IS NOT NULL"); n != 0 {
		t.Errorf("%d keys attempted or still leased", n)
	}
}
