package reconcile_test

import (
	"testing"
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
	"github.com/ledgerkeeper/ledgerkeeper/reconcile"
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
