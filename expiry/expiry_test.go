package expiry_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ledgerkeeper/ledgerkeeper/alerts"
	"github.com/ledgerkeeper/ledgerkeeper/expiry"
	"github.com/ledgerkeeper/ledgerkeeper/internal/daemon"
	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/ledger/ledgertest/testwait"
	"github.com/ledgerkeeper/ledgerkeeper/store"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

const day = 24 * time.Hour

// fakeClock moves only when the purger pauses (by the pause) or a test
// advances it, so pacing costs no wall time and budgets are deterministic.
// onSleep, when set, runs at each pause before time moves: tests use it to
// act between two batches.
type fakeClock struct {
	mu      sync.Mutex
	now     time.Time
	onSleep func(pause time.Duration)
}

func newClock() *fakeClock { return &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Sleep(ctx context.Context, d time.Duration) error {
	if c.onSleep != nil {
		c.onSleep(d)
	}
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
	return ctx.Err()
}

type bundle struct {
	db    *pgtest.DB
	clock *fakeClock
}

func setup(t *testing.T) bundle {
	t.Helper()
	t.Parallel()
	return bundle{db: pgtest.New(t), clock: newClock()}
}

// purger returns a purger on the bundle's clock and the alerts-backed
// Alerts the daemon wires, with cfg's non-zero fields.
func (b bundle) purger(cfg expiry.Config) *expiry.Purger {
	if cfg.Clock == nil {
		cfg.Clock = b.clock
	}
	if cfg.Alerts == nil {
		cfg.Alerts = daemon.PurgeAlerts{}
	}
	return expiry.New(cfg, b.db.Pool, nil, nil)
}

// key inserts a key created age ago that expires expiresIn from now
// (negative: it already has).
func (b bundle) key(t *testing.T, key, tool, status string, age, expiresIn time.Duration) {
	t.Helper()
	b.db.Exec(t, `INSERT INTO idempotency_keys (key, tool, request_hash, status, created_at, claimed_at, updated_at, expires_at)
		VALUES ($1, $2, 'h', $3, now() - $4::interval, now() - $4::interval, now() - $4::interval, now() + $5::interval)`,
		key, tool, status, age, expiresIn)
}

// keys inserts n keys named prefix-1..n like key.
func (b bundle) keys(t *testing.T, prefix, tool, status string, n int, age, expiresIn time.Duration) {
	t.Helper()
	b.db.Exec(t, `INSERT INTO idempotency_keys (key, tool, request_hash, status, created_at, claimed_at, updated_at, expires_at)
		SELECT $1 || '-' || i, $2, 'h', $3, now() - $4::interval, now() - $4::interval, now() - $4::interval,
		       now() + $5::interval - i * interval '1 ms'
		FROM generate_series(1, $6::int) i`, prefix, tool, status, age, expiresIn, n)
}

func (b bundle) exists(t *testing.T, key string) bool {
	t.Helper()
	return b.db.Count(t, "idempotency_keys WHERE key = $1", key) == 1
}

func run(t *testing.T, p *expiry.Purger) expiry.Report {
	t.Helper()
	rep, err := p.RunOnce(context.Background())
	if err != nil {
		t.Fatalf("RunOnce: %v", err)
	}
	if rep.AlreadyRunning {
		t.Fatal("RunOnce: already running")
	}
	return rep
}

// ruleCase is one retention rule, alone.
type ruleCase struct {
	name      string
	status    string
	tool      string
	age       time.Duration
	expiresIn time.Duration
	cfg       expiry.Config
	held      bool
	wantGone  bool
}

// shapes are the batch shapes the purge's safety tests run with: every rule
// must hold whichever way a batch deletes. The engine's own: on Citus the
// ctid shape is refused (store's TestPurgeShapeSupportedByTheEngine).
func shapes() []store.PurgeShape {
	var out []store.PurgeShape
	for _, s := range []store.PurgeShape{store.PurgeByCTID, store.PurgeByKey, store.PurgeByRange} {
		if s.Supported() == nil {
			out = append(out, s)
		}
	}
	return out
}

// Each retention rule, alone: is the key gone after one pass?
func TestRules(t *testing.T) {
	t.Parallel()
	cases := []ruleCase{
		{name: "expired completed is purged", status: "completed", age: 3 * day, expiresIn: -day, wantGone: true},
		{name: "expired failed_retryable is purged", status: "failed_retryable", age: 3 * day, expiresIn: -day, wantGone: true},
		{name: "expired processing is kept", status: "processing", age: 3 * day, expiresIn: -day},
		{name: "not yet expired is kept", status: "completed", age: 3 * day, expiresIn: time.Hour},
		{name: "expired but under the floor is kept", status: "completed", age: 12 * time.Hour, expiresIn: -time.Hour},
		{name: "expired and just past the floor is purged", status: "completed", age: day + time.Minute, expiresIn: -time.Hour, wantGone: true},
		{name: "tool floor longer than the default keeps it", status: "completed", tool: "charge_card", age: 3 * day, expiresIn: -day,
			cfg: expiry.Config{Tools: map[string]expiry.ToolRetention{"charge_card": {MinAge: 7 * day}}}},
		{name: "tool floor shorter than the default purges it", status: "completed", tool: "charge_card", age: 3 * time.Hour, expiresIn: -time.Hour,
			cfg: expiry.Config{Tools: map[string]expiry.ToolRetention{"charge_card": {MinAge: 2 * time.Hour}}}, wantGone: true},
		{name: "another tool's floor does not apply", status: "completed", tool: "create_ticket", age: 3 * day, expiresIn: -day,
			cfg: expiry.Config{Tools: map[string]expiry.ToolRetention{"charge_card": {MinAge: 7 * day}}}, wantGone: true},
		{name: "held expired completed is kept", status: "completed", age: 3 * day, expiresIn: -day, held: true},
	}
	for _, tc := range cases {
		for _, shape := range shapes() {
			t.Run(tc.name+"/"+string(shape), func(t *testing.T) {
				c := tc // its own copy: the subtests run in parallel
				c.cfg.BatchShape = shape
				c.run(t)
			})
		}
	}
}

func (tc ruleCase) run(t *testing.T) {
	b := setup(t)
	tool := tc.tool
	if tool == "" {
		tool = "create_ticket"
	}
	b.key(t, "k", tool, tc.status, tc.age, tc.expiresIn)
	b.key(t, "control", tool, "completed", 30*day, -20*day) // always purgeable under these floors
	if tc.held {
		b.db.Exec(t, `INSERT INTO key_holds (key, reason, actor) VALUES ('k', 'investigating', 'alice')`)
	}
	rep := run(t, b.purger(tc.cfg))
	if gone := !b.exists(t, "k"); gone != tc.wantGone {
		t.Fatalf("key gone = %v; want %v (report %+v)", gone, tc.wantGone, rep)
	}
	if b.exists(t, "control") {
		t.Fatal("the control key was not purged: the pass did not run")
	}
	want := int64(1)
	if tc.wantGone {
		want = 2
	}
	if rep.KeysDeleted != want || rep.DeletedFrom("idempotency_keys") != want {
		t.Fatalf("report says %d deleted; want %d", rep.KeysDeleted, want)
	}
}

// The series the dashboard and the alert rules query exist at zero before
// their first event: no panel on "No data" until the first timeout.
func TestPurgeSeriesStartAtZero(t *testing.T) {
	b := setup(t)
	reg := prometheus.NewRegistry()
	expiry.New(expiry.Config{Clock: b.clock, Alerts: daemon.PurgeAlerts{}}, b.db.Pool, nil, expiry.NewMetrics(reg))
	want := map[string]bool{
		`ledgerkeeper_purge_batches_total{result="timeout"}`:              false,
		`ledgerkeeper_purge_batches_total{result="ok"}`:                   false,
		`ledgerkeeper_purge_rows_deleted_total{table="idempotency_keys"}`: false,
		`ledgerkeeper_purge_rows_deleted_total{table="reconcile_audit"}`:  false,
		`ledgerkeeper_purge_rows_deleted_total{table="alert_outbox"}`:     false,
		`ledgerkeeper_purge_passes_total{result="error"}`:                 false,
		`ledgerkeeper_purge_passes_total{result="ok"}`:                    false,
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				name := fmt.Sprintf("%s{%s=%q}", mf.GetName(), l.GetName(), l.GetValue())
				if _, ok := want[name]; ok {
					want[name] = true
				}
			}
		}
	}
	for name, seen := range want {
		if !seen {
			t.Errorf("%s is not exported before its first event", name)
		}
	}
}

