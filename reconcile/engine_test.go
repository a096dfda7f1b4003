package reconcile_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/ledger/ledgertest/testwait"
	"github.com/ledgerkeeper/ledgerkeeper/probes"
	"github.com/ledgerkeeper/ledgerkeeper/reconcile"
	"github.com/ledgerkeeper/ledgerkeeper/store"
)

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		os.Exit(helperProcess())
	}
	pgtest.Main(m)
}

var bg = context.Background()

// downstream is a real HTTP API that knows which tickets exist.
type downstream struct {
	srv *httptest.Server

	mu      sync.Mutex
	tickets map[string][]map[string]any // idempotency key -> tickets
	hits    map[string]int              // idempotency key -> requests
	status  int                         // non-zero: answer with this status
	delay   time.Duration
	gate    chan struct{} // non-nil: requests wait for it
	entered chan string   // non-nil: a request announces its key
}

func newDownstream(t *testing.T) *downstream {
	d := &downstream{tickets: map[string][]map[string]any{}, hits: map[string]int{}}
	d.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.URL.Query().Get("idempotency_key")
		d.mu.Lock()
		d.hits[key]++
		status, delay, gate, entered := d.status, d.delay, d.gate, d.entered
		found := d.tickets[key]
		d.mu.Unlock()
		if entered != nil {
			// Never blocks the server's Close: a request nobody waits for
			// ends with its client.
			select {
			case entered <- key:
			case <-r.Context().Done():
				return
			}
		}
		if gate != nil {
			select {
			case <-gate:
			case <-r.Context().Done():
				return
			}
		}
		if delay > 0 {
			time.Sleep(delay) // the downstream's latency, not synchronisation
		}
		if status != 0 {
			w.WriteHeader(status)
			return
		}
		if found == nil {
			found = []map[string]any{}
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"data": found})
	}))
	t.Cleanup(d.srv.Close)
	return d
}

func (d *downstream) addTicket(key, id string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.tickets[key] = append(d.tickets[key], map[string]any{"id": id, "created_at": "2026-11-30T04:00:00Z"})
}

func (d *downstream) hitsOf(key string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.hits[key]
}

func (d *downstream) totalHits() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := 0
	for _, h := range d.hits {
		n += h
	}
	return n
}

