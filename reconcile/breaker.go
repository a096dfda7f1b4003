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

// breakerState is a tool's persisted circuit breaker, shared by replicas.
type breakerState struct {
	Opens     int
	OpenUntil *time.Time
	LastError *string
	Now       time.Time // the database's clock when read
}

func loadBreaker(ctx context.Context, db ledger.DBTX, tool string) (breakerState, error) {
	var b breakerState
	err := db.QueryRow(ctx, `SELECT coalesce(opens, 0), open_until, last_error, now()
		FROM (SELECT 1) one LEFT JOIN tool_breakers ON tool = $1`, tool).Scan(&b.Opens, &b.OpenUntil, &b.LastError, &b.Now)
	if err != nil {
		return b, fmt.Errorf("read circuit breaker of tool %q: %w", tool, err)
	}
	return b, nil
}

// Breaker is a tool's circuit breaker as `status` shows it.
type Breaker struct {
	Tool      string     `json:"tool"`
	Opens     int        `json:"opens"`
	OpenUntil *time.Time `json:"open_until,omitempty"`
	Open      bool       `json:"open"`
	LastError string     `json:"last_error,omitempty"`
}

// Breakers lists tools whose breaker has opened and not closed since.
func Breakers(ctx context.Context, db ledger.DBTX) ([]Breaker, error) {
	rows, err := db.Query(ctx, `SELECT tool, opens, open_until, coalesce(open_until > now(), false), coalesce(last_error, '')
		FROM tool_breakers WHERE opens > 0 ORDER BY tool`)
	if err != nil {
		return nil, fmt.Errorf("list circuit breakers: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[Breaker])
	if err != nil {
		return nil, fmt.Errorf("list circuit breakers: %w", err)
	}
	return out, nil
}

// breakerOpened is what openBreakerTx wrote.
type breakerOpened struct {
	until time.Time
	opens int
	err   string
}

// openBreakerTx persists the open breaker (cooldown doubling per re-open)
// and raises one downstream_unreachable alert for the tool, inside the
// transaction of the decision that tripped it.
func (t *toolRun) openBreakerTx(ctx context.Context, tx pgx.Tx, lastErr string) (breakerOpened, error) {
	cfg := t.p.e.cfg
	t.mu.Lock()
	consecutive := t.consecutive
	t.mu.Unlock()
	b := breakerOpened{err: lastErr}
	err := tx.QueryRow(ctx, `INSERT INTO tool_breakers AS b (tool, consecutive_failures, opens, open_until, last_error, updated_at)
		VALUES ($1, $2, 1, now() + $3::interval, $4, now())
		ON CONFLICT (tool) DO UPDATE SET
			consecutive_failures = excluded.consecutive_failures,
			opens = b.opens + 1,
			open_until = now() + least($3::interval * power(2, least(b.opens, 20)), $5::interval),
			last_error = excluded.last_error,
			updated_at = now()
		RETURNING open_until, opens`, t.tool, consecutive, cfg.BreakerCooldown, lastErr, cfg.BreakerMaxCooldown).Scan(&b.until, &b.opens)
	if err != nil {
		return b, fmt.Errorf("open circuit breaker of tool %q: %w", t.tool, err)
	}
	_, err = alerts.Raise(ctx, tx, alerts.Alert{
		Reason: alerts.ReasonDownstreamUnreachable, Tool: t.tool,
		Details: alerts.Details{LastError: lastErr, Attempts: consecutive,
			Note: fmt.Sprintf("%d consecutive probes failed; probing %s paused until %s", consecutive, t.tool, b.until.UTC().Format(time.RFC3339))},
	}, cfg.RenotifyAfter)
	return b, err
}

// breakerOpened notes, after the commit, what openBreakerTx wrote.
func (t *toolRun) breakerOpened(b breakerOpened) {
	t.mu.Lock()
	t.openUntil = &b.until
	t.note = fmt.Sprintf("circuit breaker opened after %d consecutive failed probes; paused until %s", t.consecutive, b.until.UTC().Format(time.RFC3339))
	t.mu.Unlock()
	t.p.e.logger.Warn("circuit breaker opened", "tool", t.tool, "open_until", b.until, "opens", b.opens, "err", b.err)
	if t.p.e.metrics != nil {
		t.p.e.metrics.breakerOpened(t.tool)
	}
}

// closeBreaker closes a breaker that had opened, after a conclusive verdict,
// and resolves its alert.
func (t *toolRun) closeBreaker(ctx context.Context) {
	t.mu.Lock()
	if !t.halfOpen {
		t.mu.Unlock()
		return
	}
	t.halfOpen = false
	t.mu.Unlock()
	err := pgx.BeginFunc(ctx, t.p.e.pool, func(tx pgx.Tx) error {
		var one int
		err := tx.QueryRow(ctx, `UPDATE tool_breakers SET opens = 0, open_until = NULL, consecutive_failures = 0, updated_at = now()
			WHERE tool = $1 AND opens > 0 RETURNING 1`, t.tool).Scan(&one)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		if err != nil {
			return err
		}
		_, err = alerts.ResolveTool(ctx, tx, t.tool, "probes answer again: circuit breaker closed")
		return err
	})
	if err != nil {
		t.p.e.logger.Error("close circuit breaker", "tool", t.tool, "err", err)
		return
	}
	t.p.e.logger.Info("circuit breaker closed", "tool", t.tool)
}

// sweepAlerts resolves the open per-key alerts whose key has settled since
// (the original attempt completed it, an operator resolved it, a retry
// re-claimed it, or it is gone), so on-call hears that it is over.
func (e *Engine) sweepAlerts(ctx context.Context) (int, error) {
	return e.sweepSettled(ctx, e.pool)
}

// explainUntouched reports, for each --key the pass did not decide, why:
// an operator asking for a key deserves more than "no due keys".
func (p *pass) explainUntouched(ctx context.Context) {
	done := map[string]bool{}
	for _, k := range p.report.Keys {
		done[k.Key] = true
	}
	for _, k := range p.report.Skipped {
		done[k.Key] = true
	}
	for _, key := range p.opts.Keys {
		if done[key] {
			continue
		}
		k, err := ledger.Get(ctx, p.e.pool, key)
		if err != nil {
			continue
		}
		win, hb := p.e.Windows(k.Tool)
		why := "not due"
		var inWindow, beating, leased, held bool
		err = p.e.pool.QueryRow(ctx, `SELECT k.claimed_at > now() - $2::interval,
				coalesce(k.heartbeat_at > now() - $3::interval, false),
				coalesce((SELECT s.lease_expires_at > now() FROM reconcile_state s WHERE s.key = k.key AND s.claimed_at = k.claimed_at), false),
				EXISTS (SELECT 1 FROM key_holds h WHERE h.key = k.key)
			FROM idempotency_keys k WHERE k.key = $1`, key, win, hb).Scan(&inWindow, &beating, &leased, &held)
		switch {
		case err != nil:
		case k.Status != ledger.StatusProcessing:
			why = "status is " + k.Status + ": nothing to reconcile"
		case held:
			why = "on hold: release it first"
		case inWindow:
			why = fmt.Sprintf("in flight: claimed less than its window + grace (%s) ago", win)
		case beating:
			why = "in flight: heartbeating"
		case leased:
			why = "leased by another reconciler right now"
		case p.breakerOpen(k.Tool):
			why = "its tool's circuit breaker is open"
		}
		p.report.Skipped = append(p.report.Skipped, KeyResult{Key: key, Tool: k.Tool, Action: why})
	}
}

func (p *pass) breakerOpen(tool string) bool {
	for _, t := range p.report.Tools {
		if t.Tool == tool {
			return t.BreakerOpen
		}
	}
	return false
}
