package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
)

// BreakerState is a tool's circuit breaker as stored in tool_breakers and
// shared by every pass and replica (see reconcile's package documentation
// for the states).
type BreakerState struct {
	// Consecutive counts unknown verdicts since the last conclusive one.
	Consecutive int
	// Opens counts openings since the breaker last closed.
	Opens int
	// OpenUntil: nobody probes the tool before it.
	OpenUntil *time.Time
	// TrialUntil: a replica is sending the half-open trial until then.
	TrialUntil *time.Time
	// Now is the database's clock when read.
	Now time.Time
}

// Open reports whether probing is paused.
func (b BreakerState) Open() bool { return b.OpenUntil != nil && b.OpenUntil.After(b.Now) }

// HalfOpen reports whether the breaker has opened and its cooldown is over.
func (b BreakerState) HalfOpen() bool { return b.Opens > 0 && !b.Open() }

// LoadBreaker reads a tool's breaker (all zero when it never counted).
func LoadBreaker(ctx context.Context, db ledger.DBTX, tool string) (BreakerState, error) {
	var b BreakerState
	err := db.QueryRow(ctx, `SELECT coalesce(consecutive_failures, 0), coalesce(opens, 0), open_until, trial_until, now()
		FROM (SELECT 1) one LEFT JOIN tool_breakers ON tool = $1`, tool).Scan(&b.Consecutive, &b.Opens, &b.OpenUntil, &b.TrialUntil, &b.Now)
	return b, wrap(fmt.Sprintf("read circuit breaker of tool %q", tool), err)
}

// ClaimBreakerTrial makes the caller the one that sends a half-open
// breaker's trial probe, for lease; false when another replica's trial is
// under way or the breaker is not half-open.
func ClaimBreakerTrial(ctx context.Context, db ledger.DBTX, tool string, lease time.Duration) (bool, error) {
	tag, err := db.Exec(ctx, `UPDATE tool_breakers SET trial_until = now() + $2::interval, updated_at = now()
		WHERE tool = $1 AND opens > 0 AND open_until <= now() AND (trial_until IS NULL OR trial_until <= now())`, tool, lease)
	if err != nil {
		return false, wrap(fmt.Sprintf("claim the half-open trial of tool %q", tool), err)
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
		return nil, wrap("list circuit breakers", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[Breaker])
	return out, wrap("list circuit breakers", err)
}

// ResetBreaker records a conclusive verdict inside tx: the count restarts
// and an open or half-open breaker closes. It reports whether the breaker
// had opened. A tool that counts nothing is not touched (no row lock), so
// the writers of a healthy tool never wait on each other here.
func ResetBreaker(ctx context.Context, tx pgx.Tx, tool string) (closed bool, err error) {
	var opens int
	err = tx.QueryRow(ctx, `SELECT opens FROM tool_breakers
		WHERE tool = $1 AND (consecutive_failures > 0 OR opens > 0) FOR UPDATE`, tool).Scan(&opens)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, wrap(fmt.Sprintf("read circuit breaker of tool %q", tool), err)
	}
	if _, err := tx.Exec(ctx, `UPDATE tool_breakers SET consecutive_failures = 0, opens = 0, open_until = NULL,
		trial_until = NULL, updated_at = now() WHERE tool = $1`, tool); err != nil {
		return false, wrap(fmt.Sprintf("reset circuit breaker of tool %q", tool), err)
	}
	return opens > 0, nil
}

// CountBreakerFailures adds n unknown verdicts to the tool's count inside
// tx and returns the breaker as it stands after.
func CountBreakerFailures(ctx context.Context, tx pgx.Tx, tool string, n int, lastErr string) (BreakerState, error) {
	var b BreakerState
	err := tx.QueryRow(ctx, `INSERT INTO tool_breakers AS b (tool, consecutive_failures, last_error, updated_at)
		VALUES ($1, $2, $3, now())
		ON CONFLICT (tool) DO UPDATE SET consecutive_failures = b.consecutive_failures + excluded.consecutive_failures,
			last_error = excluded.last_error, updated_at = now()
		RETURNING consecutive_failures, opens, open_until, trial_until, now()`, tool, n, lastErr).
		Scan(&b.Consecutive, &b.Opens, &b.OpenUntil, &b.TrialUntil, &b.Now)
	return b, wrap(fmt.Sprintf("count failures of tool %q", tool), err)
}

// OpenBreaker opens (or re-opens) the tool's breaker inside tx for
// cooldown * 2^(earlier openings), capped at maxCooldown, and returns until
// when and how many openings there have been.
func OpenBreaker(ctx context.Context, tx pgx.Tx, tool string, cooldown, maxCooldown time.Duration) (time.Time, int, error) {
	var until time.Time
	var opens int
	err := tx.QueryRow(ctx, `UPDATE tool_breakers SET opens = opens + 1, trial_until = NULL,
			open_until = now() + least($2::interval * power(2, least(opens, 20)), $3::interval), updated_at = now()
		WHERE tool = $1 RETURNING open_until, opens`, tool, cooldown, maxCooldown).Scan(&until, &opens)
	return until, opens, wrap(fmt.Sprintf("open circuit breaker of tool %q", tool), err)
}
