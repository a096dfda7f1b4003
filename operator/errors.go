package operator

import (
	"errors"
	"fmt"
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/store"
)

// ErrInvalid marks a request that is wrong in itself, whatever the ledger
// holds: the caller's mistake (the command line exits 2). Each of the
// errors below matches it.
var ErrInvalid = errors.New("invalid operator request")

// The invalid requests, one sentinel each, so a binding can word them in
// its own terms (flags, fields).
var (
	// ErrNoMark: a resolve names neither MarkCompleted nor MarkRetryable.
	ErrNoMark = fmt.Errorf("%w: resolve needs an outcome: completed or retryable", ErrInvalid)
	// ErrNoReason: no reason given; it goes into the audit trail.
	ErrNoReason = fmt.Errorf("%w: a reason is required (it goes into the audit trail)", ErrInvalid)
	// ErrNoActor: nobody named to record in the audit trail.
	ErrNoActor = fmt.Errorf("%w: an actor is required (it goes into the audit trail)", ErrInvalid)
	// ErrBadCode: the response code of MarkCompleted is not an HTTP status
	// code (100-599).
	ErrBadCode = fmt.Errorf("%w: the response code must be an HTTP status code (100-599)", ErrInvalid)
	// ErrServerErrorOutcome: a 5xx outcome without Force. The caching rule
	// stores definitive outcomes only: a stored server error would be
	// replayed to every retry forever.
	ErrServerErrorOutcome = fmt.Errorf("%w: a 5xx response code would replay a server error to every retry forever", ErrInvalid)
	// ErrBadBody: the response body of MarkCompleted is missing or not
	// valid JSON.
	ErrBadBody = fmt.Errorf("%w: the response body must be valid JSON (the response retries will replay)", ErrInvalid)
	// ErrOutcomeOnRetryable: MarkRetryable with a response code or body.
	ErrOutcomeOnRetryable = fmt.Errorf("%w: marking a key retryable takes no response code or body", ErrInvalid)
)

// ErrNoKey: the key is not in the ledger (never claimed, or purged and
// without an audit trail). It matches ledger.ErrNotFound.
var ErrNoKey = fmt.Errorf("no such key in the ledger: %w", ledger.ErrNotFound)

// ErrNotHeld: Release of a key that has no hold.
var ErrNotHeld = errors.New("key is not on hold")

// ErrRefused matches every *RefusedError.
var ErrRefused = errors.New("refused")

// Refusal says why an operator's act was refused.
type Refusal string

// The refusals. Nothing is changed by any of them; RefusedChanged's audit
// row records the attempt.
const (
	// RefusedFinal: the key is completed; only purge removes it.
	RefusedFinal Refusal = "final"
	// RefusedAlreadyRetryable: MarkRetryable of a failed_retryable key.
	RefusedAlreadyRetryable Refusal = "already_failed_retryable"
	// RefusedHeld: the key is on hold; release it first.
	RefusedHeld Refusal = "held"
	// RefusedNoConfiguration: no tool windows known (Windows nil), so "in
	// flight" cannot be judged; pass the serve configuration or Force.
	RefusedNoConfiguration Refusal = "no_configuration"
	// RefusedInFlight: claimed less than its window + grace ago, or
	// heartbeating, by the database's clock; the original attempt may
	// still finish. Window says which window.
	RefusedInFlight Refusal = "in_flight"
	// RefusedChanged: the key changed between the read and the write (its
	// attempt finished, a retry re-claimed it, it was put on hold); Action
	// is what the audit recorded.
	RefusedChanged Refusal = "changed"
	// RefusedAlreadyHeld: Hold of a key already on hold, without Replace;
	// Hold is the hold in force.
	RefusedAlreadyHeld Refusal = "already_held"
)

// RefusedError is an operator's act the ledger's state does not allow
// (the command line exits 1). It carries what a caller needs to say why.
type RefusedError struct {
	Why Refusal
	Key string
	// Tool is the key's tool.
	Tool string
	// Status is the key's status when refused (RefusedFinal,
	// RefusedAlreadyRetryable).
	Status string
	// Window is the window + grace the key was judged by (RefusedInFlight).
	Window time.Duration
	// Action is what the audit recorded (RefusedChanged).
	Action string
	// Hold is the hold in force (RefusedAlreadyHeld, RefusedHeld).
	Hold *store.Hold
}

func (e *RefusedError) Error() string {
	switch e.Why {
	case RefusedFinal:
		return fmt.Sprintf("refused: key %q is %s, which is final", e.Key, e.Status)
	case RefusedAlreadyRetryable:
		return fmt.Sprintf("refused: key %q is already failed_retryable", e.Key)
	case RefusedHeld:
		return fmt.Sprintf("refused: key %q is on hold", e.Key)
	case RefusedNoConfiguration:
		return fmt.Sprintf("refused: the processing window of tool %q is unknown without the configuration", e.Tool)
	case RefusedInFlight:
		return fmt.Sprintf("refused: key %q is in flight (claimed less than %s ago, or heartbeating)", e.Key, e.Window)
	case RefusedChanged:
		return fmt.Sprintf("refused: key %q changed meanwhile (%s); nothing written", e.Key, e.Action)
	case RefusedAlreadyHeld:
		if e.Hold != nil {
			return fmt.Sprintf("refused: key %q is already on hold, by %s since %s: %s", e.Key, e.Hold.Actor, e.Hold.CreatedAt.UTC().Format(time.RFC3339), e.Hold.Reason)
		}
		return fmt.Sprintf("refused: key %q is already on hold", e.Key)
	}
	return fmt.Sprintf("refused: key %q: %s", e.Key, e.Why)
}

// Is makes errors.Is(err, ErrRefused) true.
func (e *RefusedError) Is(target error) bool { return target == ErrRefused }
