package alerts

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// DeliveryHealth is the state of alert delivery, for `ledgerkeeper status`
// and /readyz: alerts waiting in the outbox, and why, if Slack refuses them.
type DeliveryHealth struct {
	// Pending is the number of alerts not yet delivered.
	Pending int `json:"pending"`
	// OldestPendingAt is when the oldest pending alert was raised;
	// OldestPendingAge is its age (now - OldestPendingAt) in seconds.
	OldestPendingAt  *time.Time `json:"oldest_pending_at,omitempty"`
	OldestPendingAge float64    `json:"oldest_pending_age_seconds,omitempty"`
	// NextAttemptAt is the earliest time a pending alert is due.
	NextAttemptAt *time.Time `json:"next_attempt_at,omitempty"`
	// Failing counts pending alerts whose last delivery failed; Permanent
	// those whose last failure needs a human (token, channel, webhook).
	Failing   int `json:"failing"`
	Permanent int `json:"permanent"`
	// LastError is the most recent delivery error of a pending alert
	// (redacted), LastErrorClass its class (retryable, rate_limited,
	// permanent), LastErrorAt when it happened.
	LastError      string       `json:"last_error,omitempty"`
	LastErrorClass FailureClass `json:"last_error_class,omitempty"`
	LastErrorAt    *time.Time   `json:"last_error_at,omitempty"`
	// NextPermanentRetryAt is when a running dispatcher next tries the
	// alerts a permanent error holds back (Config.PermanentRetry doubling
	// up to PermanentBackoff); RateLimitedUntil is the end of a 429's
	// Retry-After, before which nothing is posted.
	NextPermanentRetryAt *time.Time `json:"next_permanent_retry_at,omitempty"`
	RateLimitedUntil     *time.Time `json:"rate_limited_until,omitempty"`
}

// LastErrorPermanent reports whether the most recent failure needs a human.
func (h DeliveryHealth) LastErrorPermanent() bool { return h.LastErrorClass == ClassPermanent }

// Health reads the outbox's delivery state. It reads pending rows only
// (through the partial index), whatever the number of sent ones.
func Health(ctx context.Context, db DBTX) (DeliveryHealth, error) {
	ctx, cancel := context.WithTimeout(ctx, dbTimeout)
	defer cancel()
	var h DeliveryHealth
	var age *float64
	err := db.QueryRow(ctx, `SELECT count(*), min(created_at), extract(epoch FROM now() - min(created_at))::float8,
			min(next_attempt_at),
			count(*) FILTER (WHERE last_error_class IS NOT NULL),
			count(*) FILTER (WHERE last_error_class = 'permanent'),
			min(next_attempt_at) FILTER (WHERE last_error_class = 'permanent'),
			max(next_attempt_at) FILTER (WHERE last_error_class = 'rate_limited' AND next_attempt_at > now())
		FROM alert_outbox WHERE status = 'pending'`).
		Scan(&h.Pending, &h.OldestPendingAt, &age, &h.NextAttemptAt, &h.Failing, &h.Permanent, &h.NextPermanentRetryAt, &h.RateLimitedUntil)
	if err != nil {
		return h, fmt.Errorf("read alert delivery health: %w", err)
	}
	if age != nil {
		h.OldestPendingAge = max(*age, 0)
	}
	if h.Failing == 0 {
		return h, nil
	}
	var class string
	err = db.QueryRow(ctx, `SELECT last_error, last_error_class, last_attempt_at FROM alert_outbox
		WHERE status = 'pending' AND last_error_class IS NOT NULL
		ORDER BY last_attempt_at DESC NULLS LAST, id DESC LIMIT 1`).
		Scan(&h.LastError, &class, &h.LastErrorAt)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return h, fmt.Errorf("read last alert delivery error: %w", err)
	}
	h.LastErrorClass = FailureClass(class)
	return h, nil
}

// OpenAlert is an unresolved per-key alert: the reconciler checks whether
// its key was resolved by other means (the original attempt completed) and
// then calls ResolveKey, so on-call hears that it is over.
type OpenAlert struct {
	Reason       Reason    `json:"reason"`
	Tool         string    `json:"tool"`
	Key          string    `json:"key"`
	LastRaisedAt time.Time `json:"last_raised_at"`
}

// OpenKeyAlerts returns up to limit unresolved per-key alerts, ordered by
// key and reason. Tool-wide alerts are not included (ResolveTool closes
// them), nor Citus workers' (OpenNodeAlerts lists them).
func OpenKeyAlerts(ctx context.Context, db DBTX, limit int) ([]OpenAlert, error) {
	return OpenKeyAlertsAfter(ctx, db, OpenAlert{}, limit)
}

// OpenKeyAlertsAfter is OpenKeyAlerts from the alert after `after` (the
// last one of the previous page; the zero value starts at the beginning):
// a sweep pages through every open alert with it, so alerts that stay open
// never hide the ones after them.
func OpenKeyAlertsAfter(ctx context.Context, db DBTX, after OpenAlert, limit int) ([]OpenAlert, error) {
	if limit <= 0 {
		limit = 1000
	}
	ctx, cancel := context.WithTimeout(ctx, dbTimeout)
	defer cancel()
	// Served by alert_state_open_idx: the cost follows open alerts only.
	rows, err := db.Query(ctx, `SELECT reason, coalesce(tool, ''), key, last_raised_at FROM alert_state
		WHERE resolved_at IS NULL AND key IS NOT NULL AND (subject, reason) > ($1, $2)
		ORDER BY subject, reason LIMIT $3`, "key:"+after.Key, string(after.Reason), limit)
	if err != nil {
		return nil, fmt.Errorf("list open key alerts: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (OpenAlert, error) {
		var a OpenAlert
		var reason string
		err := r.Scan(&reason, &a.Tool, &a.Key, &a.LastRaisedAt)
		a.Reason = Reason(reason)
		return a, err
	})
	if err != nil {
		return nil, fmt.Errorf("list open key alerts: %w", err)
	}
	return out, nil
}

// PendingByTool counts undelivered alerts per tool, for the per-tool lines
// of `ledgerkeeper status`; alerts about no tool (a Citus worker's,
// shards_unreachable) count under "". Like Health it reads pending rows
// only.
func PendingByTool(ctx context.Context, db DBTX) (map[string]int, error) {
	ctx, cancel := context.WithTimeout(ctx, dbTimeout)
	defer cancel()
	rows, err := db.Query(ctx, `SELECT coalesce(tool, ''), count(*) FROM alert_outbox WHERE status = 'pending' GROUP BY 1`)
	if err != nil {
		return nil, fmt.Errorf("count pending alerts per tool: %w", err)
	}
	out := map[string]int{}
	var tool string
	var n int
	_, err = pgx.ForEachRow(rows, []any{&tool, &n}, func() error {
		out[tool] = n
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("count pending alerts per tool: %w", err)
	}
	return out, nil
}
