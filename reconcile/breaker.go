package reconcile

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerkeeper/ledgerkeeper/alerts"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
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

// breakerState is a tool's persisted circuit breaker.
type breakerState struct {
	Consecutive int
	Opens       int
	OpenUntil   *time.Time
	TrialUntil  *time.Time
	Now         time.Time // the database's clock when read
}

func (b breakerState) open() bool { return b.OpenUntil != nil && b.OpenUntil.After(b.Now) }

// halfOpen: it has opened and its cooldown is over.
func (b breakerState) halfOpen() bool { return b.Opens > 0 && !b.open() }

func loadBreaker(ctx context.Context, db ledger.DBTX, tool string) (breakerState, error) {
	var b breakerState
	err := db.QueryRow(ctx, `SELECT coalesce(consecutive_failures, 0), coalesce(opens, 0), open_until, trial_until, now()
		FROM (SELECT 1) one LEFT JOIN tool_breakers ON tool = $1`, tool).Scan(&b.Consecutive, &b.Opens, &b.OpenUntil, &b.TrialUntil, &b.Now)
	if err != nil {
		return b, fmt.Errorf("read circuit breaker of tool %q: %w", tool, err)
	}
	return b, nil
}

// claimTrial makes this pass the one that sends a half-open breaker's trial
// probe; false when another replica's trial is under way.
func claimTrial(ctx context.Context, db ledger.DBTX, tool string, lease time.Duration) (bool, error) {
	tag, err := db.Exec(ctx, `UPDATE tool_breakers SET trial_until = now() + $2::interval, updated_at = now()
		WHERE tool = $1 AND opens > 0 AND open_until <= now() AND (trial_until IS NULL OR trial_until <= now())`, tool, lease)
	if err != nil {
		return false, fmt.Errorf("claim the half-open trial of tool %q: %w", tool, err)
	}
	return tag.RowsAffected() == 1, nil
}

// Breaker is a tool's circuit breaker as `status` shows it.
type Breaker struct {
	Tool        string     `json:"tool"`
	Opens       int        `json:"opens"`
	OpenUntil   *time.Time `json:"open_until,omitempty"`
	Open        bool       `json:"open"`
	LastError   string     `json:"last_error,omitempty"`
	Consecutive int        `json:"consecutive_failures"`
}

// Breakers lists tools whose breaker has opened and not closed since, or
// that are counting failures towards opening it.
func Breakers(ctx context.Context, db ledger.DBTX) ([]Breaker, error) {
	rows, err := db.Query(ctx, `SELECT tool, opens, open_until, coalesce(open_until > now(), false), coalesce(last_error, ''), consecutive_failures
		FROM tool_breakers WHERE opens > 0 OR consecutive_failures > 0 ORDER BY tool`)
	if err != nil {
		return nil, fmt.Errorf("list circuit breakers: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[Breaker])
	if err != nil {
		return nil, fmt.Errorf("list circuit breakers: %w", err)
	}
	return out, nil
}

// verdictCount is what one transaction tells a tool's breaker.
type verdictCount struct {
	tool       string
	conclusive bool // at least one conclusive verdict: the count restarts
	unknowns   int  // unknown verdicts (after the conclusive ones)
	lastErr    string
}

// breakerChange is what countVerdicts did.
type breakerChange struct {
	opened bool // this transaction opened (or re-opened) it
	closed bool // this transaction closed it
	open   bool // it is open after this transaction
	until  time.Time
	opens  int
	count  int // consecutive failures after this transaction
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
		var opens int
		err := tx.QueryRow(ctx, `SELECT opens FROM tool_breakers
			WHERE tool = $1 AND (consecutive_failures > 0 OR opens > 0) FOR UPDATE`, vc.tool).Scan(&opens)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
		case err != nil:
			return ch, fmt.Errorf("read circuit breaker of tool %q: %w", vc.tool, err)
		default:
			if _, err := tx.Exec(ctx, `UPDATE tool_breakers SET consecutive_failures = 0, opens = 0, open_until = NULL,
				trial_until = NULL, updated_at = now() WHERE tool = $1`, vc.tool); err != nil {
				return ch, fmt.Errorf("reset circuit breaker of tool %q: %w", vc.tool, err)
			}
			if opens > 0 {
				ch.closed = true
				if _, err := alerts.ResolveToolReason(ctx, tx, vc.tool, alerts.ReasonDownstreamUnreachable,
					"probes answer again: circuit breaker closed"); err != nil {
					return ch, err
				}
			}
		}
	}
	if vc.unknowns == 0 {
		return ch, nil
	}
	var b breakerState
	err := tx.QueryRow(ctx, `INSERT INTO tool_breakers AS b (tool, consecutive_failures, last_error, updated_at)
		VALUES ($1, $2, $3, now())
		ON CONFLICT (tool) DO UPDATE SET consecutive_failures = b.consecutive_failures + excluded.consecutive_failures,
			last_error = excluded.last_error, updated_at = now()
		RETURNING consecutive_failures, opens, open_until, now()`, vc.tool, vc.unknowns, vc.lastErr).
		Scan(&b.Consecutive, &b.Opens, &b.OpenUntil, &b.Now)
	if err != nil {
		return ch, fmt.Errorf("count failures of tool %q: %w", vc.tool, err)
	}
	ch.count = b.Consecutive
	if b.open() {
		ch.open, ch.until, ch.opens = true, *b.OpenUntil, b.Opens
		return ch, nil
	}
	threshold := cfg.BreakerFailures
	if b.Opens > 0 {
		threshold = 1 // half-open: the trial failed
	}
	if b.Consecutive < threshold {
		return ch, nil
	}
	// Cooldown doubles per re-open: cooldown * 2^(opens so far), capped.
	err = tx.QueryRow(ctx, `UPDATE tool_breakers SET opens = opens + 1, trial_until = NULL,
			open_until = now() + least($2::interval * power(2, least(opens, 20)), $3::interval), updated_at = now()
		WHERE tool = $1 RETURNING open_until, opens`, vc.tool, cfg.BreakerCooldown, cfg.BreakerMaxCooldown).Scan(&ch.until, &ch.opens)
	if err != nil {
		return ch, fmt.Errorf("open circuit breaker of tool %q: %w", vc.tool, err)
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
