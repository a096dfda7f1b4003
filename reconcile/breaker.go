package reconcile

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerkeeper/ledgerkeeper/alerts"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/store"
)

// The circuit breaker of a tool lives in tool_breakers, shared by passes and
// replicas:
//
//	closed     opens = 0; consecutive_failures counts unknown verdicts
//	           since the last conclusive one, in the decisions' own
//	           transactions; at breaker.failures it opens
//	open       open_until > now(): nobody probes the tool
//	half-open  opens > 0, open_until passed: the replica that sets
//	           trial_until sends one probe (or one self-check); unknown
//	           re-opens it with the cooldown doubled (up to max_cooldown),
//	           conclusive closes it and resolves its alert
//
// Only unknown verdicts of a tool that has a probe count: no_probe is not a
// probe failure.

// Breaker is a tool's circuit breaker as `status` shows it.
type Breaker = store.Breaker

// Breakers lists tools whose breaker has opened and not closed since, or
// that are counting failures towards opening it.
func Breakers(ctx context.Context, db ledger.DBTX) ([]Breaker, error) {
	return store.Breakers(ctx, db)
}

// breakerCount is what the breaker's opening rule reads: the unknown
// verdicts since the last conclusive one, and whether the breaker has
// opened before and not closed since (half-open). The database's row is
// judged by it in the decisions' transactions (countVerdicts), and a pass's
// own count by it as verdicts come (toolRun.recordVerdict), so that the two
// never disagree on when the breaker opens.
type breakerCount struct {
	consecutive int
	halfOpen    bool
}

// breakerThreshold is how many consecutive unknown verdicts open a tool's
// breaker: breaker.failures, or one when half-open (its trial failed).
func breakerThreshold(failures int, halfOpen bool) int {
	if halfOpen {
		return 1
	}
	return failures
}

// opens reports whether the count opens the breaker.
func (c breakerCount) opens(failures int) bool {
	return c.consecutive >= breakerThreshold(failures, c.halfOpen)
}

// after is the count after one more verdict, and whether that verdict
// opens the breaker: a conclusive one restarts the count and closes a
// half-open breaker, an unknown one adds to it.
func (c breakerCount) after(conclusive bool, failures int) (breakerCount, bool) {
	if conclusive {
		return breakerCount{}, false
	}
	c.consecutive++
	return c, c.opens(failures)
}

// verdictCount is what one transaction tells a tool's breaker.
type verdictCount struct {
	tool       string
	conclusive bool // at least one conclusive verdict: the count restarts
	unknowns   int  // unknown verdicts after the last conclusive one
	lastErr    string
}

// add counts the transaction's next verdict, in the order of its plans: a
// conclusive one restarts the count (the unknowns before it are answered
// by it), so only the unknowns after the last conclusive one are added to
// the breaker's count.
func (vc *verdictCount) add(conclusive bool, errText string) {
	if conclusive {
		vc.conclusive, vc.unknowns, vc.lastErr = true, 0, ""
		return
	}
	vc.unknowns++
	vc.lastErr = errText
}

// breakerChange is what countVerdicts did.
type breakerChange struct {
	opened bool // this transaction opened (or re-opened) it
	closed bool // this transaction closed it
	open   bool // it is open after this transaction
	until  time.Time
	opens  int
	count  int // consecutive failures after this transaction
	// resolved counts the alerts it resolved (downstream_unreachable).
	resolved int
}

// countVerdicts applies a transaction's verdicts to the tool's breaker,
// inside that transaction: the count and the decisions commit together, so
// a crash can neither count a decision twice nor lose it. A tool whose
// breaker is closed and counting nothing is not touched (no row lock), so
// healthy tools' writers never wait on each other here.
func (e *Engine) countVerdicts(ctx context.Context, tx pgx.Tx, vc verdictCount) (breakerChange, error) {
	var ch breakerChange
	cfg := e.cfg
	if vc.conclusive {
		closed, err := store.ResetBreaker(ctx, tx, vc.tool)
		if err != nil {
			return ch, err
		}
		if closed {
			ch.closed = true
			n, err := alerts.ResolveToolReason(ctx, tx, vc.tool, alerts.ReasonDownstreamUnreachable,
				"probes answer again: circuit breaker closed")
			if err != nil {
				return ch, err
			}
			ch.resolved = n
		}
	}
	if vc.unknowns == 0 {
		return ch, nil
	}
	b, err := store.CountBreakerFailures(ctx, tx, vc.tool, vc.unknowns, vc.lastErr)
	if err != nil {
		return ch, err
	}
	ch.count = b.Consecutive
	if b.Open() {
		ch.open, ch.until, ch.opens = true, *b.OpenUntil, b.Opens
		return ch, nil
	}
	// Not open (returned above): opens > 0 is half-open, the trial failed.
	if !(breakerCount{consecutive: b.Consecutive, halfOpen: b.HalfOpen()}).opens(cfg.Breaker.Failures) {
		return ch, nil
	}
	if ch.until, ch.opens, err = store.OpenBreaker(ctx, tx, vc.tool, cfg.Breaker.Cooldown, cfg.Breaker.MaxCooldown); err != nil {
		return ch, err
	}
	ch.opened, ch.open = true, true
	// One alert per outage: a re-open while the first is unresolved is
	// de-duplicated by alert_state.
	_, err = alerts.Raise(ctx, tx, alerts.Alert{
		Reason: alerts.ReasonDownstreamUnreachable, Tool: vc.tool,
		Details: alerts.Details{LastError: vc.lastErr, Attempts: b.Consecutive,
			Note: fmt.Sprintf("%d consecutive probes failed; probing %s paused until %s", b.Consecutive, vc.tool, ch.until.UTC().Format(time.RFC3339))},
	}, cfg.RenotifyAfter)
	return ch, err
}

// sweepAlerts resolves the open per-key alerts whose key has settled since
// (the original attempt completed it, an operator resolved it, a retry
// re-claimed it, or it is gone), so on-call hears that it is over.
func (e *Engine) sweepAlerts(ctx context.Context) (int, error) {
	return e.sweepSettled(ctx, e.pool)
}
