package alerts

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/ledgerkeeper/ledgerkeeper/internal/safetext"
)

// Reason is why an alert fires; each has a runbook section of its own.
type Reason string

// The alert reasons. Their string values are stored in the outbox and name
// the runbook sections (runbook.md#<reason>).
const (
	// ReasonShardsUnreachable: a Citus worker of the ledger's cluster
	// cannot be reached from the coordinator, so the keys on its shards of
	// idempotency_keys can be neither probed nor decided nor purged. One
	// alert per worker (subject node:HOST:PORT, no tool, no key), not per
	// key; resolved when the worker answers again (RaiseNode, ResolveNode).
	ReasonShardsUnreachable Reason = "shards_unreachable"
	// ReasonDuplicate: the probe found more than one effect for one key:
	// idempotency was already violated downstream. Alerted at once.
	ReasonDuplicate Reason = "duplicate_effect"
	// ReasonProbeFailing: the probe keeps answering unknown (errors,
	// timeouts, garbage) for a key past alert_after_attempts or
	// alert_after_age.
	ReasonProbeFailing Reason = "probe_failing"
	// ReasonNoProbe: a key is stuck for a tool without a probe (or absent
	// from the configuration): a human must decide.
	ReasonNoProbe Reason = "no_probe"
	// ReasonExpiredProcessing: a processing key passed expires_at; purge
	// keeps it and asks for a decision.
	ReasonExpiredProcessing Reason = "expired_processing"
	// ReasonDownstreamUnreachable: a tool's circuit breaker opened; one
	// alert per tool, not per key.
	ReasonDownstreamUnreachable Reason = "downstream_unreachable"
	// ReasonDedupWindowPassed: the probe says not_found but the key is
	// older than the downstream's own dedup window, so a wrong not_found
	// could no longer be caught downstream: escalated, never auto-retried.
	ReasonDedupWindowPassed Reason = "dedup_window_passed" //nolint:gosec // G101: a reason code ("passed"), not a password
	// ReasonProbeUntrusted: the tool's probe failed its self-check against
	// the ledger's ground truth; none of the tool's keys changes state
	// until it passes again. Tool-wide.
	ReasonProbeUntrusted Reason = "probe_untrusted"
	// ReasonProbeUnwitnessed: the tool's not_found verdicts are held
	// because no present-side sample of its self-check came back found
	// (no key completed recently, no canary): nothing shows the probe can
	// find an effect. Tool-wide; resolved when a sample is found again.
	ReasonProbeUnwitnessed Reason = "probe_unwitnessed"
)

// Reasons lists every reason, in the order messages present them.
// shards_unreachable comes first: it hides every key of its worker.
var Reasons = []Reason{
	ReasonShardsUnreachable, ReasonDuplicate, ReasonProbeUntrusted, ReasonProbeUnwitnessed, ReasonDedupWindowPassed, ReasonExpiredProcessing,
	ReasonDownstreamUnreachable, ReasonProbeFailing, ReasonNoProbe,
}

// Alert is one alert raised into the outbox.
type Alert struct {
	Reason Reason
	// Tool is always set; Key is empty for tool-wide alerts
	// (downstream_unreachable). An alert about a Citus worker has neither:
	// RaiseNode raises it, not Raise.
	Tool    string
	Key     string
	Details Details
}

// Details travel with an alert for the message.
type Details struct {
	Attempts  int        `json:"attempts,omitempty"`
	ClaimedAt *time.Time `json:"claimed_at,omitempty"`
	CreatedAt *time.Time `json:"created_at,omitempty"`
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
	Verdict   string     `json:"verdict,omitempty"`
	LastError string     `json:"last_error,omitempty"`
	// Note is free text from ledgerkeeper itself (never from a downstream).
	Note string `json:"note,omitempty"`
	// Resolution says how a resolved alert was resolved.
	Resolution string `json:"resolution,omitempty"`
	// Keys counts the affected keys of a tool-wide alert.
	Keys int `json:"keys,omitempty"`
	// Node is the Citus worker ("host:port") of a shards_unreachable
	// alert: its outbox rows have no tool and no key, so the dispatcher
	// tells workers apart by it.
	Node string `json:"node,omitempty"`
	// Shards are shard ids of idempotency_keys on Node that could not be
	// reached, ascending, at most maxStoredShards of them; ShardCount
	// counts them all.
	Shards     []int64 `json:"shards,omitempty"`
	ShardCount int     `json:"shard_count,omitempty"`
}

// DBTX is a pool or a transaction.
type DBTX interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// subject identifies what an alert is about, for de-duplication.
func subject(a Alert) string {
	if a.Key != "" {
		return "key:" + a.Key
	}
	return "tool:" + a.Tool
}

// maxErrorLen bounds a stored error: messages truncate further.
const maxErrorLen = 2000

