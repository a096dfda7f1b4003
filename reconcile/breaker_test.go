package reconcile_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/ledger/ledgertest/testwait"
	"github.com/ledgerkeeper/ledgerkeeper/reconcile"
)

// breakerRow is a tool's row in tool_breakers as the tests read it back.
type breakerRow struct {
	consecutive int
	opens       int
	// left is open_until - now(); zero when open_until is NULL.
	left time.Duration
}

func readBreaker(t *testing.T, db *pgtest.DB, tool string) breakerRow {
	t.Helper()
	var b breakerRow
	var left *float64
	err := db.Pool.QueryRow(bg, `SELECT consecutive_failures, opens, extract(epoch FROM open_until - now())::float8
		FROM tool_breakers WHERE tool = $1`, tool).Scan(&b.consecutive, &b.opens, &left)
	if err != nil {
		t.Fatalf("read the breaker of %s: %v", tool, err)
	}
	if left != nil {
		b.left = time.Duration(*left * float64(time.Second))
	}
	return b
}

// wantCooldown checks that the breaker is open for about want from now:
// open_until was set to now() + want by a transaction a moment ago.
func wantCooldown(t *testing.T, b breakerRow, want time.Duration) {
	t.Helper()
	if b.left > want || b.left < want-time.Minute {
		t.Fatalf("breaker open for another %s (opens=%d), want about %s", b.left.Round(time.Second), b.opens, want)
	}
}

// makeDue ends every key's back-off, as if its next probe time had come.
func makeDue(t *testing.T, db *pgtest.DB) {
	t.Helper()
	db.Exec(t, `UPDATE reconcile_state SET next_probe_at = now() - interval '1 second'`)
}

// endCooldown moves the tool's breaker past its cooldown: half-open.
func endCooldown(t *testing.T, db *pgtest.DB, tool string) {
	t.Helper()
	db.Exec(t, `UPDATE tool_breakers SET open_until = now() - interval '1 second' WHERE tool = $1`, tool)
}

func toolReport(t *testing.T, rep reconcile.Report, tool string) reconcile.ToolReport {
	t.Helper()
	for _, tr := range rep.Tools {
		if tr.Tool == tool {
			return tr
		}
	}
	t.Fatalf("no report for tool %s: %+v", tool, rep.Tools)
	return reconcile.ToolReport{}
}

// deadToolScenario is issue 8's scenario: 3 stuck keys of a tool whose
// downstream answers 503, spread over 6 passes by back-off. The breaker
// counts across the passes: probing stops after breaker.failures (5)
// unknown verdicts, one downstream_unreachable alert, and no per-key
// probe_failing alert while it is open (AlertAfterAttempts 2, so every key
// would have one by its second attempt otherwise).
type deadToolScenario struct {
	db  *pgtest.DB
	ds  *downstream
	cfg reconcile.Config
	e   *reconcile.Engine
	// passers run the passes in turn (default: e alone).
	passers []*reconcile.Engine
}

const deadTool = "charge_card"

func newDeadToolScenario(t *testing.T) *deadToolScenario {
	t.Helper()
	s := &deadToolScenario{db: pgtest.New(t), ds: newDownstream(t)}
	s.ds.status = http.StatusServiceUnavailable
	stuck(t, s.db, deadTool, time.Minute, "k1", "k2", "k3")
	s.cfg = reconcile.Config{
		Breaker: reconcile.BreakerConfig{Failures: 5, Cooldown: time.Hour, MaxCooldown: 10 * time.Hour}, AlertAfterAttempts: 2,
		Tools: map[string]reconcile.Policy{deadTool: {ProcessingWindow: time.Second, Concurrency: 1, Probe: s.ds.probe(t)}},
	}
	s.e = engine(t, s.db.Pool, s.cfg)
	return s
}

