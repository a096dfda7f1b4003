package operator

import (
	"context"
	"errors"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/store"
)

// HoldRequest puts one key on hold.
type HoldRequest struct {
	Key string
	// Reason and Actor are shown by status and inspect and audited; both
	// required.
	Reason string
	Actor  string
	// Replace replaces the key's hold if it has one (audited, naming the
	// replaced hold); without it a held key is refused.
	Replace bool
}

// Validate checks the request in itself (errors match ErrInvalid).
func (r HoldRequest) Validate() error {
	if strings.TrimSpace(r.Reason) == "" {
		return ErrNoReason
	}
	if r.Actor == "" {
		return ErrNoActor
	}
	return nil
}

// HoldResult is a hold that was put.
type HoldResult struct {
	// Replaced is the hold this one replaced (Replace only), nil if the
	// key was not held.
	Replaced *store.Hold
}

// Hold puts req.Key on hold in one transaction, audited. Errors: ErrInvalid,
// ErrNoKey, *RefusedError (RefusedAlreadyHeld, with the hold in force:
// nothing changed), or the database's.
func Hold(ctx context.Context, db store.Beginner, req HoldRequest) (HoldResult, error) {
	if err := req.Validate(); err != nil {
		return HoldResult{}, err
	}
	var out HoldResult
	err := inTx(ctx, db, req.Key, nil, func(tx pgx.Tx) error {
		if req.Replace {
			var err error
			out.Replaced, err = store.ReplaceHold(ctx, tx, req.Key, req.Reason, req.Actor)
			return err
		}
		return store.PutHold(ctx, tx, req.Key, req.Reason, req.Actor)
	})
	var held *store.HeldError
	switch {
	case errors.Is(err, ledger.ErrNotFound):
		return HoldResult{}, ErrNoKey
	case errors.As(err, &held):
		h := held.Hold
		return HoldResult{}, &RefusedError{Why: RefusedAlreadyHeld, Key: req.Key, Tool: h.Tool, Status: h.Status, Hold: &h}
	case err != nil:
		return HoldResult{}, err
	}
	return out, nil
}

// ReleaseRequest lifts one key's hold.
type ReleaseRequest struct {
	Key string
	// Actor is audited; required.
	Actor string
	// Note goes into the audit row where a hold keeps its reason; optional
	// (the command line gives none; Slack names the operator).
	Note string
}

// Release lifts req.Key's hold in one transaction, audited (when the key is
// still in the ledger). Errors: ErrInvalid, ErrNotHeld, or the database's.
func Release(ctx context.Context, db store.Beginner, req ReleaseRequest) error {
	if req.Actor == "" {
		return ErrNoActor
	}
	err := inTx(ctx, db, req.Key, nil, func(tx pgx.Tx) error { return store.ReleaseHoldNoted(ctx, tx, req.Key, req.Actor, req.Note) })
	if errors.Is(err, ledger.ErrNotFound) {
		return ErrNotHeld
	}
	return err
}

// Held reports whether key is on hold now (Slack's key picker shows
// Release for a held key, Hold otherwise).
func Held(ctx context.Context, db ledger.DBTX, key string) (bool, error) {
	_, err := store.GetHold(ctx, db, key)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, ledger.ErrNotFound):
		return false, nil
	}
	return false, err
}
