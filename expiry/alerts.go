package expiry

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/store"
)

// Alerts is what a purge pass needs of the alert tables, which package
// alerts owns: raising expired_processing alerts, and trimming the tables
// by AuditMaxAge. expiry defines it so as not to import alerts; the wiring
// passes the alerts-backed implementation (internal/daemon.PurgeAlerts).
type Alerts interface {
	// ExpiredProcessing raises the expired_processing alert of k inside tx,
	// the transaction that listed k, so that the alert exists if and only
	// if that observation does (invariant 8). An alert of k raised less
	// than renotifyAfter ago and not resolved since is not raised again;
	// it reports whether it raised one.
	ExpiredProcessing(ctx context.Context, tx pgx.Tx, k store.ExpiredKey, renotifyAfter time.Duration) (raised bool, err error)
	// Tables lists the alert tables a pass trims by AuditMaxAge, in the
	// order it trims them.
	Tables() []Table
}

// Table is one of ledgerkeeper's own tables that a pass trims by
// AuditMaxAge, with the statements of the package that owns it.
type Table struct {
	// Name is the table's name, as Report.Deleted and DryRunReport.Tables
	// give it.
	Name string
	// Purge deletes up to limit rows past maxAge in one statement (its own
	// transaction on the pass's connection) and returns how many it
	// deleted; a batch that deletes fewer than limit ends the table.
	Purge func(ctx context.Context, db ledger.DBTX, maxAge time.Duration, limit int) (int64, error)
	// Count counts what Purge would delete, all batches together (for a dry
	// run).
	Count func(ctx context.Context, db ledger.DBTX, maxAge time.Duration) (int64, error)
}

// ledgerTable is a Table of package ledger's own.
func ledgerTable(t store.DaemonTable) Table {
	return Table{
		Name: string(t),
		Purge: func(ctx context.Context, db ledger.DBTX, maxAge time.Duration, limit int) (int64, error) {
			return store.PurgeDaemonBatch(ctx, db, t, maxAge, limit)
		},
		Count: func(ctx context.Context, db ledger.DBTX, maxAge time.Duration) (int64, error) {
			return store.CountDaemonPurge(ctx, db, t, maxAge)
		},
	}
}

// DaemonTables lists every table a pass trims by AuditMaxAge, in the order
// it trims them: the audit, the alert tables, the run records, orphaned
// reconcile_state rows.
func (p *Purger) DaemonTables() []Table {
	out := []Table{ledgerTable(store.TableAudit)}
	out = append(out, p.cfg.Alerts.Tables()...)
	return append(out, ledgerTable(store.TableRuns), ledgerTable(store.TableOrphanState))
}