// sixPasses runs the 6 passes, the keys made due before each one.
func (s *deadToolScenario) sixPasses(t *testing.T) {
	t.Helper()
	db := s.db
	wantHits := []int{3, 5, 5, 5, 5, 5}
	wantCount := []int{3, 5, 5, 5, 5, 5}
	for i := range 6 {
		makeDue(t, db)
		e := s.e
		if len(s.passers) > 0 {
			e = s.passers[i%len(s.passers)]
		}
		rep := run(t, e, reconcile.Options{})
		if n := s.ds.totalHits(); n != wantHits[i] {
			t.Fatalf("pass %d: %d probes in all, want %d (the breaker opens at 5 unknowns, whatever the passes)", i+1, n, wantHits[i])
		}
		b := readBreaker(t, db, deadTool)
		if b.consecutive != wantCount[i] {
			t.Fatalf("pass %d: tool_breakers.consecutive_failures = %d, want %d", i+1, b.consecutive, wantCount[i])
		}
		open := i >= 1
		if tr := toolReport(t, rep, deadTool); tr.BreakerOpen != open {
			t.Fatalf("pass %d: report says breaker open = %v, want %v (%+v)", i+1, tr.BreakerOpen, open, tr)
		}
		if !open {
			if b.opens != 0 {
				t.Fatalf("pass %d: breaker opened after %d failures", i+1, b.consecutive)
			}
			continue
		}
		if b.opens != 1 {
			t.Fatalf("pass %d: opens = %d, want 1", i+1, b.opens)
		}
		wantCooldown(t, b, s.cfg.Breaker.Cooldown)
		if n := outboxCount(t, db, "downstream_unreachable"); n != 1 {
			t.Fatalf("pass %d: downstream_unreachable alerts = %d, want 1", i+1, n)
		}
		// The 4th unknown (a key's 2nd attempt, breaker still closed) may
		// raise its key's alert; the 5th, which opens the breaker, and
		// every decision after it raise none.
		if n := outboxCount(t, db, "probe_failing"); n > 1 {
			t.Fatalf("pass %d: %d probe_failing alerts; the breaker's alert covers the tool", i+1, n)
		}
		// Decisions of a tool serialise on its tool_breakers row, so ids
		// order them: none after the one that opened the breaker.
		if n := db.Count(t, `alert_outbox p WHERE p.reason = 'probe_failing' AND p.id >
			(SELECT min(u.id) FROM alert_outbox u WHERE u.reason = 'downstream_unreachable')`); n != 0 {
			t.Fatalf("pass %d: %d probe_failing alerts raised while the breaker was open", i+1, n)
		}
	}
	if n := db.Count(t, "reconcile_audit"); n != 5 {
		t.Fatalf("audit rows = %d, want one per probe (5)", n)
	}
	if n := db.Count(t, "reconcile_state WHERE lease_owner IS NOT NULL"); n != 0 {
		t.Fatalf("leases left: %d", n)
	}
}

// The breaker counts a tool's consecutive unknown verdicts across passes;
// after the cooldown one probe goes through alone (half-open), and when it
// is conclusive the breaker closes and its alert is resolved.
func TestBreakerCountsAcrossPasses(t *testing.T) {
	t.Parallel()
	s := newDeadToolScenario(t)
	s.sixPasses(t)
	db, ds := s.db, s.ds

	// The downstream is back; the cooldown is over.
	ds.mu.Lock()
	ds.status = 0
	ds.gate = make(chan struct{})
	ds.entered = make(chan string, 10)
	ds.mu.Unlock()
	ds.addTicket("k1", "T-1")
	endCooldown(t, db, deadTool)
	makeDue(t, db)
	done := make(chan reconcile.Report, 1)
	go func() {
		r, err := s.e.Run(bg, reconcile.Options{})
		if err != nil {
			t.Errorf("recovery pass: %v", err)
		}
		done <- r
	}()
	trial := testwait.Recv(t, ds.entered, testwait.Timeout)
	// The trial is in flight: it is the only key leased, nothing else is
	// probed until it has answered.
	if n := db.Count(t, "reconcile_state WHERE lease_owner IS NOT NULL"); n != 1 {
		t.Fatalf("%d keys leased while the half-open trial (%s) is in flight, want 1", n, trial)
	}
	if n := ds.totalHits(); n != 6 {
		t.Fatalf("%d probes in all while the trial is in flight, want 6", n)
	}
	close(ds.gate)
	rep := testwait.Recv(t, done, testwait.Timeout)
	if n := ds.totalHits(); n != 8 {
		t.Fatalf("%d probes in all, want 8: the trial, then each other key once", n)
	}
	if tr := toolReport(t, rep, deadTool); tr.BreakerOpen {
		t.Fatalf("breaker still open after a conclusive trial: %+v", tr)
	}
	if b := readBreaker(t, db, deadTool); b.opens != 0 || b.consecutive != 0 || b.left != 0 {
		t.Fatalf("breaker after a conclusive trial = %+v, want closed", b)
	}
	if brs, err := reconcile.Breakers(bg, db.Pool); err != nil || len(brs) != 0 {
		t.Fatalf("breakers listed after closing: %+v %v", brs, err)
	}
	if n := outboxCount(t, db, "downstream_unreachable"); n != 1 {
		t.Fatalf("downstream_unreachable firing rows = %d, want 1", n)
	}
	if n := db.Count(t, "alert_outbox WHERE reason = 'downstream_unreachable' AND kind = 'resolved'"); n != 1 {
		t.Fatalf("downstream_unreachable resolved rows = %d, want 1", n)
	}
	if r := row(t, db, "k1"); r.Status != ledger.StatusCompleted {
		t.Fatalf("k1 = %s, want completed", r.Status)
	}
	for _, k := range []string{"k2", "k3"} {
		if r := row(t, db, k); r.Status != ledger.StatusFailedRetryable {
			t.Fatalf("%s = %s, want failed_retryable", k, r.Status)
		}
	}
	// Any per-key alert raised before the breaker opened is over too.
	if n := db.Count(t, "alert_state WHERE reason = 'probe_failing' AND resolved_at IS NULL"); n != 0 {
		t.Fatalf("%d probe_failing alerts left open after every key settled", n)
	}
}