// An expired processing key is kept and alerted once, not once per pass; a
// held one is not alerted at all.
func TestExpiredProcessingAlertedOnce(t *testing.T) {
	b := setup(t)
	b.key(t, "stuck", "create_ticket", "processing", 3*day, -day)
	b.key(t, "held", "create_ticket", "processing", 3*day, -day)
	b.key(t, "young", "create_ticket", "processing", time.Minute, time.Hour)
	b.db.Exec(t, `INSERT INTO key_holds (key, reason, actor) VALUES ('held', 'on it', 'alice')`)
	reg := prometheus.NewRegistry()
	p := expiry.New(expiry.Config{Clock: b.clock, Alerts: daemon.PurgeAlerts{}}, b.db.Pool, nil, expiry.NewMetrics(reg))

	for pass := 1; pass <= 2; pass++ {
		rep := run(t, p)
		if rep.ExpiredProcessing != 2 || rep.ExpiredProcessingHeld != 1 {
			t.Fatalf("pass %d: found %d expired processing (%d held); want 2 (1)", pass, rep.ExpiredProcessing, rep.ExpiredProcessingHeld)
		}
		wantRaised := 0
		if pass == 1 {
			wantRaised = 1
		}
		if rep.AlertsRaised != wantRaised {
			t.Fatalf("pass %d: raised %d alerts; want %d", pass, rep.AlertsRaised, wantRaised)
		}
	}
	for _, k := range []string{"stuck", "held", "young"} {
		if !b.exists(t, k) {
			t.Fatalf("processing key %s was purged", k)
		}
	}
	if n := b.db.Count(t, "alert_outbox WHERE reason = $1 AND key = 'stuck'", string(alerts.ReasonExpiredProcessing)); n != 1 {
		t.Fatalf("%d outbox rows for the stuck key after two passes; want 1", n)
	}
	if n := b.db.Count(t, "alert_outbox WHERE key <> 'stuck'"); n != 0 {
		t.Fatalf("%d other alerts; want none (held keys are not alerted)", n)
	}
	if got := metricValue(t, reg, "ledgerkeeper_purge_expired_processing_keys"); got != 2 {
		t.Fatalf("expired processing gauge = %v", got)
	}
	if got := metricValue(t, reg, "ledgerkeeper_purge_alerts_raised_total"); got != 1 {
		t.Fatalf("alerts raised counter = %v", got)
	}
}

