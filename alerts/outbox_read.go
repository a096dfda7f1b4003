package alerts

import (
	"context"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Reads of the alert tables for the web console's alerts page: firing
// alerts a page at a time, the outbox's messages newest first, and the
// resolved notices of the last hours. Each is bounded by its limit and
// served by an index (alert_state_open_idx, the outbox's primary key and
// alert_outbox_created_at_idx), whatever the size of the tables.

// OutboxRow is one message of the outbox: an alert raised (or resolved)
// and its delivery to Slack.
type OutboxRow struct {
	ID     int64  `json:"id"`
	Reason Reason `json:"reason"`
	Kind   Kind   `json:"kind"`
	Tool   string `json:"tool"`
	Key    string `json:"key,omitempty"`
	// Node is the Citus worker of a shards_unreachable message, which has
	// no tool and no key.
	Node      string    `json:"node,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	// Sent: delivered to Slack at SentAt; otherwise pending.
	Sent   bool       `json:"sent"`
	SentAt *time.Time `json:"sent_at,omitempty"`
	// Attempts counts delivery attempts; NextAttemptAt is when a pending
	// message is tried (again).
	Attempts      int       `json:"attempts"`
	NextAttemptAt time.Time `json:"next_attempt_at"`
	// LastError is the last delivery error (not redacted here: whoever
	// shows it redacts it), LastErrorClass its class, LastAttemptAt when.
	LastError      string       `json:"last_error,omitempty"`
	LastErrorClass FailureClass `json:"last_error_class,omitempty"`
	LastAttemptAt  *time.Time   `json:"last_attempt_at,omitempty"`
	// Resolution says how a resolved alert was resolved.
	Resolution string `json:"resolution,omitempty"`
}

// Delivery names the message's delivery state: delivered, failing (its
// last attempt failed; it is tried again at NextAttemptAt) or pending.
func (m OutboxRow) Delivery() string {
	switch {
	case m.Sent:
		return "delivered"
	case m.LastErrorClass != "":
		return "failing"
	}
	return "pending"
}

const outboxColumns = `o.id, o.reason, o.kind, coalesce(o.tool, ''), coalesce(o.key, ''), coalesce(o.details->>'node', ''), o.created_at, o.status = 'sent', o.sent_at,
	o.attempts, o.next_attempt_at, coalesce(o.last_error, ''), coalesce(o.last_error_class, ''), o.last_attempt_at,
	coalesce(o.details->>'resolution', '')`

func scanOutbox(row pgx.CollectableRow) (OutboxRow, error) {
	var m OutboxRow
	var reason, kind, class string
	err := row.Scan(&m.ID, &reason, &kind, &m.Tool, &m.Key, &m.Node, &m.CreatedAt, &m.Sent, &m.SentAt,
		&m.Attempts, &m.NextAttemptAt, &m.LastError, &class, &m.LastAttemptAt, &m.Resolution)
	m.Reason, m.Kind, m.LastErrorClass = Reason(reason), Kind(kind), FailureClass(class)
	return m, err
}

// FiringAlert is an alert that fires now (alert_state, not resolved) and
// the message of its latest raise, if the outbox still holds it.
type FiringAlert struct {
	Reason Reason `json:"reason"`
	// Subject is key:<key>, tool:<tool> or node:<host:port>; with Reason
	// it is the alert's identity and the page's cursor.
	Subject string `json:"subject"`
	Tool    string `json:"tool"`
	Key     string `json:"key,omitempty"`
	// Node is the Citus worker of a shards_unreachable alert (subject
	// node:<host:port>), which has no tool and no key.
	Node          string    `json:"node,omitempty"`
	FirstRaisedAt time.Time `json:"first_raised_at"`
	LastRaisedAt  time.Time `json:"last_raised_at"`
	// Message is the outbox row of the latest raise: Raise writes the
	// state and the row in one transaction, so the row's created_at is
	// the state's last_raised_at.
	Message *OutboxRow `json:"message,omitempty"`
}

// FiringAfter lists up to limit firing alerts, key-wide and tool-wide,
// ordered by subject and reason, after (afterSubject, afterReason) (both
// empty: from the start): keyset pages through alert_state_open_idx.
func FiringAfter(ctx context.Context, db DBTX, afterSubject string, afterReason Reason, limit int) ([]FiringAlert, error) {
	ctx, cancel := context.WithTimeout(ctx, dbTimeout)
	defer cancel()
	rows, err := db.Query(ctx, `SELECT s.reason, s.subject, coalesce(s.tool, ''), coalesce(s.key, ''), s.first_raised_at, s.last_raised_at,
			m.id, m.kind, m.created_at, m.sent, m.sent_at, m.attempts, m.next_attempt_at, m.last_error, m.last_error_class, m.last_attempt_at, m.node
		FROM alert_state s
		LEFT JOIN LATERAL (
			SELECT o.id, o.kind, o.created_at, o.status = 'sent' AS sent, o.sent_at, o.attempts, o.next_attempt_at,
				coalesce(o.last_error, '') AS last_error, coalesce(o.last_error_class, '') AS last_error_class, o.last_attempt_at,
				coalesce(o.details->>'node', '') AS node
			FROM alert_outbox o
			WHERE o.created_at = s.last_raised_at AND o.reason = s.reason AND o.kind = 'firing'
			  AND o.tool IS NOT DISTINCT FROM s.tool AND o.key IS NOT DISTINCT FROM s.key
			  -- workers' alerts have no tool and no key: told apart by details.node
			  AND (NOT starts_with(s.subject, $4) OR o.details->>'node' = substr(s.subject, length($4) + 1))
			ORDER BY o.id DESC LIMIT 1) m ON true
		WHERE s.resolved_at IS NULL AND (s.subject, s.reason) > ($1, $2)
		ORDER BY s.subject, s.reason LIMIT $3`, afterSubject, string(afterReason), limit, nodeSubjectPrefix)
	if err != nil {
		return nil, fmt.Errorf("list firing alerts: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (FiringAlert, error) {
		var a FiringAlert
		var reason string
		var (
			id                 *int64
			kind, lastErr, cls *string
			msgNode            *string
			created, next      *time.Time
			sent               *bool
			sentAt, lastAt     *time.Time
			attempts           *int
		)
		if err := row.Scan(&reason, &a.Subject, &a.Tool, &a.Key, &a.FirstRaisedAt, &a.LastRaisedAt,
			&id, &kind, &created, &sent, &sentAt, &attempts, &next, &lastErr, &cls, &lastAt, &msgNode); err != nil {
			return a, err
		}
		a.Reason = Reason(reason)
		if node, ok := strings.CutPrefix(a.Subject, nodeSubjectPrefix); ok && a.Tool == "" && a.Key == "" {
			a.Node = node
		}
		if id != nil {
			a.Message = &OutboxRow{ID: *id, Reason: a.Reason, Kind: Kind(*kind), Tool: a.Tool, Key: a.Key, Node: *msgNode, CreatedAt: *created,
				Sent: *sent, SentAt: sentAt, Attempts: *attempts, NextAttemptAt: *next, LastError: *lastErr,
				LastErrorClass: FailureClass(*cls), LastAttemptAt: lastAt}
		}
		return a, nil
	})
	if err != nil {
		return nil, fmt.Errorf("list firing alerts: %w", err)
	}
	return out, nil
}

// OutboxBefore lists up to limit messages of the outbox with an id below
// before (0: from the newest), newest first: keyset pages on the primary
// key.
func OutboxBefore(ctx context.Context, db DBTX, before int64, limit int) ([]OutboxRow, error) {
	if before <= 0 {
		before = math.MaxInt64
	}
	ctx, cancel := context.WithTimeout(ctx, dbTimeout)
	defer cancel()
	rows, err := db.Query(ctx, `SELECT `+outboxColumns+` FROM alert_outbox o WHERE o.id < $1 ORDER BY o.id DESC LIMIT $2`, before, limit)
	if err != nil {
		return nil, fmt.Errorf("list alert messages: %w", err)
	}
	out, err := pgx.CollectRows(rows, scanOutbox)
	if err != nil {
		return nil, fmt.Errorf("list alert messages: %w", err)
	}
	return out, nil
}

// ResolvedSince lists up to limit resolved notices raised within the last
// `within` (by the database's clock), newest first: a backward scan of
// alert_outbox_created_at_idx that stops at limit (notices of one instant
// come in no set order).
func ResolvedSince(ctx context.Context, db DBTX, within time.Duration, limit int) ([]OutboxRow, error) {
	ctx, cancel := context.WithTimeout(ctx, dbTimeout)
	defer cancel()
	rows, err := db.Query(ctx, `SELECT `+outboxColumns+` FROM alert_outbox o
		WHERE o.created_at > now() - $1::interval AND o.kind = 'resolved'
		ORDER BY o.created_at DESC LIMIT $2`, within, limit)
	if err != nil {
		return nil, fmt.Errorf("list resolved alerts: %w", err)
	}
	out, err := pgx.CollectRows(rows, scanOutbox)
	if err != nil {
		return nil, fmt.Errorf("list resolved alerts: %w", err)
	}
	return out, nil
}
