package reconcile

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/alerts"
	"github.com/ledgerkeeper/ledgerkeeper/internal/backoff"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/probes"
	"github.com/ledgerkeeper/ledgerkeeper/store"
)

// Rules are the engine-wide settings a decision depends on.
type Rules struct {
	AlertAfterAttempts   int
	AlertAfterAge        time.Duration
	ConfirmNotFoundAfter time.Duration
	BackoffBase          time.Duration
	BackoffMax           time.Duration
}

// Input is everything one decision depends on. Decide reads nothing else:
// no database, no clock, no randomness, so the decision table of the package
// documentation is this function, row by row.
type Input struct {
	// Leased is the key as it was leased: its claim, attempts so far and
	// first not_found awaiting confirmation.
	Leased store.Leased
	// Result is the probe's answer (Guard-checked). Ignored without a probe.
	Result probes.Result
	// ErrText is Result.Err as it may be stored: redacted and clipped.
	ErrText string
	// Policy is the key's tool's policy; Policy.Probe nil means no probe.
	Policy Policy
	Rules  Rules
	// Now is the database's clock now.
	Now time.Time
	// Jitter multiplies back-off delays (the runner draws it from
	// [0.9, 1.1] so replicas do not probe in step); 0 means 1.
	Jitter float64
}

// Plan is a decision: the compare-and-set write for the ledger (without its
// owner and actor, which the runner fills in), the alerts it raises, and
// what ends the key's open alerts if it applies.
type Plan struct {
	Decision store.Decision
	// Raise lists the alerts to raise with the decision. probe_failing is
	// dropped at write time if the tool's breaker is open then.
	Raise []alerts.Alert
	// ResolveHow, when set, resolves the key's open alerts with this text.
	ResolveHow string
	// Conclusive: the verdict says something about the downstream (the
	// breaker's count restarts); unknown and no probe are not.
	Conclusive bool
	// Resolve: the key may have open alerts (decided before, or expired
	// and alerted by purge), so resolving them is worth a statement.
	Resolve bool
	// Age is the key's age since its claim.
	Age time.Duration
}

// errNoProbe is the error of a key whose tool has no probe.
var errNoProbe = fmt.Errorf("no probe configured for this tool")

// Decide turns one probe's answer into a decision; see the decision table
// in the package documentation.
func Decide(in Input) Plan {
	l, res, pol, rules := in.Leased, in.Result, in.Policy, in.Rules
	age := in.Now.Sub(l.ClaimedAt)
	d := store.Decision{
		Key: l.Key.Key, Tool: l.Tool, ClaimedAt: l.ClaimedAt,
		Verdict: string(res.Verdict), Evidence: res.Evidence, Error: in.ErrText, CountAttempt: true,
		CheckHeartbeat: true, LeasedHeartbeatAt: l.HeartbeatAt,
	}
	attemptsAfter := l.Attempts + 1
	backoff := func() time.Duration {
		// base * 2^(attempts-1), capped, jittered.
		return backoff.Delay(rules.BackoffBase, rules.BackoffMax, attemptsAfter-1, in.Jitter)
	}
	pl := Plan{Conclusive: true, Age: age, Resolve: l.Attempts > 0 || !l.ExpiresAt.After(in.Now)}
	details := alerts.Details{Attempts: attemptsAfter, ClaimedAt: &l.ClaimedAt, CreatedAt: &l.CreatedAt, Verdict: string(res.Verdict), LastError: d.Error}
	alert := func(r alerts.Reason) {
		pl.Raise = append(pl.Raise, alerts.Alert{Reason: r, Tool: l.Tool, Key: l.Key.Key, Details: details})
	}
	overdue := attemptsAfter >= rules.AlertAfterAttempts || age >= rules.AlertAfterAge

	switch {
	case pol.Probe == nil:
		pl.Conclusive = false
		d.Verdict, d.Action, d.NextProbeIn = "no_probe", ActionNoProbe, backoff()
		d.Evidence = nil
		if d.Error == "" {
			d.Error = errNoProbe.Error()
			details.LastError = d.Error
		}
		details.Verdict = "no_probe"
		if overdue {
			alert(alerts.ReasonNoProbe)
		}
	case res.Verdict == probes.Found:
		d.Transition, d.Action = ledger.StatusCompleted, ActionCompleted
		d.ResponseCode, d.ResponseBody = res.Outcome.Code, res.Outcome.Body
		if d.ResponseBody == nil {
			d.ResponseBody = json.RawMessage("null")
		}
		pl.ResolveHow = "completed by the reconciler (effect found downstream)"
	case res.Verdict == probes.NotFound:
		// The downstream's horizon starts with the key's first use: the
		// conservative end when a retry re-claimed it since.
		keyAge := in.Now.Sub(l.CreatedAt)
		switch {
		case pol.DownstreamDedupWindow > 0 && keyAge > pol.DownstreamDedupWindow:
			// A wrong not_found could no longer be caught downstream.
			d.Action, d.NextProbeIn = ActionEscalatedDedup, backoff()
			details.Note = fmt.Sprintf("key is %s old, past the downstream's dedup window of %s", keyAge.Round(time.Second), pol.DownstreamDedupWindow)
			alert(alerts.ReasonDedupWindowPassed)
		case rules.ConfirmNotFoundAfter > 0 && (l.FirstNotFoundAt == nil || in.Now.Sub(*l.FirstNotFoundAt) < rules.ConfirmNotFoundAfter):
			d.Action, d.NotFoundSeen = ActionAwaitingConfirmation, true
			wait := rules.ConfirmNotFoundAfter
			if l.FirstNotFoundAt != nil {
				wait -= in.Now.Sub(*l.FirstNotFoundAt)
			}
			d.NextProbeIn = max(wait, time.Second)
		default:
			d.Transition, d.Action = ledger.StatusFailedRetryable, ActionMarkedRetryable
			pl.ResolveHow = "marked failed_retryable by the reconciler (effect not found downstream)"
		}
	case res.Verdict == probes.Duplicate:
		d.Action, d.NextProbeIn = ActionDuplicate, backoff()
		alert(alerts.ReasonDuplicate)
	default: // unknown
		pl.Conclusive = false
		d.Action, d.NextProbeIn = ActionBackoff, backoff()
		if overdue {
			alert(alerts.ReasonProbeFailing)
		}
	}
	pl.Decision = d
	return pl
}
