package reconcile_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
	"github.com/ledgerkeeper/ledgerkeeper/ledger/ledgertest/testwait"
	"github.com/ledgerkeeper/ledgerkeeper/reconcile"
)

// stoppedRun reads the pass's ledgerkeeper_runs row: its error and whether
// its stats say stopped.
func stoppedRun(t *testing.T, db *pgtest.DB) (errText *string, stopped bool) {
	t.Helper()
	err := db.Pool.QueryRow(bg, `SELECT error, coalesce((stats->>'stopped')::bool, false)
		FROM ledgerkeeper_runs WHERE kind = 'reconcile' ORDER BY id DESC LIMIT 1`).Scan(&errText, &stopped)
	if err != nil {
		t.Fatal(err)
	}
	return errText, stopped
}

// A graceful stop leases nothing more and starts no probe, but the probes
// in flight finish within the grace and their decisions are written; the
// keys leased and not yet probed are given back untouched; the run is
// recorded as stopped, not failed.
func TestGracefulStopWritesProbesInFlight(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ds := newDownstream(t)
	ds.gate = make(chan struct{})
	ds.entered = make(chan string, 100)
	keys := []string{"k1", "k2", "k3", "k4", "k5"}
	stuck(t, db, "create_ticket", time.Minute, keys...)
	for _, k := range keys {
		ds.addTicket(k, "T-"+k)
	}
	e := engine(t, db.Pool, reconcile.Config{Concurrency: 2, Tools: map[string]reconcile.Policy{
		"create_ticket": {ProcessingWindow: time.Second, Concurrency: 2, Probe: ds.probe(t)}}})
	stop := make(chan struct{})
	type result struct {
		rep reconcile.Report
		err error
	}
	done := make(chan result, 1)
	go func() {
		rep, err := e.Run(bg, reconcile.Options{Stop: stop})
		done <- result{rep, err}
	}()
	inFlight := map[string]bool{}
	for range 2 {
		inFlight[testwait.Recv(t, ds.entered, testwait.Timeout)] = true
	}
	close(stop)    // SIGTERM: stop leasing, start nothing
	close(ds.gate) // the downstream answers within the grace
	r := testwait.Recv(t, done, testwait.Timeout)
	if r.err != nil {
		t.Fatalf("a graceful stop is not an error: %v", r.err)
	}
	if !r.rep.Stopped || r.rep.Decided != 2 || r.rep.Actions["completed"] != 2 || r.rep.GivenBack != 3 {
		t.Fatalf("report: stopped=%v decided=%d actions=%v given back %d; want stopped, the 2 in flight completed, the other 3 given back",
			r.rep.Stopped, r.rep.Decided, r.rep.Actions, r.rep.GivenBack)
	}
	for _, k := range keys {
		st := row(t, db, k).Status
		if inFlight[k] != (st == "completed") {
			t.Errorf("%s (in flight %v) is %s", k, inFlight[k], st)
		}
		if !inFlight[k] && ds.hitsOf(k) != 0 {
			t.Errorf("%s was probed after the stop", k)
		}
	}
	if n := db.Count(t, `reconcile_state s JOIN idempotency_keys k USING (key)
		WHERE s.lease_owner IS NOT NULL OR (s.attempts > 0 AND k.status = 'processing')`); n != 0 {
		t.Fatalf("%d keys left leased or with an attempt counted", n)
	}
	if n := db.Count(t, "reconcile_audit"); n != 2 {
		t.Fatalf("audit rows = %d; want the 2 in flight", n)
	}
	if errText, stopped := stoppedRun(t, db); errText != nil || !stopped {
		t.Fatalf("run recorded with error %v, stopped %v; want no error, stopped", errText, stopped)
	}
	// The next pass takes the rest.
	if rep := run(t, e, reconcile.Options{}); rep.Actions["completed"] != 3 || rep.Stopped {
		t.Fatalf("next pass = %+v", rep.Actions)
	}
}

// A probe that outlives the grace (ctx cancelled after the stop) is given
// back: no decision, no attempt counted, no lease left; the run is still
// recorded as stopped.
func TestProbeOutlivingTheGraceIsGivenBack(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ds := newDownstream(t)
	ds.gate = make(chan struct{})
	defer close(ds.gate)
	ds.entered = make(chan string, 100)
	stuck(t, db, "create_ticket", time.Minute, "slow")
	ds.addTicket("slow", "T-1")
	e := engine(t, db.Pool, reconcile.Config{Tools: map[string]reconcile.Policy{
		"create_ticket": {ProcessingWindow: time.Second, Probe: ds.probe(t)}}})
	ctx, cancel := context.WithCancel(bg)
	defer cancel()
	stop := make(chan struct{})
	type result struct {
		rep reconcile.Report
		err error
	}
	done := make(chan result, 1)
	go func() {
		rep, err := e.Run(ctx, reconcile.Options{Stop: stop})
		done <- result{rep, err}
	}()
	testwait.Recv(t, ds.entered, testwait.Timeout)
	close(stop)
	cancel() // the grace ran out with the probe still running
	if r := testwait.Recv(t, done, testwait.Timeout); !errors.Is(r.err, context.Canceled) || r.rep.GivenBack != 1 || r.rep.Decided != 0 {
		t.Fatalf("hard-stopped pass: err %v, given back %d, decided %d; want canceled, 1 given back, none decided", r.err, r.rep.GivenBack, r.rep.Decided)
	}
	if n := db.Count(t, "reconcile_audit"); n != 0 {
		t.Fatalf("a probe cut short was recorded: %d audit rows", n)
	}
	if n := db.Count(t, "reconcile_state WHERE lease_owner IS NOT NULL OR attempts > 0"); n != 0 {
		t.Fatalf("%d keys left leased or with an attempt counted", n)
	}
	if errText, stopped := stoppedRun(t, db); errText != nil || !stopped {
		t.Fatalf("run recorded with error %v, stopped %v; want no error, stopped", errText, stopped)
	}
}

// The pass's log attributes: actions flattened (text logs never print a Go
// map), duration a time.Duration (the daemon's handlers write it in one
// form each: cmd/ledgerkeeper's TestLogDurationsHaveOneForm).
func TestReportLogAttrs(t *testing.T) {
	rep := reconcile.Report{Decided: 3, Actions: map[string]int{"completed": 2, "backoff": 1}, Duration: 1500 * time.Millisecond, Stopped: true, GivenBack: 4}
	var text, js strings.Builder
	slog.New(slog.NewTextHandler(&text, nil)).Info("reconcile pass", rep.LogAttrs()...)
	slog.New(slog.NewJSONHandler(&js, nil)).Info("reconcile pass", rep.LogAttrs()...)
	for _, want := range []string{"keys=3", "actions.backoff=1", "actions.completed=2", "duration=1.5s", "stopped=true", "given_back=4"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("text log lacks %s: %s", want, text.String())
		}
	}
	if strings.Contains(text.String(), "map[") {
		t.Errorf("text log prints a Go map: %s", text.String())
	}
	if !strings.Contains(js.String(), `"actions":{"backoff":1,"completed":2}`) || !strings.Contains(js.String(), `"duration":1500000000`) {
		t.Errorf("JSON log: %s", js.String())
	}
}
