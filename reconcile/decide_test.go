package reconcile_test

import (
	"encoding/json"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/alerts"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/probes"
	"github.com/ledgerkeeper/ledgerkeeper/reconcile"
	"github.com/ledgerkeeper/ledgerkeeper/store"
)

// The decision table of the package documentation, row by row, against the
// pure Decide: no database, no clock. Boundaries are exact (now is pinned).
func TestDecideTable(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	ago := func(d time.Duration) *time.Time { x := now.Add(-d); return &x }
	probe := probes.ProbeFunc(nil) // only its presence matters to Decide
	rules := reconcile.Rules{AlertAfterAttempts: 3, AlertAfterAge: time.Hour, BackoffBase: 30 * time.Second, BackoffMax: 30 * time.Minute}
	found := probes.Result{Verdict: probes.Found, Outcome: &probes.Outcome{Code: 201, Body: json.RawMessage(`{"ticket_id":"T-1"}`)}}
	notFound := probes.Result{Verdict: probes.NotFound}
	unknown := probes.Result{Verdict: probes.Unknown, Err: errors.New("503")}
	dup := probes.Result{Verdict: probes.Duplicate, Err: errors.New("2 effects")}

	type row struct {
		name       string
		res        probes.Result
		noProbe    bool
		attempts   int           // before this decision
		created    time.Duration // key age since first use
		claimed    time.Duration // since the current claim
		firstNF    *time.Time    // a not_found awaiting confirmation
		dedup      time.Duration
		confirm    time.Duration
		wantAction string
		wantTo     string // transition
		wantAlerts []alerts.Reason
		wantNext   time.Duration // NextProbeIn (jitter 1)
		conclusive bool
	}
	rows := []row{
		{name: "found completes", res: found, wantAction: reconcile.ActionCompleted, wantTo: ledger.StatusCompleted, conclusive: true},
		{name: "not_found marks retryable", res: notFound, wantAction: reconcile.ActionMarkedRetryable, wantTo: ledger.StatusFailedRetryable, conclusive: true},
		{name: "not_found at exactly the dedup window still marks retryable", res: notFound, created: time.Hour, dedup: time.Hour,
			wantAction: reconcile.ActionMarkedRetryable, wantTo: ledger.StatusFailedRetryable, conclusive: true},
		{name: "not_found a second past the dedup window escalates", res: notFound, created: time.Hour + time.Second, claimed: time.Minute, dedup: time.Hour,
			wantAction: reconcile.ActionEscalatedDedup, wantAlerts: []alerts.Reason{alerts.ReasonDedupWindowPassed}, wantNext: 30 * time.Second, conclusive: true},
		{name: "dedup window measured from first use, not the re-claim", res: notFound, created: 2 * time.Hour, claimed: time.Minute, dedup: time.Hour,
			wantAction: reconcile.ActionEscalatedDedup, wantAlerts: []alerts.Reason{alerts.ReasonDedupWindowPassed}, wantNext: 30 * time.Second, conclusive: true},
		{name: "first not_found awaits confirmation", res: notFound, confirm: time.Hour,
			wantAction: reconcile.ActionAwaitingConfirmation, wantNext: time.Hour, conclusive: true},
		{name: "second not_found before the wait waits the rest", res: notFound, confirm: time.Hour, firstNF: ago(20 * time.Minute),
			wantAction: reconcile.ActionAwaitingConfirmation, wantNext: 40 * time.Minute, conclusive: true},
		{name: "second not_found at exactly the wait confirms", res: notFound, confirm: time.Hour, firstNF: ago(time.Hour),
			wantAction: reconcile.ActionMarkedRetryable, wantTo: ledger.StatusFailedRetryable, conclusive: true},
		{name: "duplicate alerts at once", res: dup, wantAction: reconcile.ActionDuplicate, wantAlerts: []alerts.Reason{alerts.ReasonDuplicate}, wantNext: 30 * time.Second, conclusive: true},
		{name: "unknown backs off", res: unknown, attempts: 0, wantAction: reconcile.ActionBackoff, wantNext: 30 * time.Second},
		{name: "unknown backs off exponentially", res: unknown, attempts: 1, wantAction: reconcile.ActionBackoff, wantNext: time.Minute},
		{name: "unknown at alert_after_attempts alerts", res: unknown, attempts: 2, wantAction: reconcile.ActionBackoff,
			wantAlerts: []alerts.Reason{alerts.ReasonProbeFailing}, wantNext: 2 * time.Minute},
		{name: "unknown at alert_after_age alerts", res: unknown, claimed: time.Hour, created: time.Hour, wantAction: reconcile.ActionBackoff,
			wantAlerts: []alerts.Reason{alerts.ReasonProbeFailing}, wantNext: 30 * time.Second},
		{name: "unknown back-off is capped", res: unknown, attempts: 20, wantAction: reconcile.ActionBackoff,
			wantAlerts: []alerts.Reason{alerts.ReasonProbeFailing}, wantNext: 30 * time.Minute},
		{name: "no probe backs off without alerting", noProbe: true, res: unknown, wantAction: reconcile.ActionNoProbe, wantNext: 30 * time.Second},
		{name: "no probe alerts past the attempts", noProbe: true, res: unknown, attempts: 2, wantAction: reconcile.ActionNoProbe,
			wantAlerts: []alerts.Reason{alerts.ReasonNoProbe}, wantNext: 2 * time.Minute},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			t.Parallel()
			pol := reconcile.Policy{Probe: probe, DownstreamDedupWindow: r.dedup}
			if r.noProbe {
				pol.Probe = nil
			}
			created, claimed := r.created, r.claimed
			if claimed == 0 {
				claimed = time.Minute
			}
			created = max(created, claimed)
			l := store.Leased{Key: ledger.Key{Key: "k", Tool: "create_ticket", CreatedAt: now.Add(-created), ClaimedAt: now.Add(-claimed),
				ExpiresAt: now.Add(24 * time.Hour)}, Attempts: r.attempts, FirstNotFoundAt: r.firstNF}
			rr := rules
			rr.ConfirmNotFoundAfter = r.confirm
			in := reconcile.Input{Leased: l, Result: r.res, Policy: pol, Rules: rr, Now: now, Jitter: 1}
			if r.res.Err != nil {
				in.ErrText = r.res.Err.Error()
			}
			pl := reconcile.Decide(in)
			d := pl.Decision
			if d.Action != r.wantAction || d.Transition != r.wantTo {
				t.Fatalf("action %q transition %q, want %q %q", d.Action, d.Transition, r.wantAction, r.wantTo)
			}
			var got []alerts.Reason
			for _, a := range pl.Raise {
				got = append(got, a.Reason)
			}
			if !slices.Equal(got, r.wantAlerts) {
				t.Fatalf("alerts %v, want %v", got, r.wantAlerts)
			}
			if d.NextProbeIn != r.wantNext {
				t.Fatalf("next probe in %s, want %s", d.NextProbeIn, r.wantNext)
			}
			if pl.Conclusive != r.conclusive {
				t.Fatalf("conclusive = %v, want %v", pl.Conclusive, r.conclusive)
			}
			if !d.CountAttempt || !d.CheckHeartbeat || !d.ClaimedAt.Equal(l.ClaimedAt) {
				t.Fatalf("decision not conditional on the probed claim: %+v", d)
			}
			if (d.Transition == ledger.StatusCompleted) != (d.ResponseCode == 201) {
				t.Fatalf("outcome %d with transition %q", d.ResponseCode, d.Transition)
			}
			if d.Action == reconcile.ActionAwaitingConfirmation && !d.NotFoundSeen {
				t.Fatal("awaiting confirmation without recording the not_found")
			}
			if r.noProbe && d.Verdict != "no_probe" {
				t.Fatalf("verdict %q for a tool without a probe", d.Verdict)
			}
		})
	}
}
