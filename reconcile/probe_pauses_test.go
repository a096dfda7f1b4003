package reconcile_test

import (
	"strings"
	"testing"
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
	"github.com/ledgerkeeper/ledgerkeeper/reconcile"
	"github.com/ledgerkeeper/ledgerkeeper/store"
)

// A downstream's Retry-After pauses its tool's probing, and the engine says
// so, with the pause's end, for that tool only (the console shows it).
func TestProbePausesNameThePausedToolAndItsEnd(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	throttled := newPoliteAPI(t, 0, 0)
	throttled.throttle = func(int, string) string { return "120" }
	quiet := newPoliteAPI(t, 0, 0)
	stuckMany(t, db, "tickets", 3)
	stuckMany(t, db, "refunds", 3)
	e, _ := politeEngine(t, db, reconcile.Config{MaxDuration: 20 * time.Second, Tools: map[string]reconcile.Policy{
		"tickets": {Probe: throttled.probe(t), SelfCheckDisabled: true, Concurrency: 1},
		"refunds": {Probe: quiet.probe(t), SelfCheckDisabled: true, Concurrency: 1},
	}})
	if p := e.ProbePauses(); len(p) != 0 {
		t.Fatalf("pauses before any probe: %v", p)
	}
	start := time.Now()
	run(t, e, reconcile.Options{})
	p := e.ProbePauses()
	until, ok := p["tickets"]
	if !ok || len(p) != 1 {
		t.Fatalf("pauses %v, want tickets only", p)
	}
	if lo, hi := start.Add(119*time.Second), time.Now().Add(121*time.Second); until.Before(lo) || until.After(hi) {
		t.Errorf("tickets paused until %v, want about 2 minutes after the 429 (%v-%v)", until, lo, hi)
	}
}

// A downstream's Retry-After answers every replica: after one replica's
// probe is told to wait two minutes, another replica's pass over the same
// ledger probes nothing of that tool (the downstream sees no request from
// it), says why in its report, and the pause is in the ledger for the
// console; the other tool is probed as usual.
func TestAPauseOneReplicaWasAskedForHoldsEveryReplica(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	throttled := newPoliteAPI(t, 0, 0)
	throttled.throttle = func(int, string) string { return "120" }
	quiet := newPoliteAPI(t, 0, 0)
	stuckMany(t, db, "tickets", 6)
	stuckMany(t, db, "refunds", 2)
	cfg := func() reconcile.Config {
		return reconcile.Config{MaxDuration: 20 * time.Second, Tools: map[string]reconcile.Policy{
			"tickets": {Probe: throttled.probe(t), SelfCheckDisabled: true, Concurrency: 1},
			"refunds": {Probe: quiet.probe(t), SelfCheckDisabled: true, Concurrency: 1},
		}}
	}
	a, _ := politeEngine(t, db, cfg())
	b, _ := politeEngine(t, db, cfg())
	run(t, a, reconcile.Options{Tools: []string{"tickets"}})
	asked, _, _ := throttled.snapshot()
	if len(asked) != 1 {
		t.Fatalf("replica a sent %d requests to the throttling downstream, want 1 (then paused)", len(asked))
	}
	pauses, err := store.ProbePauses(t.Context(), db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	if until, ok := pauses["tickets"]; !ok || time.Until(until) < 100*time.Second || len(pauses) != 1 {
		t.Fatalf("the ledger's probe pauses: %v, want tickets for about two minutes", pauses)
	}
	rep := run(t, b, reconcile.Options{})
	if after, _, _ := throttled.snapshot(); len(after) != 1 {
		t.Errorf("replica b sent %d requests to the downstream that asked to wait", len(after)-1)
	}
	if tr := toolReport(t, rep, "tickets"); !strings.Contains(tr.Note, "Retry-After") {
		t.Errorf("replica b's report on tickets: %q, want the pause said", tr.Note)
	}
	if p := b.ProbePauses(); p["tickets"].IsZero() {
		t.Errorf("replica b does not know the pause: %v", p)
	}
	if got, _, _ := quiet.snapshot(); len(got) != 2 {
		t.Errorf("the other tool's downstream got %d requests, want its 2 keys probed", len(got))
	}
	if n := db.Count(t, "reconcile_audit WHERE tool = 'tickets'"); n != 0 {
		t.Errorf("%d audit rows for the paused tool: a pause decides nothing", n)
	}
}