// Replicas share the count: passes alternating between two of them (own
// pools, own actors) open the breaker at the same 5th unknown.
func TestBreakerCountsAcrossReplicas(t *testing.T) {
	t.Parallel()
	s := newDeadToolScenario(t)
	for _, actor := range []string{"replica-a", "replica-b"} {
		cfg := s.cfg
		cfg.Actor = actor
		s.passers = append(s.passers, engine(t, newPool(t, s.db.URL, 4), cfg))
	}
	s.sixPasses(t)
	if n := s.db.Count(t, "reconcile_audit WHERE actor = 'replica-a'"); n != 3 {
		t.Fatalf("replica-a decided %d keys, want 3 (pass 1)", n)
	}
}

// A failed half-open trial re-opens the breaker with the cooldown doubled,
// after exactly one probe, and the outage keeps its one alert.
func TestBreakerHalfOpenTrialFails(t *testing.T) {
	t.Parallel()
	s := newDeadToolScenario(t)
	s.sixPasses(t)
	db := s.db
	for i, want := range []time.Duration{2 * time.Hour, 4 * time.Hour} {
		endCooldown(t, db, deadTool)
		makeDue(t, db)
		rep := run(t, s.e, reconcile.Options{})
		if n := s.ds.totalHits(); n != 6+i {
			t.Fatalf("trial %d: %d probes in all, want %d (one trial per cooldown)", i+1, n, 6+i)
		}
		if tr := toolReport(t, rep, deadTool); !tr.BreakerOpen || tr.Probed != 1 {
			t.Fatalf("trial %d: report %+v, want breaker open after 1 probe", i+1, tr)
		}
		b := readBreaker(t, db, deadTool)
		if b.opens != 2+i {
			t.Fatalf("trial %d: opens = %d, want %d", i+1, b.opens, 2+i)
		}
		wantCooldown(t, b, want)
		if n := outboxCount(t, db, "downstream_unreachable"); n != 1 {
			t.Fatalf("trial %d: downstream_unreachable firing rows = %d, want 1 per outage", i+1, n)
		}
		if n := db.Count(t, "alert_outbox WHERE kind = 'resolved'"); n != 0 {
			t.Fatalf("trial %d: %d resolved notices during the outage", i+1, n)
		}
		if n := outboxCount(t, db, "probe_failing"); n > 1 {
			t.Fatalf("trial %d: %d probe_failing alerts while the breaker is open", i+1, n)
		}
	}
}

