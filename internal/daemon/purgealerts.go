package daemon

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerkeeper/ledgerkeeper/alerts"
	"github.com/ledgerkeeper/ledgerkeeper/expiry"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/store"
)

// PurgeAlerts is the purger's way to the alert tables (expiry.Alerts),
// backed by package alerts: expiry does not import alerts, so the wiring
// (`serve`, `purge`, lkbench) passes this in expiry.Config.Alerts.
type PurgeAlerts struct{}

var _ expiry.Alerts = PurgeAlerts{}

// ExpiredProcessing raises k's expired_processing alert with alerts.Raise,
// inside tx (invariant 8).
func (PurgeAlerts) ExpiredProcessing(ctx context.Context, tx pgx.Tx, k store.ExpiredKey, renotifyAfter time.Duration) (bool, error) {
	return alerts.Raise(ctx, tx, alerts.Alert{
		Reason: alerts.ReasonExpiredProcessing,
		Tool:   k.Tool,
		Key:    k.Key,
		Details: alerts.Details{
			ClaimedAt: &k.ClaimedAt,
			CreatedAt: &k.CreatedAt,
			ExpiresAt: &k.ExpiresAt,
			Note:      "processing past expires_at: purge keeps it until it is resolved (ledgerkeeper resolve)",
		},
	}, renotifyAfter)
}

// Tables returns the alert tables purge trims by audit_max_age: sent
// outbox rows (alerts.PurgeSent), then resolved alert state
// (alerts.TrimState).
func (PurgeAlerts) Tables() []expiry.Table {
	return []expiry.Table{
		{
			Name: alerts.TableOutbox,
			Purge: func(ctx context.Context, db ledger.DBTX, maxAge time.Duration, limit int) (int64, error) {
				return alerts.PurgeSent(ctx, db, maxAge, limit)
			},
			Count: func(ctx context.Context, db ledger.DBTX, maxAge time.Duration) (int64, error) {
				return alerts.CountPurgeableSent(ctx, db, maxAge)
			},
		},
		{
			Name: alerts.TableState,
			Purge: func(ctx context.Context, db ledger.DBTX, maxAge time.Duration, limit int) (int64, error) {
				return alerts.TrimState(ctx, db, maxAge, limit)
			},
			Count: func(ctx context.Context, db ledger.DBTX, maxAge time.Duration) (int64, error) {
				return alerts.CountTrimmableState(ctx, db, maxAge)
			},
		},
	}
}
