package store

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
)

// VerdictOperator is the verdict recorded for a decision an operator made
// by hand (resolve, hold, release).
const VerdictOperator = "operator"

// Actions an operator's decision records.
const (
	// ActionOperatorCompleted: the operator stored an outcome (the effect
	// happened).
	ActionOperatorCompleted = "operator_completed"
	// ActionOperatorMarkedRetryable: the operator marked the key
	// failed_retryable (the effect did not happen).
	ActionOperatorMarkedRetryable = "operator_marked_retryable"
	// ActionInFlight: DecideOperator found the key in flight (claimed less
	// than Window ago or heartbeating within HeartbeatTimeout, by the
	// database's clock) and wrote nothing at all.
	ActionInFlight = "in_flight"
)

// OperatorDecision is a decision an operator makes by hand about one key
// (resolve). Unlike a reconciler's Decision it holds no lease: it is
// conditional on the status and claimed_at the operator saw, on the absence
// of a hold, and, unless Force, on the key not being in flight by the
// database's clock, all checked under the key's row lock.
type OperatorDecision struct {
	Key  string
	Tool string
	// ClaimedAt is the claim the operator looked at: a key re-claimed since
	// is not touched ("resolved_by_original").
	ClaimedAt time.Time
	// Actor is the operator, recorded in the audit.
	Actor string
	// Reason is why, recorded in the audit's evidence.
	Reason string
	// Transition is StatusCompleted (with ResponseCode and ResponseBody,
	// the outcome retries will replay) or StatusFailedRetryable.
	Transition   string
	ResponseCode int
	ResponseBody json.RawMessage
	// Window (the tool's processing window plus grace) and HeartbeatTimeout:
	// a key claimed less than Window ago, or whose heartbeat is younger than
	// HeartbeatTimeout, is in flight and refused ("in_flight", nothing
	// written). Window must be positive unless Force.
	Window           time.Duration
	HeartbeatTimeout time.Duration
	// Force skips the in-flight check (recorded in the audit's evidence).
	// Holds and the compare-and-set conditions still apply.
	Force bool
	// AllowFailedRetryable lets a transition to completed apply to a
	// failed_retryable key that no retry has re-claimed since (same
	// claimed_at): the effect turned out to exist after all.
	AllowFailedRetryable bool
}

// pending turns the operator's decision into the shared write path's form:
// verdict "operator", the action named after the transition, the reason and
// Force as evidence, no lease, no attempt counted, no probe scheduled.
func (d OperatorDecision) pending() (pending, error) {
	var action string
	switch d.Transition {
	case ledger.StatusCompleted:
		action = ActionOperatorCompleted
	case ledger.StatusFailedRetryable:
		action = ActionOperatorMarkedRetryable
	default:
		return pending{}, fmt.Errorf("operator decision on key %q: transition %q, want %q or %q", d.Key, d.Transition, ledger.StatusCompleted, ledger.StatusFailedRetryable)
	}
	if !d.Force && d.Window <= 0 {
		// A zero window would judge every key idle: refuse rather than
		// skip the check silently.
		return pending{}, fmt.Errorf("operator decision on key %q: no processing window to judge whether it is in flight (Window %s); pass the tool's window or Force", d.Key, d.Window)
	}
	evidence, err := json.Marshal(map[string]any{"reason": d.Reason, "forced": d.Force})
	if err != nil {
		return pending{}, fmt.Errorf("operator decision on key %q: encode evidence: %w", d.Key, err)
	}
	return pending{
		Decision: Decision{Key: d.Key, Tool: d.Tool, ClaimedAt: d.ClaimedAt, Actor: d.Actor, Verdict: VerdictOperator,
			Transition: d.Transition, ResponseCode: d.ResponseCode, ResponseBody: d.ResponseBody, Action: action, Evidence: evidence},
		operator:             true,
		requireIdle:          !d.Force,
		window:               d.Window,
		heartbeatTimeout:     d.HeartbeatTimeout,
		allowFailedRetryable: d.AllowFailedRetryable,
	}, nil
}

// DecideOperator writes an operator's decision inside tx, with its audit
// row, on the same path as the reconciler's decisions: one locking read,
// then the compare-and-set transition (status processing, or
// failed_retryable with AllowFailedRetryable and a transition to completed;
// the claimed_at the operator saw; no hold) and the bookkeeping (the claim
// settled: any lease released, attempts kept). When a condition fails
// nothing changes in the ledger: "resolved_by_original" (finished or
// re-claimed meanwhile) and "held" are audited; "in_flight" writes nothing
// at all. Its alerts are the caller's, in the same transaction.
func DecideOperator(ctx context.Context, tx pgx.Tx, d OperatorDecision) (DecideResult, error) {
	p, err := d.pending()
	if err != nil {
		return DecideResult{}, err
	}
	res, err := decideMany(ctx, tx, []pending{p})
	if err != nil {
		return DecideResult{}, err
	}
	return res[0], nil
}

// GetWithClock reads a key with the database's clock at the read, so an
// operator's view of it (in flight, stuck) is judged by the same clock as
// every decision. ErrNotFound if the key is not in the ledger; the clock is
// returned either way.
func GetWithClock(ctx context.Context, db ledger.DBTX, key string) (ledger.Key, time.Time, error) {
	var now time.Time
	if err := db.QueryRow(ctx, `SELECT now()`).Scan(&now); err != nil {
		return ledger.Key{}, time.Time{}, wrap("read the database's clock", err)
	}
	k, err := ledger.Get(ctx, db, key)
	return k, now, err
}
