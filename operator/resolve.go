package operator

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerkeeper/ledgerkeeper/alerts"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/store"
)

// Windows returns a tool's processing window plus grace and its heartbeat
// timeout, as the serve configuration sets them: what "in flight" means for
// the tool's keys.
type Windows func(tool string) (window, heartbeatTimeout time.Duration)

// Mark is the outcome an operator records for a key.
type Mark string

// The marks.
const (
	// MarkCompleted: the effect happened; store the outcome retries will
	// replay.
	MarkCompleted Mark = "completed"
	// MarkRetryable: the effect did not happen; a retry may redo the work.
	MarkRetryable Mark = "retryable"
)

// ResolveRequest is an operator's resolution of one key.
type ResolveRequest struct {
	Key  string
	Mark Mark
	// Code and Body are the outcome to store (MarkCompleted only).
	Code int
	Body json.RawMessage
	// Reason and Actor go into the audit trail; both required.
	Reason string
	Actor  string
	// Force resolves a key in flight, or without Windows, and allows a 5xx
	// outcome. Holds and the compare-and-set conditions still apply.
	Force bool
	// Windows judges "in flight"; nil when the serve configuration is not
	// loaded: refused unless Force.
	Windows Windows
	// ClaimedAt, when set, is the claim the operator judged (read when
	// they looked at the key): the decision applies to that attempt only.
	// A key claimed again since (it went failed_retryable and a retry
	// re-claimed it) is refused, RefusedChanged, so a judgement of one
	// attempt never settles another, whose effect may have happened. Nil:
	// the key's claim as Resolve reads it (the CLI reads and acts at once).
	ClaimedAt *time.Time

	// commit commits the transaction (nil: tx.Commit); a test replaces it
	// to break the connection under a COMMIT.
	commit func(pgx.Tx, context.Context) error
}

// ActionReclaimed is RefusedError.Action when the key was claimed again
// since the operator judged it (ResolveRequest.ClaimedAt).
const ActionReclaimed = "claimed again since it was judged"

// Validate checks the request in itself, before any database is reached.
// The errors match ErrInvalid; they come in a fixed order (mark, reason,
// code, 5xx, body, outcome on retryable), so the first mistake is named.
func (r ResolveRequest) Validate() error {
	switch r.Mark {
	case MarkCompleted, MarkRetryable:
	default:
		return ErrNoMark
	}
	if strings.TrimSpace(r.Reason) == "" {
		return ErrNoReason
	}
	if r.Mark == MarkCompleted {
		if r.Code < 100 || r.Code > 599 {
			return ErrBadCode
		}
		if r.Code >= 500 && !r.Force {
			return ErrServerErrorOutcome
		}
		if len(r.Body) == 0 || !json.Valid(r.Body) {
			return ErrBadBody
		}
	} else if r.Code != 0 || r.Body != nil {
		return ErrOutcomeOnRetryable
	}
	if r.Actor == "" {
		return ErrNoActor
	}
	return nil
}

// ResolveResult is a resolution that was written.
type ResolveResult struct {
	// Key is the key as it stands after the decision.
	Key ledger.Key
	// Action is what the audit recorded (store.ActionOperatorCompleted or
	// store.ActionOperatorMarkedRetryable).
	Action string
	// AlertsResolved is how many of the key's open alerts were resolved.
	AlertsResolved int
}

// Resolve applies req in one transaction: the key is read, the rules of
// the package documentation are checked, and the decision is written by
// store.DecideOperator (which re-checks them under the row lock, in flight
// by the database's clock), with the key's open alerts resolved in the same
// transaction. Errors: ErrInvalid (see Validate), ErrNoKey, *RefusedError,
// or the database's.
func Resolve(ctx context.Context, db store.Beginner, req ResolveRequest) (ResolveResult, error) {
	if err := req.Validate(); err != nil {
		return ResolveResult{}, err
	}
	var (
		res    store.DecideResult
		k      ledger.Key
		window time.Duration
		closed int
	)
	err := inTx(ctx, db, req.Key, req.commit, func(tx pgx.Tx) error {
		var err error
		k, err = ledger.Get(ctx, tx, req.Key)
		if errors.Is(err, ledger.ErrNotFound) {
			return ErrNoKey
		}
		if err != nil {
			return err
		}
		if req.ClaimedAt != nil && !k.ClaimedAt.Equal(*req.ClaimedAt) {
			return &RefusedError{Why: RefusedChanged, Key: req.Key, Tool: k.Tool, Status: k.Status, Action: ActionReclaimed}
		}
		switch {
		case k.Status == ledger.StatusProcessing:
		case k.Status == ledger.StatusFailedRetryable && req.Mark == MarkCompleted:
			// The effect turned out to exist after all: storing it stops
			// the retry that would redo it (if none re-claimed the key
			// yet: compare-and-set on claimed_at).
		case k.Status == ledger.StatusFailedRetryable:
			return &RefusedError{Why: RefusedAlreadyRetryable, Key: req.Key, Tool: k.Tool, Status: k.Status}
		default:
			return &RefusedError{Why: RefusedFinal, Key: req.Key, Tool: k.Tool, Status: k.Status}
		}
		switch h, err := store.GetHold(ctx, tx, req.Key); {
		case err == nil:
			return &RefusedError{Why: RefusedHeld, Key: req.Key, Tool: k.Tool, Status: k.Status, Hold: &h}
		case !errors.Is(err, ledger.ErrNotFound):
			return err
		}
		var hb time.Duration
		switch {
		case req.Windows != nil:
			window, hb = req.Windows(k.Tool)
		case !req.Force:
			return &RefusedError{Why: RefusedNoConfiguration, Key: req.Key, Tool: k.Tool, Status: k.Status}
		}
		d := store.OperatorDecision{Key: req.Key, Tool: k.Tool, ClaimedAt: k.ClaimedAt, Actor: req.Actor, Reason: req.Reason,
			Window: window, HeartbeatTimeout: hb, Force: req.Force}
		if req.Mark == MarkCompleted {
			d.Transition, d.ResponseCode, d.ResponseBody = ledger.StatusCompleted, req.Code, req.Body
			d.AllowFailedRetryable = true
		} else {
			d.Transition = ledger.StatusFailedRetryable
		}
		if res, err = store.DecideOperator(ctx, tx, d); err != nil {
			return err
		}
		if res.Applied {
			closed, err = alerts.ResolveKey(ctx, tx, k.Tool, req.Key, "resolved by operator "+req.Actor)
		}
		// A refusal found under the lock is returned after the commit: its
		// audit row (resolved_by_original, held) is kept.
		return err
	})
	if err != nil {
		return ResolveResult{}, err
	}
	switch {
	case res.Action == store.ActionInFlight:
		return ResolveResult{}, &RefusedError{Why: RefusedInFlight, Key: req.Key, Tool: k.Tool, Status: k.Status, Window: window}
	case !res.Applied:
		return ResolveResult{}, &RefusedError{Why: RefusedChanged, Key: req.Key, Tool: k.Tool, Status: res.Current.Status, Action: res.Action}
	}
	return ResolveResult{Key: res.Current, Action: res.Action, AlertsResolved: closed}, nil
}