// metricValue reads one unlabelled gauge or counter from reg.
func metricValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			m := mf.GetMetric()[0]
			if g := m.GetGauge(); g != nil {
				return g.GetValue()
			}
			return m.GetCounter().GetValue()
		}
	}
	t.Fatalf("no series %s", name)
	return 0
}

// Alerts per pass are bounded; the next pass alerts the next keys.
func TestAlertsBoundedPerPass(t *testing.T) {
	b := setup(t)
	b.keys(t, "stuck", "create_ticket", "processing", 250, 3*day, -day)
	p := b.purger(expiry.Config{MaxAlertsPerPass: 120})
	if rep := run(t, p); rep.AlertsRaised != 120 || rep.ExpiredProcessing != 250 {
		t.Fatalf("pass 1: raised %d of %d", rep.AlertsRaised, rep.ExpiredProcessing)
	}
	if rep := run(t, p); rep.AlertsRaised != 120 {
		t.Fatalf("pass 2: raised %d; want the next 120", rep.AlertsRaised)
	}
	if rep := run(t, p); rep.AlertsRaised != 10 {
		t.Fatalf("pass 3: raised %d; want the last 10", rep.AlertsRaised)
	}
	if n := b.db.Count(t, "alert_outbox"); n != 250 {
		t.Fatalf("%d outbox rows; want one per key", n)
	}
}

// failingAlerts raises through the alerts-backed implementation and fails
// at the failAt-th key.
type failingAlerts struct {
	daemon.PurgeAlerts
	failAt, calls int
}

func (f *failingAlerts) ExpiredProcessing(ctx context.Context, tx pgx.Tx, k store.ExpiredKey, renotifyAfter time.Duration) (bool, error) {
	f.calls++
	if f.calls == f.failAt {
		return false, errors.New("outbox refused the alert")
	}
	return f.PurgeAlerts.ExpiredProcessing(ctx, tx, k, renotifyAfter)
}