// Two replicas at half-open: one of them claims the trial and sends the
// one probe; the other probes nothing and says why.
func TestBreakerHalfOpenOneTrialAcrossReplicas(t *testing.T) {
	t.Parallel()
	s := newDeadToolScenario(t)
	s.sixPasses(t)
	db, ds := s.db, s.ds
	endCooldown(t, db, deadTool)
	makeDue(t, db)
	ds.mu.Lock()
	ds.gate = make(chan struct{})
	ds.entered = make(chan string, 10)
	ds.mu.Unlock()
	replica := func(actor string) *reconcile.Engine {
		cfg := s.cfg
		cfg.Actor = actor
		return engine(t, newPool(t, db.URL, 4), cfg)
	}
	start := make(chan struct{})
	reports := make(chan reconcile.Report, 2)
	for _, e := range []*reconcile.Engine{replica("replica-a"), replica("replica-b")} {
		go func() {
			<-start
			r, err := e.Run(bg, reconcile.Options{})
			if err != nil {
				t.Errorf("%s: %v", r.Actor, err)
			}
			reports <- r
		}()
	}
	close(start)
	// The trial waits at the downstream's gate; the replica that did not
	// claim it is done without probing.
	testwait.Recv(t, ds.entered, testwait.Timeout)
	loser := testwait.Recv(t, reports, testwait.Timeout)
	if tr := toolReport(t, loser, deadTool); tr.Probed != 0 || !strings.Contains(tr.Note, "another reconciler is sending the trial probe") {
		t.Fatalf("%s: %+v, want no probe while the other replica's trial is under way", loser.Actor, tr)
	}
	close(ds.gate)
	winner := testwait.Recv(t, reports, testwait.Timeout)
	if tr := toolReport(t, winner, deadTool); tr.Probed != 1 || !tr.BreakerOpen {
		t.Fatalf("%s: %+v, want 1 probe that re-opens the breaker", winner.Actor, tr)
	}
	if n := ds.totalHits(); n != 6 {
		t.Fatalf("%d probes in all, want 6: one trial for both replicas", n)
	}
	b := readBreaker(t, db, deadTool)
	if b.opens != 2 {
		t.Fatalf("opens = %d, want 2", b.opens)
	}
	wantCooldown(t, b, 2*time.Hour)
	if n := outboxCount(t, db, "downstream_unreachable"); n != 1 {
		t.Fatalf("downstream_unreachable firing rows = %d, want 1", n)
	}
}

// Cooldown doubles per re-open up to max_cooldown, and stays there however
// often the breaker has opened (2^opens cannot overflow the interval).
func TestBreakerCooldownDoublesUpToMax(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ds := newDownstream(t)
	ds.status = http.StatusServiceUnavailable
	stuck(t, db, deadTool, time.Minute, "a", "b", "c", "d", "e", "f", "g")
	e := engine(t, db.Pool, reconcile.Config{
		Breaker: reconcile.BreakerConfig{Failures: 2, Cooldown: time.Hour, MaxCooldown: 3 * time.Hour},
		Tools:   map[string]reconcile.Policy{deadTool: {ProcessingWindow: time.Second, Concurrency: 1, Probe: ds.probe(t)}},
	})
	run(t, e, reconcile.Options{})
	b := readBreaker(t, db, deadTool)
	if b.opens != 1 || ds.totalHits() != 2 {
		t.Fatalf("after 2 failures: %+v, %d probes", b, ds.totalHits())
	}
	wantCooldown(t, b, time.Hour)
	// 2h, then 4h capped at 3h, then still 3h.
	for i, want := range []time.Duration{2 * time.Hour, 3 * time.Hour, 3 * time.Hour} {
		endCooldown(t, db, deadTool)
		makeDue(t, db)
		run(t, e, reconcile.Options{})
		b := readBreaker(t, db, deadTool)
		if b.opens != 2+i {
			t.Fatalf("re-open %d: opens = %d, want %d", i+1, b.opens, 2+i)
		}
		wantCooldown(t, b, want)
	}
	// A breaker that has opened a hundred times (a downstream dead for
	// weeks): the doubling is bounded before it can overflow.
	db.Exec(t, `UPDATE tool_breakers SET opens = 100`)
	endCooldown(t, db, deadTool)
	makeDue(t, db)
	rep := run(t, e, reconcile.Options{})
	if rep.Actions["write_failed"] != 0 {
		t.Fatalf("the decision that re-opens a breaker opened 100 times failed: %+v", rep.Keys)
	}
	b = readBreaker(t, db, deadTool)
	if b.opens != 101 {
		t.Fatalf("opens = %d, want 101", b.opens)
	}
	wantCooldown(t, b, 3*time.Hour)
	if n := ds.totalHits(); n != 6 {
		t.Fatalf("%d probes in all, want 6 (2, then one trial per cooldown)", n)
	}
}