// Raise records a firing alert. Call it inside the transaction that records
// the decision raising it (invariant 8): the alert exists if and only if the
// decision does. An alert for the same reason and subject raised less than
// renotifyAfter ago, and not resolved since, is not enqueued again; Raise
// then returns false.
func Raise(ctx context.Context, db DBTX, a Alert, renotifyAfter time.Duration) (bool, error) {
	if a.Reason == "" || a.Tool == "" {
		panic("alerts: Raise needs a reason and a tool")
	}
	return raise(ctx, db, subject(a), a, renotifyAfter)
}

// raise records a firing alert about subj (Raise, RaiseNode). An empty
// a.Tool or a.Key is stored as NULL.
func raise(ctx context.Context, db DBTX, subj string, a Alert, renotifyAfter time.Duration) (bool, error) {
	const upsert = `INSERT INTO alert_state AS s (reason, subject, tool, key) VALUES ($1, $2, $3, $4)
		ON CONFLICT (reason, subject) DO UPDATE
		SET last_raised_at = now(), resolved_at = NULL,
		    first_raised_at = CASE WHEN s.resolved_at IS NOT NULL THEN now() ELSE s.first_raised_at END
		WHERE s.resolved_at IS NOT NULL OR s.last_raised_at <= now() - $5::interval
		RETURNING 1`
	var one int
	err := db.QueryRow(ctx, upsert, string(a.Reason), subj, nullable(a.Tool), nullable(a.Key), renotifyAfter).Scan(&one)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("raise %s alert: %w", a.Reason, err)
	}
	// Cut by characters: a cut inside a UTF-8 sequence would store U+FFFD.
	a.Details.LastError = safetext.ClipRunes(a.Details.LastError, maxErrorLen)
	if err := enqueue(ctx, db, a, KindFiring); err != nil {
		return false, err
	}
	return true, nil
}

// ResolveKey records that key's open alerts are resolved (how: "completed by
// reconciler", "resolved by original attempt", "resolved by operator alice",
// "purged") and enqueues one resolved notice per alert. It returns how many
// alerts it resolved.
func ResolveKey(ctx context.Context, db DBTX, tool, key, how string) (int, error) {
	return resolve(ctx, db, "key:"+key, tool, key, how)
}

// ResolveTool resolves a tool-wide alert (the breaker closed).
func ResolveTool(ctx context.Context, db DBTX, tool, how string) (int, error) {
	return resolve(ctx, db, "tool:"+tool, tool, "", how)
}

// ResolveToolReason resolves one tool-wide alert: the breaker closing ends
// downstream_unreachable, a passing self-check ends probe_untrusted, and
// neither ends the other.
func ResolveToolReason(ctx context.Context, db DBTX, tool string, reason Reason, how string) (int, error) {
	return resolveReason(ctx, db, "tool:"+tool, string(reason), Alert{Tool: tool}, how)
}

func resolve(ctx context.Context, db DBTX, subj, tool, key, how string) (int, error) {
	return resolveReason(ctx, db, subj, "", Alert{Tool: tool, Key: key}, how)
}

// resolveReason resolves the open alerts of subj, of one reason ("": all),
// and enqueues a resolved notice for each: notice's tool, key and details
// with the reason and how.
func resolveReason(ctx context.Context, db DBTX, subj, reason string, notice Alert, how string) (int, error) {
	rows, err := db.Query(ctx, `UPDATE alert_state SET resolved_at = now()
		WHERE subject = $1 AND resolved_at IS NULL AND ($2 = '' OR reason = $2) RETURNING reason`, subj, reason)
	if err != nil {
		return 0, fmt.Errorf("resolve alerts of %s: %w", subj, err)
	}
	reasons, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return 0, fmt.Errorf("resolve alerts of %s: %w", subj, err)
	}
	for _, r := range reasons {
		a := notice
		a.Reason, a.Details.Resolution = Reason(r), how
		if err := enqueue(ctx, db, a, KindResolved); err != nil {
			return 0, err
		}
	}
	return len(reasons), nil
}

func enqueue(ctx context.Context, db DBTX, a Alert, kind Kind) error {
	// jsonb refuses \u0000 and text refuses invalid UTF-8: an alert whose
	// texts cannot be stored would fail the decision that raises it.
	d := &a.Details
	d.Verdict, d.LastError = safetext.Clean(d.Verdict), safetext.Clean(d.LastError)
	d.Note, d.Resolution = safetext.Clean(d.Note), safetext.Clean(d.Resolution)
	d.Node = safetext.Clean(d.Node)
	details, err := json.Marshal(a.Details)
	if err != nil {
		return fmt.Errorf("encode alert details: %w", err)
	}
	_, err = db.Exec(ctx, `INSERT INTO alert_outbox (reason, kind, tool, key, details) VALUES ($1, $2, $3, $4, $5)`,
		string(a.Reason), string(kind), nullable(a.Tool), nullable(a.Key), string(details))
	if err != nil {
		return fmt.Errorf("enqueue %s alert: %w", a.Reason, err)
	}
	return nil
}

func nullable(s string) any {
	if s == "" {
		return nil
	}
	return s
}