// The alerts of a page of expired processing keys are written in the
// transaction that read the page (invariant 8): when one fails, none of the
// page's alerts exists, and the next pass raises them all.
func TestExpiredAlertsShareTheirPageTransaction(t *testing.T) {
	b := setup(t)
	b.keys(t, "stuck", "create_ticket", "processing", 3, 3*day, -day)
	rep, err := b.purger(expiry.Config{Alerts: &failingAlerts{failAt: 3}}).RunOnce(context.Background())
	if err == nil || rep.Error == "" {
		t.Fatalf("RunOnce with a failing alert: err = %v; want the failure", err)
	}
	if n, m := b.db.Count(t, "alert_outbox"), b.db.Count(t, "alert_state"); n != 0 || m != 0 {
		t.Fatalf("%d outbox and %d alert_state rows after the page's transaction failed; want none", n, m)
	}
	if rep := run(t, b.purger(expiry.Config{})); rep.AlertsRaised != 3 || b.db.Count(t, "alert_outbox") != 3 {
		t.Fatalf("next pass raised %d; want all 3", rep.AlertsRaised)
	}
}

// A batch on an alert table (package alerts' statement) that hits the
// statement timeout is a timed-out batch like a ledger one: rolled back,
// counted, retried smaller; the pass carries on.
func TestAlertTableBatchTimeoutShrinks(t *testing.T) {
	b := setup(t)
	b.db.Exec(t, `INSERT INTO alert_outbox (reason, tool, key, status, created_at) VALUES ('probe_failing', 't', 'k', 'sent', now() - interval '40 days')`)
	ctx := context.Background()
	blocker, err := b.db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer blocker.Rollback(ctx)
	if _, err := blocker.Exec(ctx, `LOCK TABLE alert_outbox IN EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	b.clock.onSleep = func(time.Duration) { _ = blocker.Rollback(ctx) } // the lock goes after the first timeout
	// Long enough that the batch after the lock is gone never times out on
	// a loaded machine (200 ms did, once, under a CI run building Citus).
	rep := run(t, b.purger(expiry.Config{BatchTimeout: time.Second}))
	if rep.TimedOutBatches != 1 || rep.DeletedFrom("alert_outbox") != 1 {
		t.Fatalf("timed out %d, deleted %d sent alerts; want 1 and 1", rep.TimedOutBatches, rep.DeletedFrom("alert_outbox"))
	}
}

// A purged key's reconcile_state goes with it; the pass is on the record.
func TestStateGoesWithKeyAndRunIsRecorded(t *testing.T) {
	b := setup(t)
	b.key(t, "done", "create_ticket", "completed", 3*day, -day)
	b.key(t, "live", "create_ticket", "completed", 3*day, day)
	b.db.Exec(t, `INSERT INTO reconcile_state (key, tool, claimed_at) SELECT key, tool, claimed_at FROM idempotency_keys`)
	rep := run(t, b.purger(expiry.Config{Actor: "replica-1"}))
	if rep.DeletedFrom("reconcile_state") != 1 || b.db.Count(t, "reconcile_state WHERE key = 'done'") != 0 {
		t.Fatalf("reconcile_state of the purged key: report %d, rows %d", rep.DeletedFrom("reconcile_state"), b.db.Count(t, "reconcile_state WHERE key = 'done'"))
	}
	if b.db.Count(t, "reconcile_state WHERE key = 'live'") != 1 {
		t.Fatal("reconcile_state of a live key was deleted")
	}
	runs, err := store.LastRuns(context.Background(), b.db.Pool)
	if err != nil || len(runs) != 1 || runs[0].Kind != "purge" || runs[0].Actor != "replica-1" {
		t.Fatalf("runs = %+v, %v", runs, err)
	}
	var stats expiry.Report
	if err := json.Unmarshal(runs[0].Stats, &stats); err != nil || stats.KeysDeleted != 1 {
		t.Fatalf("recorded stats %s: %v", runs[0].Stats, err)
	}
}

// Two purges at once: one works, the other reports that a purge is already
// running and does nothing.
func TestOnePurgeAtATime(t *testing.T) {
	b := setup(t)
	b.keys(t, "old", "create_ticket", "completed", 10, 3*day, -day)

	inPause := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	first := newClock()
	first.onSleep = func(time.Duration) {
		once.Do(func() {
			close(inPause)
			// Bounded: a test that failed before releasing must not
			// leave the purge stuck.
			select {
			case <-release:
			case <-time.After(testwait.Timeout):
			}
		})
	}
	done := make(chan expiry.Report, 1)
	go func() {
		rep, err := b.purger(expiry.Config{BatchSize: 2, Clock: first}).RunOnce(context.Background())
		if err != nil {
			t.Errorf("first purge: %v", err)
		}
		done <- rep
	}()
	testwait.Recv(t, inPause, testwait.Timeout) // the first purge holds the lock, between two batches

	second, err := b.purger(expiry.Config{}).RunOnce(context.Background())
	if err != nil || !second.AlreadyRunning || second.KeysDeleted != 0 {
		t.Fatalf("second purge: %+v, %v; want AlreadyRunning", second, err)
	}
	dry, err := b.purger(expiry.Config{}).DryRun(context.Background())
	if err != nil || !dry.PurgeRunning {
		t.Fatalf("dry run during a purge: running = %v, %v", dry.PurgeRunning, err)
	}
	close(release)
	if rep := testwait.Recv(t, done, testwait.Timeout); rep.AlreadyRunning || rep.KeysDeleted != 10 {
		t.Fatalf("first purge: %+v", rep)
	}
	// The lock went with the pass: the next one runs.
	if rep := run(t, b.purger(expiry.Config{})); rep.AlreadyRunning {
		t.Fatal("lock not released")
	}
}

// The budget stops a pass between batches, and the next pass carries on.
func TestBudget(t *testing.T) {
	b := setup(t)
	b.keys(t, "old", "create_ticket", "completed", 20, 3*day, -day)
	// Each pause is 10 (fake) minutes; the budget is 25: three batches of
	// two, then the next pause would end past the budget.
	p := b.purger(expiry.Config{BatchSize: 2, BatchPause: 10 * time.Minute, MaxDuration: 25 * time.Minute, DutyCycle: 1})

	rep := run(t, p)
	if !rep.BudgetExhausted || rep.Batches != 3 || rep.KeysDeleted != 6 {
		t.Fatalf("pass 1: budget exhausted %v, %d batches, %d deleted; want true, 3, 6", rep.BudgetExhausted, rep.Batches, rep.KeysDeleted)
	}
	if n := b.db.Count(t, "idempotency_keys"); n != 14 {
		t.Fatalf("%d keys left after pass 1; want 14", n)
	}
	rep = run(t, p)
	if !rep.BudgetExhausted || rep.KeysDeleted != 6 {
		t.Fatalf("pass 2: %+v", rep)
	}
	var total int64 = 12
	for i := 0; b.db.Count(t, "idempotency_keys") > 0; i++ {
		if i > 5 {
			t.Fatal("passes do not carry on")
		}
		total += run(t, p).KeysDeleted
	}
	if total != 20 {
		t.Fatalf("deleted %d in all; want 20", total)
	}
}

// A batch that hits the statement timeout is rolled back and the next one
// is smaller; the pass carries on once the obstacle is gone.
func TestBatchTimeoutShrinksAndRecovers(t *testing.T) {
	b := setup(t)
	b.keys(t, "old", "create_ticket", "completed", 50, 3*day, -day)
	ctx := context.Background()
	blocker, err := b.db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer blocker.Rollback(ctx)
	// EXCLUSIVE lets plain reads through and blocks the batch's FOR UPDATE.
	if _, err := blocker.Exec(ctx, `LOCK TABLE idempotency_keys IN EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	b.clock.onSleep = func(time.Duration) { _ = blocker.Rollback(ctx) } // the lock goes after the first timeout
	p := b.purger(expiry.Config{BatchSize: 40, BatchTimeout: 200 * time.Millisecond})
	rep := run(t, p)
	if rep.TimedOutBatches != 1 || rep.KeysDeleted != 50 {
		t.Fatalf("timed out %d, deleted %d; want 1 and 50", rep.TimedOutBatches, rep.KeysDeleted)
	}
	// 40 → 10 after the timeout, then +10% per fast batch: 10, 11, 12, 13
	// (=46), 14; then one batch per daemon table.
	if want := 6 + len(p.DaemonTables()); rep.Batches != want {
		t.Fatalf("%d batches; want %d (1 timed out, then growing from 10)", rep.Batches, want)
	}
}

// Batches that keep timing out end the pass with an error that says so.
func TestBatchesThatKeepTimingOutFail(t *testing.T) {
	b := setup(t)
	b.keys(t, "old", "create_ticket", "completed", 5, 3*day, -day)
	ctx := context.Background()
	blocker, err := b.db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer blocker.Rollback(ctx)
	if _, err := blocker.Exec(ctx, `LOCK TABLE idempotency_keys IN EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	// The timeout covers every statement of the pass, the unblocked reads
	// too: 300 ms, not less, so that a loaded machine's slow read is not
	// taken for the blocked batch (CI once timed out the count at 50 ms).
	rep, err := b.purger(expiry.Config{BatchTimeout: 300 * time.Millisecond}).RunOnce(ctx)
	if !errors.Is(err, store.ErrBatchTimeout) || rep.TimedOutBatches != 5 || rep.Error == "" {
		t.Fatalf("err = %v, timed out %d; want ErrBatchTimeout after 5", err, rep.TimedOutBatches)
	}
}

// Writers keep claiming and completing keys while a purge runs: nothing
// they write is touched, including expired failed_retryable keys a retry
// re-claims in the middle of the pass.
func TestPurgeConcurrentWithWriters(t *testing.T) {
	t.Parallel()
	for _, shape := range shapes() {
		t.Run(string(shape), func(t *testing.T) { testPurgeConcurrentWithWriters(t, shape) })
	}
}

func testPurgeConcurrentWithWriters(t *testing.T, shape store.PurgeShape) {
	b := setup(t)
	ctx := context.Background()
	b.keys(t, "old", "create_ticket", "completed", 300, 3*day, -day)
	// Expired retryable keys the purge reaches last: their retries re-claim
	// them before it gets there.
	b.keys(t, "retry", "create_ticket", "failed_retryable", 20, 3*day, -12*time.Hour)

	const writers, perWriter = 4, 25
	start := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var written, reclaimed []string
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for i := range perWriter {
				key := fmt.Sprintf("new-%d-%d", w, i)
				res, err := ledger.Claim(ctx, b.db.Pool, ledger.ClaimParams{Key: key, Tool: "create_ticket", RequestHash: "h"})
				if err != nil {
					t.Errorf("claim: %v", err)
					return
				}
				if err := ledger.Complete(ctx, b.db.Pool, key, res.Row.ClaimedAt, 201, json.RawMessage(`{}`)); err != nil {
					t.Errorf("complete: %v", err)
					return
				}
				mu.Lock()
				written = append(written, key)
				mu.Unlock()
				if i < 5 { // a retry of an expired failed_retryable key
					rk := fmt.Sprintf("retry-%d", w*5+i+1)
					res, err := ledger.Claim(ctx, b.db.Pool, ledger.ClaimParams{Key: rk, Tool: "create_ticket", RequestHash: "h"})
					if err != nil {
						t.Errorf("re-claim: %v", err)
						return
					}
					if res.Outcome == ledger.New {
						if err := ledger.Complete(ctx, b.db.Pool, rk, res.Row.ClaimedAt, 201, json.RawMessage(`{}`)); err != nil {
							t.Errorf("complete retry: %v", err)
							return
						}
						mu.Lock()
						reclaimed = append(reclaimed, rk)
						mu.Unlock()
					}
				}
			}
		}()
	}
	// The writers start at the first pause and the pass waits for them at
	// the third, so their writes overlap the purge's batches.
	pauses := 0
	b.clock.onSleep = func(time.Duration) {
		pauses++
		switch pauses {
		case 1:
			close(start)
		case 3:
			testwait.Wait(t, &wg, testwait.Timeout)
		}
	}
	rep := run(t, b.purger(expiry.Config{BatchSize: 20, BatchShape: shape}))
	if pauses < 3 {
		t.Fatalf("only %d pauses: the writers did not overlap the purge", pauses)
	}
	testwait.Wait(t, &wg, testwait.Timeout)

	if n := b.db.Count(t, "idempotency_keys WHERE key LIKE 'new-%'"); n != writers*perWriter || len(written) != writers*perWriter {
		t.Fatalf("%d of %d written keys left", n, len(written))
	}
	for _, k := range reclaimed {
		if !b.exists(t, k) {
			t.Errorf("re-claimed key %s was purged", k)
		}
	}
	if n := b.db.Count(t, "idempotency_keys WHERE key LIKE 'old-%'"); n != 0 {
		t.Fatalf("%d old keys left", n)
	}
	if len(reclaimed) != 20 || rep.KeysDeleted != 300 {
		t.Fatalf("re-claimed %d (want 20), deleted %d (want 300)", len(reclaimed), rep.KeysDeleted)
	}
}

// The daemon's own tables are trimmed by AuditMaxAge, in batches; what is
// young, pending or open stays.
func TestDaemonTablesRetention(t *testing.T) {
	b := setup(t)
	b.key(t, "live", "create_ticket", "processing", time.Hour, day)
	old, young := "now() - interval '40 days'", "now() - interval '1 day'"
	for _, at := range []string{old, young} {
		for range 3 {
			b.db.Exec(t, `INSERT INTO reconcile_audit (key, tool, attempt, verdict, action, actor, created_at)
				VALUES ('live', 'create_ticket', 1, 'unknown', 'backoff', 'r1', `+at+`)`)
		}
		b.db.Exec(t, `INSERT INTO alert_outbox (reason, tool, key, status, created_at) VALUES ('probe_failing', 't', 'k', 'sent', `+at+`)`)
		b.db.Exec(t, `INSERT INTO alert_outbox (reason, tool, key, status, created_at) VALUES ('probe_failing', 't', 'k', 'pending', `+at+`)`)
		b.db.Exec(t, `INSERT INTO ledgerkeeper_runs (kind, actor, started_at) VALUES ('reconcile', 'r1', `+at+`)`)
	}
	b.db.Exec(t, `INSERT INTO ledgerkeeper_runs (kind, actor, started_at) VALUES ('alerts', 'r1', `+old+`)`) // newest of its kind
	b.db.Exec(t, `INSERT INTO alert_state (reason, subject, resolved_at) VALUES
		('probe_failing', 'key:a', `+old+`), ('probe_failing', 'key:b', `+young+`), ('probe_failing', 'key:c', NULL)`)
	b.db.Exec(t, `INSERT INTO reconcile_state (key, tool, claimed_at) VALUES ('live', 'create_ticket', now()), ('gone', 'create_ticket', now())`)

	rep := run(t, b.purger(expiry.Config{BatchSize: 2}))
	want := map[string]int64{"reconcile_audit": 3, "alert_outbox": 1, "alert_state": 1, "ledgerkeeper_runs": 1, "reconcile_state": 1}
	for table, n := range want {
		if got := rep.DeletedFrom(table); got != n {
			t.Errorf("%s: report says %d deleted; want %d", table, got, n)
		}
	}
	counts := map[string]int{
		"reconcile_audit":                     3,
		"alert_outbox WHERE status='pending'": 2,
		"alert_outbox WHERE status='sent'":    1,
		"alert_state":                         2,
		"ledgerkeeper_runs":                   3, // young reconcile, old alerts (newest of its kind), this pass
		"reconcile_state WHERE key = 'live'":  1,
		"reconcile_state":                     1,
	}
	for from, n := range counts {
		if got := b.db.Count(t, from); got != n {
			t.Errorf("%s: %d rows; want %d", from, got, n)
		}
	}
	if rep.Batches < 3 {
		t.Errorf("%d batches: 3 audit rows in batches of 2 take two", rep.Batches)
	}
}

// A dry run reports what would go, and deletes and raises nothing.
func TestDryRunDeletesNothing(t *testing.T) {
	b := setup(t)
	b.keys(t, "ct", "create_ticket", "completed", 5, 3*day, -day)
	b.keys(t, "cc", "charge_card", "failed_retryable", 3, 3*day, -day)
	b.keys(t, "floor", "create_ticket", "completed", 2, time.Hour, -time.Minute)
	b.keys(t, "stuck", "create_ticket", "processing", 2, 3*day, -day)
	b.keys(t, "live", "create_ticket", "completed", 4, time.Hour, day)
	b.key(t, "held", "create_ticket", "completed", 3*day, -day)
	b.db.Exec(t, `INSERT INTO key_holds (key, reason, actor) VALUES ('held', 'r', 'op')`)
	b.db.Exec(t, `INSERT INTO reconcile_audit (key, tool, attempt, verdict, action, actor, created_at)
		VALUES ('x', 't', 1, 'unknown', 'backoff', 'r1', now() - interval '40 days')`)
	before := snapshot(t, b.db)

	rep, err := b.purger(expiry.Config{}).DryRun(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if after := snapshot(t, b.db); after != before {
		t.Fatalf("dry run changed the database: %v → %v", before, after)
	}
	if rep.TotalKeys != 8 || len(rep.Keys) != 2 || rep.UnderFloor != 2 || rep.Held != 1 ||
		rep.ExpiredProcessing != 2 || len(rep.WouldAlert) != 2 || rep.OldestExpiresAt == nil {
		t.Fatalf("dry run report: %+v", rep)
	}
	if rep.Keys[0].Tool != "charge_card" || rep.Keys[0].Status != "failed_retryable" || rep.Keys[0].Keys != 3 {
		t.Fatalf("per tool and status: %+v", rep.Keys)
	}
	if rep.Tables[0].Table != string(store.TableAudit) || rep.Tables[0].Rows != 1 {
		t.Fatalf("daemon tables: %+v", rep.Tables)
	}
	// And the real pass does what the dry run said.
	if real := run(t, b.purger(expiry.Config{})); real.KeysDeleted != rep.TotalKeys {
		t.Fatalf("real pass deleted %d; dry run said %d", real.KeysDeleted, rep.TotalKeys)
	}
}

// A held, processing, expired key is counted once (as expired processing
// and held, not also as a kept held key), and nothing to alert is an empty
// list, not null.
func TestDryRunCountsAHeldProcessingKeyOnce(t *testing.T) {
	b := setup(t)
	b.key(t, "held-stuck", "create_ticket", "processing", 3*day, -day)
	b.key(t, "held-done", "create_ticket", "completed", 3*day, -day)
	b.db.Exec(t, `INSERT INTO key_holds (key, reason, actor) VALUES ('held-stuck', 'r', 'op'), ('held-done', 'r', 'op')`)
	rep, err := b.purger(expiry.Config{}).DryRun(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if rep.Held != 1 || rep.ExpiredProcessing != 1 || rep.ExpiredProcessingHeld != 1 || rep.TotalKeys != 0 {
		t.Fatalf("each key once: kept_held=%d expired_processing=%d held=%d purge=%d; want 1 1 1 0",
			rep.Held, rep.ExpiredProcessing, rep.ExpiredProcessingHeld, rep.TotalKeys)
	}
	out, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), `"would_alert":[]`) {
		t.Fatalf("would_alert must be an empty list: %s", out)
	}
}

func snapshot(t *testing.T, db *pgtest.DB) string {
	t.Helper()
	return fmt.Sprint(db.Count(t, "idempotency_keys"), db.Count(t, "alert_outbox"), db.Count(t, "alert_state"),
		db.Count(t, "reconcile_audit"), db.Count(t, "ledgerkeeper_runs"), db.Count(t, "key_holds"))
}

// A cancelled pass stops at once and reports what it did.
func TestCancelledPass(t *testing.T) {
	b := setup(t)
	b.keys(t, "old", "create_ticket", "completed", 10, 3*day, -day)
	ctx, cancel := context.WithCancel(context.Background())
	b.clock.onSleep = func(time.Duration) { cancel() }
	rep, err := b.purger(expiry.Config{BatchSize: 3}).RunOnce(ctx)
	if !errors.Is(err, context.Canceled) || rep.KeysDeleted != 3 {
		t.Fatalf("err %v, deleted %d; want Canceled after one batch of 3", err, rep.KeysDeleted)
	}
	if n := b.db.Count(t, "idempotency_keys"); n != 7 {
		t.Fatalf("%d left; the first batch must stay deleted", n)
	}
	if rep := run(t, b.purger(expiry.Config{})); rep.AlreadyRunning || rep.KeysDeleted != 7 {
		t.Fatalf("next pass: %+v", rep)
	}
}

// The database going away mid-pass ends the pass with an error; the batches
// already committed stay deleted and the next pass carries on.
func TestDatabaseGoneMidPass(t *testing.T) {
	b := setup(t)
	b.keys(t, "old", "create_ticket", "completed", 10, 3*day, -day)
	ctx := context.Background()
	b.clock.onSleep = func(time.Duration) {
		// Kill the purge's session: the one holding the purge lock in this
		// test's database.
		b.db.Exec(t, `SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND granted
			AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`)
	}
	rep, err := b.purger(expiry.Config{BatchSize: 4}).RunOnce(ctx)
	if err == nil || rep.KeysDeleted != 4 || rep.Error == "" {
		t.Fatalf("err %v, deleted %d; want an error after one batch of 4", err, rep.KeysDeleted)
	}
	b.clock.onSleep = nil
	if n := b.db.Count(t, "idempotency_keys"); n != 6 {
		t.Fatalf("%d left; the first batch must stay deleted", n)
	}
	// The killed session takes the lock with it once it has exited.
	testwait.Eventually(t, func() bool {
		running, err := store.PurgeRunning(ctx, b.db.Pool)
		if err != nil {
			t.Fatal(err)
		}
		return !running
	}, testwait.Timeout, "the killed session's purge lock to be released")
	if rep := run(t, b.purger(expiry.Config{})); rep.KeysDeleted != 6 {
		t.Fatalf("next pass: %+v", rep)
	}
	runs := b.db.Count(t, "ledgerkeeper_runs WHERE kind = 'purge' AND error IS NOT NULL")
	if runs != 1 {
		t.Fatalf("%d failed runs recorded; want 1", runs)
	}
}