// An operator raised breaker.failures during an outage (or a rolling
// deploy runs replicas with different values): after the cooldown the
// trial still decides alone, and one unknown re-opens the breaker, however
// far the stored count is from the new threshold.
func TestHalfOpenOneUnknownReopens(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ds := newDownstream(t)
	ds.status = http.StatusServiceUnavailable
	stuck(t, db, deadTool, time.Minute, "a", "b", "c", "d", "e", "f")
	cfg := func(failures int) reconcile.Config {
		return reconcile.Config{Breaker: reconcile.BreakerConfig{Failures: failures, Cooldown: time.Hour, MaxCooldown: 10 * time.Hour},
			Tools: map[string]reconcile.Policy{deadTool: {ProcessingWindow: time.Second, Concurrency: 1, Probe: ds.probe(t)}}}
	}
	run(t, engine(t, db.Pool, cfg(2)), reconcile.Options{})
	if b := readBreaker(t, db, deadTool); b.opens != 1 || b.consecutive != 2 {
		t.Fatalf("after 2 failures: %+v", b)
	}
	raised := engine(t, db.Pool, cfg(10))
	endCooldown(t, db, deadTool)
	makeDue(t, db)
	rep := run(t, raised, reconcile.Options{})
	if n := ds.totalHits(); n != 3 {
		t.Fatalf("%d probes in all, want 3: one trial after the cooldown", n)
	}
	b := readBreaker(t, db, deadTool)
	if b.opens != 2 || b.consecutive != 3 {
		t.Fatalf("after the failed trial: %+v, want re-opened (opens 2)", b)
	}
	wantCooldown(t, b, 2*time.Hour)
	if tr := toolReport(t, rep, deadTool); !tr.BreakerOpen || tr.Probed != 1 {
		t.Fatalf("report %+v", tr)
	}
}

// The pass stops probing at the verdict that will open the breaker, before
// that decision is written: here its write fails (the database refuses to
// count it), and still no second probe is sent at half-open.
func TestHalfOpenTrialStopsThePassBeforeItsWrite(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ds := newDownstream(t)
	ds.status = http.StatusServiceUnavailable
	stuck(t, db, deadTool, time.Minute, "a", "b", "c", "d", "e", "f")
	cfg := func(failures int) reconcile.Config {
		return reconcile.Config{Breaker: reconcile.BreakerConfig{Failures: failures, Cooldown: time.Hour, MaxCooldown: 10 * time.Hour},
			Tools: map[string]reconcile.Policy{deadTool: {ProcessingWindow: time.Second, Concurrency: 1, Probe: ds.probe(t)}}}
	}
	run(t, engine(t, db.Pool, cfg(2)), reconcile.Options{})
	if b := readBreaker(t, db, deadTool); b.opens != 1 {
		t.Fatalf("after 2 failures: %+v", b)
	}
	// From now on the database refuses to count a failure: every decision
	// with an unknown verdict fails to commit.
	db.Exec(t, `CREATE FUNCTION refuse_count() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN RAISE EXCEPTION 'test: failure count refused'; END $$`)
	db.Exec(t, `CREATE TRIGGER refuse_count BEFORE UPDATE ON tool_breakers FOR EACH ROW
		WHEN (NEW.consecutive_failures > OLD.consecutive_failures) EXECUTE FUNCTION refuse_count()`)
	endCooldown(t, db, deadTool)
	makeDue(t, db)
	rep := run(t, engine(t, db.Pool, cfg(10)), reconcile.Options{})
	if rep.Actions["write_failed"] != 1 {
		t.Fatalf("actions = %+v, want the trial's decision refused", rep.Actions)
	}
	if n := ds.totalHits(); n != 3 {
		t.Fatalf("%d probes in all, want 3: nothing after the half-open trial's unknown", n)
	}
}
