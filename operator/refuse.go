package operator

import (
	"context"
	"errors"

	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/store"
)

// RefusalRecord is an act a binding refused before it reached the ledger
// (interact: a Slack user not allowed to act), for the key's audit trail.
type RefusalRecord struct {
	Key string
	// Action names the refusal in the audit trail (interact's
	// "slack_refused").
	Action string
	// Actor is who attempted the act; required.
	Actor string
	// What says what was attempted and why it was refused (the audit row's
	// error column).
	What string
}

// AuditRefusal records rec in rec.Key's audit trail (verdict "operator",
// the attempts of the key's current claim) and changes nothing else, so a
// binding's refusals sit beside the acts it let through. A key not in the
// ledger has no audit trail: nothing is written and the error is nil.
// Errors: ErrNoActor, or the database's.
func AuditRefusal(ctx context.Context, db ledger.DBTX, rec RefusalRecord) error {
	if rec.Actor == "" {
		return ErrNoActor
	}
	k, err := ledger.Get(ctx, db, rec.Key)
	if errors.Is(err, ledger.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	// Attempts count per claim: a state left by an older claim is not this
	// one's.
	attempt := 0
	if st, err := store.GetState(ctx, db, rec.Key); err == nil && st.ClaimedAt.Equal(k.ClaimedAt) {
		attempt = st.Attempts
	}
	return store.InsertAudit(ctx, db, store.AuditEntry{Key: rec.Key, Tool: k.Tool, Attempt: attempt, Verdict: store.VerdictOperator,
		Action: rec.Action, Error: rec.What, Actor: rec.Actor})
}