func (d *downstream) probe(t *testing.T) probes.Probe {
	t.Helper()
	p, err := probes.NewHTTP(probes.HTTPConfig{
		URL:          d.srv.URL + "/v1/tickets?idempotency_key={key}",
		Match:        "data",
		ResponseCode: 201,
		ResponseBody: map[string]string{"ticket_id": "id", "created_at": "created_at"},
		Timeout:      5 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// stuck inserts processing keys of a tool claimed `ago` in the past.
func stuck(t *testing.T, db *pgtest.DB, tool string, ago time.Duration, keys ...string) {
	t.Helper()
	for _, k := range keys {
		db.Exec(t, `INSERT INTO idempotency_keys (key, tool, request_hash, request_body, created_at, claimed_at, expires_at)
			VALUES ($1, $2, 'h', '{"title":"x"}', now() - $3::interval, now() - $3::interval, now() + interval '1 day')`, k, tool, ago)
	}
}

func engine(t *testing.T, pool *pgxpool.Pool, cfg reconcile.Config) *reconcile.Engine {
	t.Helper()
	if cfg.Actor == "" {
		cfg.Actor = "test-replica"
	}
	if cfg.BackoffBase == 0 {
		cfg.BackoffBase = time.Hour // a key probed once is not due again in this test
	}
	// These tests pin what a trusted probe's verdicts do; the self-check
	// that establishes trust has tests of its own (selfcheck_test.go).
	tools := make(map[string]reconcile.Policy, len(cfg.Tools))
	for name, p := range cfg.Tools {
		p.SelfCheckDisabled = true
		tools[name] = p
	}
	cfg.Tools = tools
	return reconcile.New(cfg, pool, nil, nil)
}

func run(t *testing.T, e *reconcile.Engine, opts reconcile.Options) reconcile.Report {
	t.Helper()
	r, err := e.Run(bg, opts)
	if err != nil {
		t.Fatalf("pass: %v", err)
	}
	return r
}

func row(t *testing.T, db *pgtest.DB, key string) ledger.Key {
	t.Helper()
	k, err := ledger.Get(bg, db.Pool, key)
	if err != nil {
		t.Fatalf("get %s: %v", key, err)
	}
	return k
}

func outboxCount(t *testing.T, db *pgtest.DB, reason string) int {
	return db.Count(t, "alert_outbox WHERE reason = $1 AND kind = 'firing'", reason)
}

func TestVerdictPaths(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ds := newDownstream(t)
	stuck(t, db, "create_ticket", time.Minute, "found", "absent", "twice")
	stuck(t, db, "mystery_tool", time.Minute, "noprobe")
	ds.addTicket("found", "T-1")
	ds.addTicket("twice", "T-2")
	ds.addTicket("twice", "T-3")
	e := engine(t, db.Pool, reconcile.Config{
		Tools:              map[string]reconcile.Policy{"create_ticket": {ProcessingWindow: 10 * time.Second, Probe: ds.probe(t)}},
		AlertAfterAttempts: 1,
	})
	rep := run(t, e, reconcile.Options{})
	if len(rep.Keys) != 4 {
		t.Fatalf("report keys = %+v", rep.Keys)
	}

	k := row(t, db, "found")
	if k.Status != ledger.StatusCompleted || *k.ResponseCode != 201 {
		t.Fatalf("found: %+v", k)
	}
	var body map[string]any
	_ = json.Unmarshal(k.ResponseBody, &body)
	if body["ticket_id"] != "T-1" || body["created_at"] == nil || len(body) != 2 {
		t.Fatalf("found outcome = %s", k.ResponseBody)
	}
	if k := row(t, db, "absent"); k.Status != ledger.StatusFailedRetryable || k.ResponseCode != nil {
		t.Fatalf("absent: %+v", k)
	}
	if k := row(t, db, "twice"); k.Status != ledger.StatusProcessing {
		t.Fatalf("duplicate must stay processing: %+v", k)
	}
	if k := row(t, db, "noprobe"); k.Status != ledger.StatusProcessing {
		t.Fatalf("no probe must stay processing: %+v", k)
	}
	if n := outboxCount(t, db, "duplicate_effect"); n != 1 {
		t.Fatalf("duplicate alerts = %d", n)
	}
	if n := outboxCount(t, db, "no_probe"); n != 1 {
		t.Fatalf("no_probe alerts = %d", n)
	}
	// Every decision is on the record.
	for key, action := range map[string]string{"found": "completed", "absent": "marked_retryable", "twice": "duplicate_alerted", "noprobe": "no_probe"} {
		hist, err := store.History(bg, db.Pool, key, 10)
		if err != nil || len(hist) != 1 || hist[0].Action != action || hist[0].Actor != "test-replica" || hist[0].Attempt != 1 {
			t.Fatalf("history of %s = %+v, %v", key, hist, err)
		}
	}
	// A retry of the failed_retryable key may now redo the work.
	res, err := ledger.Claim(bg, db.Pool, ledger.ClaimParams{Key: "absent", Tool: "create_ticket", RequestHash: "h"})
	if err != nil || res.Outcome != ledger.New {
		t.Fatalf("retry after failed_retryable: %v %v", res.Outcome, err)
	}
	// And a replay of the found one gets the probe's outcome.
	res, err = ledger.Claim(bg, db.Pool, ledger.ClaimParams{Key: "found", Tool: "create_ticket", RequestHash: "h"})
	if err != nil || res.Outcome != ledger.Replay {
		t.Fatalf("replay after found: %v %v", res.Outcome, err)
	}
}

func TestUnknownBacksOffAndAlertsAfterAttempts(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ds := newDownstream(t)
	ds.status = http.StatusBadGateway
	stuck(t, db, "create_ticket", time.Minute, "k")
	e := engine(t, db.Pool, reconcile.Config{
		Tools:              map[string]reconcile.Policy{"create_ticket": {ProcessingWindow: time.Second, Probe: ds.probe(t)}},
		AlertAfterAttempts: 3, Breaker: reconcile.BreakerConfig{Failures: 100}, BackoffBase: time.Minute,
	})
	for attempt := 1; attempt <= 3; attempt++ {
		rep := run(t, e, reconcile.Options{})
		if len(rep.Keys) != 1 || rep.Keys[0].Action != "backoff" || rep.Keys[0].Attempts != attempt {
			t.Fatalf("attempt %d: %+v", attempt, rep.Keys)
		}
		st, err := store.GetState(bg, db.Pool, "k")
		if err != nil || st.NextProbeAt == nil || time.Until(*st.NextProbeAt) < 30*time.Second {
			t.Fatalf("attempt %d: next probe not backed off: %+v", attempt, st)
		}
		// Backed off: a plain pass does not touch it.
		if rep := run(t, e, reconcile.Options{}); len(rep.Keys) != 0 {
			t.Fatalf("backed-off key probed again: %+v", rep.Keys)
		}
		want := 0
		if attempt >= 3 {
			want = 1
		}
		if n := outboxCount(t, db, "probe_failing"); n != want {
			t.Fatalf("attempt %d: probe_failing alerts = %d, want %d", attempt, n, want)
		}
		// Make it due again.
		db.Exec(t, `UPDATE reconcile_state SET next_probe_at = now() - interval '1 second'`)
	}
	if k := row(t, db, "k"); k.Status != ledger.StatusProcessing {
		t.Fatalf("unknown must stay processing: %+v", k)
	}
	st, _ := store.GetState(bg, db.Pool, "k")
	if st.LastError == nil || !strings.Contains(*st.LastError, "502") {
		t.Fatalf("last error = %v", st.LastError)
	}
}

func TestHandsOffInFlightKeys(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ds := newDownstream(t)
	stuck(t, db, "create_ticket", 5*time.Second, "young")         // inside window + grace
	stuck(t, db, "create_ticket", time.Minute, "beating", "held") // past it
	db.Exec(t, `UPDATE idempotency_keys SET heartbeat_at = now() - interval '2 seconds' WHERE key = 'beating'`)
	db.Exec(t, `INSERT INTO key_holds (key, reason, actor) VALUES ('held', 'investigating', 'alice')`)
	e := engine(t, db.Pool, reconcile.Config{
		Grace: 10 * time.Second,
		Tools: map[string]reconcile.Policy{"create_ticket": {ProcessingWindow: 10 * time.Second, HeartbeatTimeout: 30 * time.Second, Probe: ds.probe(t)}},
	})
	rep := run(t, e, reconcile.Options{})
	// --key forces back-off, never the window, the heartbeat or a hold.
	rep2 := run(t, e, reconcile.Options{Keys: []string{"young", "beating", "held"}})
	if len(rep.Keys)+len(rep2.Keys) != 0 {
		t.Fatalf("in-flight keys were reconciled: %+v %+v", rep.Keys, rep2.Keys)
	}
	if n := ds.totalHits(); n != 0 {
		t.Fatalf("downstream got %d requests, want 0", n)
	}
	for _, k := range []string{"young", "beating", "held"} {
		if r := row(t, db, k); r.Status != ledger.StatusProcessing {
			t.Fatalf("%s touched: %+v", k, r)
		}
	}
	if n := db.Count(t, "reconcile_audit"); n != 0 {
		t.Fatalf("audit rows = %d", n)
	}
}

// The original attempt completes while the probe runs: whatever the probe
// says (found or not_found), the original's outcome survives.
func TestOriginalCompletesDuringProbe(t *testing.T) {
	t.Parallel()
	for _, exists := range []bool{true, false} {
		t.Run(fmt.Sprintf("effect_found=%v", exists), func(t *testing.T) {
			t.Parallel()
			db := pgtest.New(t)
			ds := newDownstream(t)
			ds.gate = make(chan struct{})
			ds.entered = make(chan string, 1)
			stuck(t, db, "create_ticket", time.Minute, "k")
			if exists {
				ds.addTicket("k", "T-probe")
			}
			e := engine(t, db.Pool, reconcile.Config{Tools: map[string]reconcile.Policy{"create_ticket": {ProcessingWindow: time.Second, Probe: ds.probe(t)}}})
			done := make(chan reconcile.Report, 1)
			go func() {
				r, _ := e.Run(bg, reconcile.Options{})
				done <- r
			}()
			testwait.Recv(t, ds.entered, testwait.Timeout) // the probe is in flight, no row lock held
			k := row(t, db, "k")
			if err := ledger.Complete(bg, db.Pool, "k", k.ClaimedAt, 201, json.RawMessage(`{"ticket_id":"T-original"}`)); err != nil {
				t.Fatalf("original attempt blocked or refused while probing: %v", err)
			}
			close(ds.gate)
			rep := testwait.Recv(t, done, testwait.Timeout)
			if len(rep.Keys) != 1 || rep.Keys[0].Action != "resolved_by_original" {
				t.Fatalf("report = %+v", rep.Keys)
			}
			k = row(t, db, "k")
			if k.Status != ledger.StatusCompleted || !strings.Contains(string(k.ResponseBody), "T-original") {
				t.Fatalf("original outcome lost: %+v %s", k, k.ResponseBody)
			}
			hist, _ := store.History(bg, db.Pool, "k", 10)
			if len(hist) != 1 || hist[0].Action != "resolved_by_original" {
				t.Fatalf("history = %+v", hist)
			}
		})
	}
}

func newPool(t *testing.T, url string, max int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = max
	p, err := pgxpool.NewWithConfig(bg, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// Two engines (two pools, as two replicas) on 200 stuck keys with a slow
// downstream: every key probed exactly once, all resolved.
func TestTwoReplicasProbeEachKeyOnce(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ds := newDownstream(t)
	ds.delay = 20 * time.Millisecond
	var keys []string
	for i := range 200 {
		k := fmt.Sprintf("wf-%d:step-1", i)
		keys = append(keys, k)
		if i%2 == 0 {
			ds.addTicket(k, fmt.Sprintf("T-%d", i))
		}
	}
	stuck(t, db, "create_ticket", time.Minute, keys...)
	probe := ds.probe(t)
	cfg := func(actor string) reconcile.Config {
		return reconcile.Config{Actor: actor, BatchSize: 25, Concurrency: 8,
			Tools: map[string]reconcile.Policy{"create_ticket": {ProcessingWindow: time.Second, Probe: probe}}}
	}
	a := engine(t, newPool(t, db.URL, 10), cfg("replica-a"))
	b := engine(t, newPool(t, db.URL, 10), cfg("replica-b"))
	gate := make(chan struct{})
	reports := make(chan reconcile.Report, 2)
	for _, e := range []*reconcile.Engine{a, b} {
		go func() {
			<-gate
			r, err := e.Run(bg, reconcile.Options{})
			if err != nil {
				t.Error(err)
			}
			reports <- r
		}()
	}
	close(gate)
	ra, rb := testwait.Recv(t, reports, testwait.Timeout), testwait.Recv(t, reports, testwait.Timeout)
	if len(ra.Keys)+len(rb.Keys) != 200 {
		t.Fatalf("decisions: %d + %d, want 200", len(ra.Keys), len(rb.Keys))
	}
	if len(ra.Keys) == 0 || len(rb.Keys) == 0 {
		t.Logf("one replica did all the work (%d/%d): allowed, but the race was not exercised", len(ra.Keys), len(rb.Keys))
	}
	for _, k := range keys {
		if n := ds.hitsOf(k); n != 1 {
			t.Fatalf("key %s probed %d times", k, n)
		}
	}
	if n := db.Count(t, "idempotency_keys WHERE status = 'processing'"); n != 0 {
		t.Fatalf("%d keys left processing", n)
	}
	if n := db.Count(t, "idempotency_keys WHERE status = 'completed'"); n != 100 {
		t.Fatalf("completed = %d", n)
	}
	if n := db.Count(t, "reconcile_audit"); n != 200 {
		t.Fatalf("audit rows = %d", n)
	}
}

// A pass cancelled mid-probe gives its leases back without counting an
// attempt; the next pass resolves everything.
func TestCancelledPassResumes(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ds := newDownstream(t)
	ds.gate = make(chan struct{})
	ds.entered = make(chan string, 100)
	stuck(t, db, "create_ticket", time.Minute, "a", "b", "c")
	ds.addTicket("a", "T-a")
	e := engine(t, db.Pool, reconcile.Config{Concurrency: 3, Tools: map[string]reconcile.Policy{"create_ticket": {ProcessingWindow: time.Second, Probe: ds.probe(t)}}})
	ctx, cancel := context.WithCancel(bg)
	done := make(chan error, 1)
	go func() {
		_, err := e.Run(ctx, reconcile.Options{})
		done <- err
	}()
	testwait.Recv(t, ds.entered, testwait.Timeout)
	cancel()
	if err := testwait.Recv(t, done, testwait.Timeout); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled pass err = %v", err)
	}
	if n := db.Count(t, "reconcile_audit"); n != 0 {
		t.Fatalf("a cancelled probe was recorded: %d audit rows", n)
	}
	if n := db.Count(t, "reconcile_state WHERE attempts > 0 OR lease_owner IS NOT NULL"); n != 0 {
		rows, _ := db.Pool.Query(bg, `SELECT key, attempts, coalesce(lease_owner, ''), coalesce(last_verdict, '') FROM reconcile_state`)
		for rows.Next() {
			var k, o, v string
			var a int
			_ = rows.Scan(&k, &a, &o, &v)
			t.Logf("state %s attempts=%d owner=%s verdict=%s", k, a, o, v)
		}
		rows.Close()
		t.Fatalf("leases or attempts left behind: %d", n)
	}
	close(ds.gate)
	rep := run(t, e, reconcile.Options{})
	if rep.Actions["completed"] != 1 || rep.Actions["marked_retryable"] != 2 {
		t.Fatalf("next pass = %+v", rep.Actions)
	}
}

// A dry run probes and reports, and changes nothing.
func TestDryRunChangesNothing(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ds := newDownstream(t)
	stuck(t, db, "create_ticket", time.Minute, "found", "absent", "twice")
	stuck(t, db, "other", time.Minute, "noprobe")
	ds.addTicket("found", "T-1")
	ds.addTicket("twice", "T-2")
	ds.addTicket("twice", "T-3")
	snapshot := func() string {
		var s string
		err := db.Pool.QueryRow(bg, `SELECT concat_ws('|',
			(SELECT string_agg(t::text, ',' ORDER BY key) FROM idempotency_keys t),
			(SELECT count(*) FROM reconcile_state), (SELECT count(*) FROM reconcile_audit),
			(SELECT count(*) FROM alert_outbox), (SELECT count(*) FROM alert_state),
			(SELECT count(*) FROM ledgerkeeper_runs), (SELECT count(*) FROM tool_breakers))`).Scan(&s)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	before := snapshot()
	e := engine(t, db.Pool, reconcile.Config{AlertAfterAttempts: 1, Tools: map[string]reconcile.Policy{"create_ticket": {ProcessingWindow: time.Second, Probe: ds.probe(t)}}})
	rep := run(t, e, reconcile.Options{DryRun: true})
	if after := snapshot(); after != before {
		t.Fatalf("dry run changed the database:\nbefore %s\nafter  %s", before, after)
	}
	want := map[string]string{"found": "would_complete", "absent": "would_mark_retryable", "twice": "would_alert", "noprobe": "no_probe"}
	for _, k := range rep.Keys {
		if want[k.Key] != k.Action {
			t.Errorf("dry run %s: action %s, want %s", k.Key, k.Action, want[k.Key])
		}
	}
	if len(rep.Keys) != 4 || !rep.DryRun {
		t.Fatalf("report = %+v", rep)
	}
}

// The circuit breaker opens on a dead downstream: one alert for the tool,
// the other tools are still reconciled, unprobed keys keep their counts.
func TestCircuitBreaker(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	dead := newDownstream(t)
	dead.status = http.StatusServiceUnavailable
	alive := newDownstream(t)
	var deadKeys []string
	for i := range 30 {
		deadKeys = append(deadKeys, fmt.Sprintf("dead-%02d", i))
	}
	stuck(t, db, "charge_card", time.Minute, deadKeys...)
	stuck(t, db, "create_ticket", time.Minute, "fine")
	alive.addTicket("fine", "T-1")
	e := engine(t, db.Pool, reconcile.Config{
		Concurrency: 1, Breaker: reconcile.BreakerConfig{Failures: 5, Cooldown: time.Hour}, AlertAfterAttempts: 1,
		Tools: map[string]reconcile.Policy{
			"charge_card":   {ProcessingWindow: time.Second, Probe: dead.probe(t)},
			"create_ticket": {ProcessingWindow: time.Second, Probe: alive.probe(t)},
		},
	})
	rep := run(t, e, reconcile.Options{})
	if n := dead.totalHits(); n != 5 {
		t.Fatalf("dead downstream probed %d times, want 5 (breaker threshold)", n)
	}
	if k := row(t, db, "fine"); k.Status != ledger.StatusCompleted {
		t.Fatalf("other tool not reconciled: %+v", k)
	}
	if n := outboxCount(t, db, "downstream_unreachable"); n != 1 {
		t.Fatalf("downstream_unreachable alerts = %d, want 1", n)
	}
	if n := db.Count(t, "alert_outbox WHERE tool = 'charge_card' AND reason <> 'downstream_unreachable'"); n > 4 {
		t.Fatalf("per-key alerts while the breaker tripped: %d", n)
	}
	if n := db.Count(t, "reconcile_state WHERE tool = 'charge_card' AND attempts > 0"); n != 5 {
		t.Fatalf("keys with attempts counted = %d, want only the 5 probed", n)
	}
	if n := db.Count(t, "reconcile_state WHERE lease_owner IS NOT NULL"); n != 0 {
		t.Fatalf("leases left: %d", n)
	}
	var open bool
	for _, tr := range rep.Tools {
		if tr.Tool == "charge_card" {
			open = tr.BreakerOpen
		}
	}
	if !open {
		t.Fatalf("report tools = %+v", rep.Tools)
	}
	// Next pass: the tool is skipped entirely while open.
	run(t, e, reconcile.Options{})
	if n := dead.totalHits(); n != 5 {
		t.Fatalf("probed while open: %d", n)
	}
	if n := outboxCount(t, db, "downstream_unreachable"); n != 1 {
		t.Fatalf("second alert while open: %d", n)
	}
	// Cooldown over, downstream back: the breaker closes, alert resolved.
	db.Exec(t, `UPDATE tool_breakers SET open_until = now() - interval '1 second'`)
	dead.mu.Lock()
	dead.status = 0
	dead.mu.Unlock()
	db.Exec(t, `UPDATE reconcile_state SET next_probe_at = NULL`)
	run(t, e, reconcile.Options{})
	if n := db.Count(t, "idempotency_keys WHERE tool = 'charge_card' AND status = 'failed_retryable'"); n != 30 {
		t.Fatalf("after recovery %d keys resolved, want 30", n)
	}
	if n := db.Count(t, "alert_outbox WHERE reason = 'downstream_unreachable' AND kind = 'resolved'"); n != 1 {
		t.Fatalf("resolved notices = %d", n)
	}
	brs, err := reconcile.Breakers(bg, db.Pool)
	if err != nil || len(brs) != 0 {
		t.Fatalf("breakers = %+v %v", brs, err)
	}
}

// Hostile keys reach the downstream intact through the http probe.
func TestHostileKeysThroughHTTPProbe(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ds := newDownstream(t)
	hostile := []string{"a/b", "a?b=c", "a&b=c", "a#frag", "100%", "with space", "ünïcødé-键", "../../admin", strings.Repeat("x", 128), "a+b"}
	stuck(t, db, "create_ticket", time.Minute, hostile...)
	for i, k := range hostile {
		ds.addTicket(k, fmt.Sprintf("T-%d", i))
	}
	e := engine(t, db.Pool, reconcile.Config{Tools: map[string]reconcile.Policy{"create_ticket": {ProcessingWindow: time.Second, Probe: ds.probe(t)}}})
	run(t, e, reconcile.Options{})
	for i, k := range hostile {
		if n := ds.hitsOf(k); n != 1 {
			t.Errorf("key %q reached the downstream %d times", k, n)
		}
		r := row(t, db, k)
		if r.Status != ledger.StatusCompleted || !strings.Contains(string(r.ResponseBody), fmt.Sprintf(`"T-%d"`, i)) {
			t.Errorf("key %q: %s %s", k, r.Status, r.ResponseBody)
		}
	}
	if n := ds.totalHits(); n != len(hostile) {
		t.Fatalf("downstream hits = %d (a key leaked into another's query?)", n)
	}
}

func TestConfirmNotFoundAndDedupWindow(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ds := newDownstream(t)
	stuck(t, db, "create_ticket", time.Minute, "confirm")
	stuck(t, db, "charge_card", 48*time.Hour, "ancient")
	e := engine(t, db.Pool, reconcile.Config{
		ConfirmNotFoundAfter: time.Hour,
		Tools: map[string]reconcile.Policy{
			"create_ticket": {ProcessingWindow: time.Second, Probe: ds.probe(t)},
			"charge_card":   {ProcessingWindow: time.Second, DownstreamDedupWindow: 24 * time.Hour, Probe: ds.probe(t)},
		},
	})
	rep := run(t, e, reconcile.Options{})
	if rep.Actions["awaiting_confirmation"] != 1 || rep.Actions["escalated_dedup_window"] != 1 {
		t.Fatalf("first pass = %+v", rep.Actions)
	}
	if r := row(t, db, "confirm"); r.Status != ledger.StatusProcessing {
		t.Fatalf("one not_found must not mark retryable when confirmation is on: %+v", r)
	}
	if r := row(t, db, "ancient"); r.Status != ledger.StatusProcessing {
		t.Fatalf("past the dedup window must not mark retryable: %+v", r)
	}
	if n := outboxCount(t, db, "dedup_window_passed"); n != 1 {
		t.Fatalf("dedup escalations = %d", n)
	}
	// An hour later (simulated), the second not_found confirms.
	backdateFirstNotFound(t, db, 61*time.Minute, "confirm")
	rep = run(t, e, reconcile.Options{Keys: []string{"confirm"}})
	if rep.Actions["marked_retryable"] != 1 {
		t.Fatalf("second pass = %+v", rep.Actions)
	}
	if r := row(t, db, "confirm"); r.Status != ledger.StatusFailedRetryable {
		t.Fatalf("confirmed not_found: %+v", r)
	}
	// A found in between would have reset the confirmation: covered by the
	// ledger's bookkeeping test.
}

func TestResolvedNoticeWhenOriginalFinishesLater(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	stuck(t, db, "mystery", time.Minute, "k")
	e := engine(t, db.Pool, reconcile.Config{AlertAfterAttempts: 1})
	run(t, e, reconcile.Options{})
	if n := outboxCount(t, db, "no_probe"); n != 1 {
		t.Fatalf("no_probe alerts = %d", n)
	}
	k := row(t, db, "k")
	if err := ledger.Complete(bg, db.Pool, "k", k.ClaimedAt, 200, json.RawMessage(`{}`)); err != nil {
		t.Fatal(err)
	}
	rep := run(t, e, reconcile.Options{})
	if rep.ResolvedAlerts != 1 || db.Count(t, "alert_outbox WHERE kind = 'resolved'") != 1 {
		t.Fatalf("resolved = %d, outbox resolved rows = %d", rep.ResolvedAlerts, db.Count(t, "alert_outbox WHERE kind = 'resolved'"))
	}
}

func TestLimitBoundsThePass(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ds := newDownstream(t)
	var keys []string
	for i := range 10 {
		keys = append(keys, fmt.Sprint("k", i))
	}
	stuck(t, db, "create_ticket", time.Minute, keys...)
	e := engine(t, db.Pool, reconcile.Config{BatchSize: 3, Tools: map[string]reconcile.Policy{"create_ticket": {ProcessingWindow: time.Second, Probe: ds.probe(t)}}})
	if rep := run(t, e, reconcile.Options{Limit: 4}); len(rep.Keys) != 4 {
		t.Fatalf("limit 4 probed %d", len(rep.Keys))
	}
	if rep := run(t, e, reconcile.Options{}); len(rep.Keys) != 6 {
		t.Fatalf("the rest: %d", len(rep.Keys))
	}
}

// A probe that returns garbage can never produce a write.
func TestGarbageProbeLeavesKeyProcessing(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	stuck(t, db, "t", time.Minute, "nil-outcome", "bad-body", "bad-verdict", "panics")
	var calls atomic.Int32
	p := probes.ProbeFunc(func(_ context.Context, k probes.Key) probes.Result {
		calls.Add(1)
		switch k.Key {
		case "nil-outcome":
			return probes.Result{Verdict: probes.Found}
		case "bad-body":
			return probes.Result{Verdict: probes.Found, Outcome: &probes.Outcome{Code: 200, Body: json.RawMessage(`{nope`)}}
		case "bad-verdict":
			return probes.Result{Verdict: "maybe"}
		}
		panic("probe bug")
	})
	e := engine(t, db.Pool, reconcile.Config{Tools: map[string]reconcile.Policy{"t": {ProcessingWindow: time.Second, Probe: probes.Guard(p, time.Second)}}})
	rep := run(t, e, reconcile.Options{})
	if rep.Actions["backoff"] != 4 || calls.Load() != 4 {
		t.Fatalf("actions = %+v calls = %d", rep.Actions, calls.Load())
	}
	if n := db.Count(t, "idempotency_keys WHERE status = 'processing'"); n != 4 {
		t.Fatalf("processing = %d", n)
	}
}

// The database goes away while probes are in flight: nothing is half
// written, the pass reports the failure, and once the database is back the
// next pass (after the leases lapse) resolves every key.
func TestDatabaseGoesAwayMidPass(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ds := newDownstream(t)
	gate := make(chan struct{})
	ds.gate = gate
	ds.entered = make(chan string, 10)
	stuck(t, db, "create_ticket", time.Minute, "a", "b")
	ds.addTicket("a", "T-a")
	probe := ds.probe(t)
	pool := newPool(t, db.URL, 4)
	e := engine(t, pool, reconcile.Config{Lease: 5 * time.Second, Concurrency: 2,
		Tools: map[string]reconcile.Policy{"create_ticket": {ProcessingWindow: time.Second, Probe: probe}}})
	done := make(chan reconcile.Report, 1)
	go func() {
		r, _ := e.Run(bg, reconcile.Options{})
		done <- r
	}()
	admin := newPool(t, strings.Replace(db.URL, "/"+db.Name, "/postgres", 1), 1)
	testwait.Recv(t, ds.entered, testwait.Timeout)
	testwait.Recv(t, ds.entered, testwait.Timeout)
	// Take the database away: no new connections, existing ones killed.
	if _, err := admin.Exec(bg, `ALTER DATABASE `+db.Name+` ALLOW_CONNECTIONS false`); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(bg, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1`, db.Name); err != nil {
		t.Fatal(err)
	}
	close(gate)
	rep := testwait.Recv(t, done, testwait.Timeout)
	if rep.Actions["write_failed"] != 2 {
		t.Fatalf("actions = %+v, want 2 write_failed", rep.Actions)
	}
	// Back: the pools drop their dead connections and reconnect.
	if _, err := admin.Exec(bg, `ALTER DATABASE `+db.Name+` ALLOW_CONNECTIONS true`); err != nil {
		t.Fatal(err)
	}
	db.Pool.Reset()
	if n := db.Count(t, "reconcile_audit"); n != 0 {
		t.Fatalf("audit rows = %d: a failed decision was half written", n)
	}
	if n := db.Count(t, "idempotency_keys WHERE status = 'processing'"); n != 2 {
		t.Fatalf("processing = %d", n)
	}
	ds.mu.Lock()
	ds.gate, ds.entered = nil, nil
	ds.mu.Unlock()
	// Polled while the dead pass's leases lapse.
	testwait.Eventually(t, func() bool {
		_, _ = e.Run(bg, reconcile.Options{})
		return db.Count(t, "idempotency_keys WHERE status = 'processing'") == 0
	}, 15*time.Second, "the keys to be resolved after the database came back")
	if r := row(t, db, "a"); r.Status != ledger.StatusCompleted {
		t.Fatalf("a = %+v", r)
	}
}

// A heartbeat that arrives while the probe runs means the attempt is alive:
// even a not_found decides nothing (invariant 1 at write time, not only at
// lease time).
func TestHeartbeatDuringProbeWins(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ds := newDownstream(t)
	gate := make(chan struct{})
	ds.gate = gate
	ds.entered = make(chan string, 1)
	stuck(t, db, "create_ticket", time.Minute, "slow-but-alive")
	e := engine(t, db.Pool, reconcile.Config{Tools: map[string]reconcile.Policy{"create_ticket": {ProcessingWindow: time.Second, Probe: ds.probe(t)}}})
	done := make(chan reconcile.Report, 1)
	go func() {
		r, _ := e.Run(bg, reconcile.Options{})
		done <- r
	}()
	testwait.Recv(t, ds.entered, testwait.Timeout)
	k := row(t, db, "slow-but-alive")
	if err := ledger.Heartbeat(bg, db.Pool, k.Key, k.ClaimedAt); err != nil {
		t.Fatal(err)
	}
	close(gate)
	rep := testwait.Recv(t, done, testwait.Timeout)
	if len(rep.Keys) != 1 || rep.Keys[0].Action != "in_flight_again" {
		t.Fatalf("report = %+v", rep.Keys)
	}
	if r := row(t, db, k.Key); r.Status != ledger.StatusProcessing {
		t.Fatalf("a heartbeating key was decided: %+v", r)
	}
	if n := db.Count(t, "reconcile_state WHERE attempts > 0 OR lease_owner IS NOT NULL"); n != 0 {
		t.Fatalf("attempt counted or lease kept: %d", n)
	}
}

// --key reconciles each named key once per pass, however many there are
// and whatever the verdict (back-off is ignored, so they are due at once).
func TestKeyFlagOncePerPass(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ds := newDownstream(t)
	var keys []string
	for i := range 12 {
		k := fmt.Sprint("dup-", i)
		keys = append(keys, k)
		ds.addTicket(k, "T-1")
		ds.addTicket(k, "T-2") // duplicate: stays processing
	}
	stuck(t, db, "create_ticket", time.Minute, keys...)
	stuck(t, db, "mystery", time.Minute, "noprobe")
	e := engine(t, db.Pool, reconcile.Config{BatchSize: 5, Concurrency: 4,
		Tools: map[string]reconcile.Policy{"create_ticket": {ProcessingWindow: time.Second, Probe: ds.probe(t)}}})
	rep := run(t, e, reconcile.Options{Keys: append(keys, "noprobe")})
	if len(rep.Keys) != 13 {
		t.Fatalf("decisions = %d, want 13", len(rep.Keys))
	}
	for _, k := range keys {
		if n := ds.hitsOf(k); n != 1 {
			t.Fatalf("%s probed %d times in one pass", k, n)
		}
	}
	if n := db.Count(t, "reconcile_audit"); n != 13 {
		t.Fatalf("audit rows = %d", n)
	}
}

// --key on keys that cannot be reconciled now says why.
func TestKeyFlagExplainsUntouchedKeys(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ds := newDownstream(t)
	stuck(t, db, "create_ticket", 0, "young")
	stuck(t, db, "create_ticket", time.Minute, "held", "done")
	db.Exec(t, `INSERT INTO key_holds (key, reason, actor) VALUES ('held', 'r', 'op')`)
	db.Exec(t, `UPDATE idempotency_keys SET status = 'completed' WHERE key = 'done'`)
	e := engine(t, db.Pool, reconcile.Config{Tools: map[string]reconcile.Policy{"create_ticket": {ProcessingWindow: 10 * time.Second, Probe: ds.probe(t)}}})
	rep := run(t, e, reconcile.Options{Keys: []string{"young", "held", "done", "ghost"}})
	why := map[string]string{}
	for _, s := range rep.Skipped {
		why[s.Key] = s.Action
	}
	for key, want := range map[string]string{"young": "in flight", "held": "on hold", "done": "status is completed", "ghost": "not_found_in_ledger"} {
		if !strings.Contains(why[key], want) {
			t.Errorf("%s: %q, want it to say %q", key, why[key], want)
		}
	}
	if ds.totalHits() != 0 {
		t.Fatal("probed")
	}
}

// The engine enforces the verdict contract itself, for probes used without
// probes.Guard (a Go program's own wiring).
func TestUnguardedGarbageProbe(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	stuck(t, db, "t", time.Minute, "nil-outcome", "bad-code", "bad-verdict", "panics")
	p := probes.ProbeFunc(func(_ context.Context, k probes.Key) probes.Result {
		switch k.Key {
		case "nil-outcome":
			return probes.Result{Verdict: probes.Found}
		case "bad-code":
			return probes.Result{Verdict: probes.Found, Outcome: &probes.Outcome{Code: 42, Body: json.RawMessage(`{}`)}}
		case "bad-verdict":
			return probes.Result{Verdict: "maybe"}
		}
		panic("probe bug")
	})
	e := engine(t, db.Pool, reconcile.Config{Tools: map[string]reconcile.Policy{"t": {ProcessingWindow: time.Second, Probe: p}}})
	rep := run(t, e, reconcile.Options{})
	if rep.Actions["backoff"] != 4 {
		t.Fatalf("actions = %+v", rep.Actions)
	}
	if n := db.Count(t, "idempotency_keys WHERE status = 'processing'"); n != 4 {
		t.Fatalf("processing = %d", n)
	}
}

// The downstream's dedup horizon starts at the key's first use: a retry's
// fresh claim does not reset it.
func TestDedupWindowFromFirstUse(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ds := newDownstream(t)
	stuck(t, db, "charge_card", time.Minute, "reclaimed")
	db.Exec(t, `UPDATE idempotency_keys SET created_at = now() - interval '48 hours' WHERE key = 'reclaimed'`)
	e := engine(t, db.Pool, reconcile.Config{Tools: map[string]reconcile.Policy{
		"charge_card": {ProcessingWindow: time.Second, DownstreamDedupWindow: 24 * time.Hour, Probe: ds.probe(t)}}})
	rep := run(t, e, reconcile.Options{})
	if rep.Actions["escalated_dedup_window"] != 1 {
		t.Fatalf("actions = %+v", rep.Actions)
	}
	if r := row(t, db, "reclaimed"); r.Status != ledger.StatusProcessing {
		t.Fatalf("status = %s", r.Status)
	}
}

// A dry run alerts nothing, so it does not say it did: a duplicate and a
// key past the downstream's dedup window are would_alert, with the alert a
// real pass would raise; the real pass then takes the real actions.
func TestDryRunSaysWouldAlert(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ds := newDownstream(t)
	stuck(t, db, "charge_card", time.Minute, "old")
	db.Exec(t, `UPDATE idempotency_keys SET created_at = now() - interval '48 hours' WHERE key = 'old'`)
	stuck(t, db, "charge_card", time.Minute, "twice")
	ds.addTicket("twice", "T-2")
	ds.addTicket("twice", "T-3")
	e := engine(t, db.Pool, reconcile.Config{Tools: map[string]reconcile.Policy{
		"charge_card": {ProcessingWindow: time.Second, DownstreamDedupWindow: 24 * time.Hour, Probe: ds.probe(t)}}})
	dry := run(t, e, reconcile.Options{DryRun: true})
	wantAlert := map[string]string{"old": "dedup_window_passed", "twice": "duplicate_effect"}
	for _, k := range dry.Keys {
		if k.Action != reconcile.ActionWouldAlert || !slices.Contains(k.Alerts, wantAlert[k.Key]) {
			t.Errorf("dry run %s: action %s alerts %v; want would_alert with %s", k.Key, k.Action, k.Alerts, wantAlert[k.Key])
		}
	}
	if dry.Actions[reconcile.ActionWouldAlert] != 2 || dry.Actions["duplicate_alerted"] != 0 || dry.Actions["escalated_dedup_window"] != 0 {
		t.Fatalf("dry run actions = %+v", dry.Actions)
	}
	real := run(t, e, reconcile.Options{})
	if real.Actions["duplicate_alerted"] != 1 || real.Actions["escalated_dedup_window"] != 1 {
		t.Fatalf("real run actions = %+v", real.Actions)
	}
}
