package operator

import (
	"context"
	"errors"
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/alerts"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/store"
)

// Condition is what a key's state means for the reconciler.
type Condition string

// The conditions (see Judge).
const (
	// InFlight: processing, claimed less than its window + grace ago or
	// heartbeating within its heartbeat_timeout; the reconciler leaves it
	// alone.
	InFlight Condition = "in_flight"
	// Stuck: processing past its window and without a fresh heartbeat; the
	// reconciler's to probe (unless held).
	Stuck Condition = "stuck"
	// Completed: the outcome is stored and replayed; final.
	Completed Condition = "completed"
	// FailedRetryable: the effect did not happen; a retry re-claims it.
	FailedRetryable Condition = "failed_retryable"
	// Purged: no longer in the ledger (purged after it expired, or deleted),
	// but its audit trail remains.
	Purged Condition = "purged"
)

// Judgement is what a key's state means, by the database's clock.
type Judgement struct {
	Condition Condition
	// Held: on hold; never probed, decided or purged whatever the
	// condition, until released.
	Held bool
	// Age is how long ago the key was claimed; HeartbeatAge how long ago it
	// last heartbeat (nil: never). Zero for a purged key.
	Age          time.Duration
	HeartbeatAge *time.Duration
	// Leased: a reconciler holds an unexpired lease of its current claim.
	Leased bool
}

// Judge says what k means at now (the database's clock), for a tool whose
// window + grace is window and heartbeat timeout heartbeatTimeout. The
// boundaries are the ledger's (LeaseDue, DecideOperator): a key claimed
// exactly window ago is no longer in flight, nor one whose heartbeat is
// exactly heartbeatTimeout old.
func Judge(k ledger.Key, now time.Time, window, heartbeatTimeout time.Duration) Judgement {
	j := Judgement{Age: now.Sub(k.ClaimedAt)}
	if k.HeartbeatAt != nil {
		beat := now.Sub(*k.HeartbeatAt)
		j.HeartbeatAge = &beat
	}
	switch k.Status {
	case ledger.StatusProcessing:
		j.Condition = Stuck
		if j.Age < window || (j.HeartbeatAge != nil && *j.HeartbeatAge < heartbeatTimeout) {
			j.Condition = InFlight
		}
	case ledger.StatusCompleted:
		j.Condition = Completed
	case ledger.StatusFailedRetryable:
		j.Condition = FailedRetryable
	default:
		// A status the schema's CHECK does not allow: never judged idle.
		j.Condition = Condition(k.Status)
	}
	return j
}

// InspectRequest asks about one key.
type InspectRequest struct {
	Key string
	// HistoryLimit is how many of the newest audit entries to return
	// (default 200).
	HistoryLimit int
	// Windows gives the tool's window + grace and heartbeat timeout; nil
	// judges with zero windows (every processing key stuck), so pass the
	// configuration's, or its defaults.
	Windows Windows
}

// Inspection is everything known about a key, judged.
type Inspection struct {
	// Key is the row; zero when Purged.
	Key ledger.Key
	// State is the reconciler's bookkeeping of the key's current claim.
	State *store.State
	Hold  *store.Hold
	// History is the audit trail, oldest first (the newest HistoryLimit
	// entries); never nil.
	History []store.AuditEntry
	// Alerts are the key's open alerts.
	Alerts []alerts.OpenAlert
	// Window and HeartbeatTimeout are what the key was judged by.
	Window           time.Duration
	HeartbeatTimeout time.Duration
	// Now is the database's clock at the read.
	Now       time.Time
	Judgement Judgement
}

// maxKeyAlerts bounds the open alerts read for one key.
const maxKeyAlerts = 20

// Inspect reads everything about req.Key and judges it by the database's
// clock. A key no longer in the ledger whose audit trail remains is
// returned as Purged, with that trail; one with no trail either is
// ErrNoKey.
func Inspect(ctx context.Context, db ledger.DBTX, req InspectRequest) (Inspection, error) {
	limit := req.HistoryLimit
	if limit <= 0 {
		limit = 200
	}
	k, now, err := store.GetWithClock(ctx, db, req.Key)
	gone := errors.Is(err, ledger.ErrNotFound)
	if err != nil && !gone {
		return Inspection{}, err
	}
	in := Inspection{Key: k, Now: now}
	if in.History, err = store.History(ctx, db, req.Key, limit); err != nil {
		return Inspection{}, err
	}
	if in.History == nil {
		in.History = []store.AuditEntry{}
	}
	if gone && len(in.History) == 0 {
		return Inspection{}, ErrNoKey
	}
	// A hold outlives its key's row (one deleted by hand): it would apply
	// to the same key claimed again.
	if h, err := store.GetHold(ctx, db, req.Key); err == nil {
		in.Hold = &h
	} else if !errors.Is(err, ledger.ErrNotFound) {
		return Inspection{}, err
	}
	if gone {
		in.Judgement = Judgement{Condition: Purged, Held: in.Hold != nil}
		return in, nil
	}
	if st, err := store.GetState(ctx, db, req.Key); err == nil && st.ClaimedAt.Equal(k.ClaimedAt) {
		in.State = &st
	} else if err != nil && !errors.Is(err, ledger.ErrNotFound) {
		return Inspection{}, err
	}
	open, err := alerts.OpenKeyAlertsAfter(ctx, db, alerts.OpenAlert{Key: req.Key}, maxKeyAlerts)
	if err != nil {
		return Inspection{}, err
	}
	for _, o := range open {
		if o.Key == req.Key {
			in.Alerts = append(in.Alerts, o)
		}
	}
	if req.Windows != nil {
		in.Window, in.HeartbeatTimeout = req.Windows(k.Tool)
	}
	in.Judgement = Judge(k, now, in.Window, in.HeartbeatTimeout)
	in.Judgement.Held = in.Hold != nil
	if s := in.State; s != nil && s.LeaseOwner != nil && s.LeaseExpiresAt != nil && s.LeaseExpiresAt.After(now) {
		in.Judgement.Leased = true
	}
	return in, nil
}
