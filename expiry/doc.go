// Package expiry is ledgerkeeper's retention policy and the batched purge of
// expired idempotency keys (ARCHITECTURE.md, invariant 5).
//
// # Rules
//
// A key is purged when all of these hold, checked when it is chosen and
// again, on the row as it then is, by the DELETE that removes it:
//
//   - its status is completed or failed_retryable: a processing key's
//     outcome is unknown, so it is never deleted, whatever its age;
//   - expires_at < now() (the database's clock);
//   - created_at < now() - floor, where the floor is retention.min_age or
//     the tool's retention.tools.<tool>.min_age (config refuses a floor
//     shorter than the tool's processing window plus grace);
//   - it is not on hold (key_holds): holds are absolute (invariant 10). A
//     hold that commits while the DELETE waits on the key's row (PutHold
//     locks the row first) is caught by a second look under a fresh
//     snapshot, and the batch is rolled back and chosen again without it.
//
// Its reconcile_state row goes with it. Expired processing keys are counted
// on each pass and each gets one expired_processing alert in the outbox, in
// the transaction that read its page of keys (invariant 8), de-duplicated
// per key for renotify_after, so a key is alerted once, not once per pass;
// at most MaxAlertsPerPass are raised per pass. Held keys are not alerted:
// the hold is the operator's acknowledgement.
//
// The daemon's own tables are trimmed by AuditMaxAge: reconcile_audit rows,
// sent alert_outbox rows (pending ones never), resolved alert_state rows,
// ledgerkeeper_runs (keeping the newest of each kind), and reconcile_state
// rows whose key no longer exists.
//
// # Alerts
//
// This package does not import package alerts, which owns alert_outbox and
// alert_state: it asks for what it needs through Config.Alerts (the Alerts
// interface: raise one expired_processing alert inside a given transaction,
// and the alert tables to trim with their statements).
// internal/daemon.PurgeAlerts is the implementation every binary wires. A
// statement timeout on an alert-table batch shrinks the next batch like
// one on the ledger's (store.AsBatchTimeout).
//
// # One pass
//
//	RunOnce ── dedicated connection ── pg_try_advisory_lock ──✗──► Report{AlreadyRunning}
//	                                          │ ✓
//	                                          ▼
//	             count + alert expired processing keys (bounded)
//	                                          │
//	                                          ▼
//	   ┌──► budget left? ──no──► stop between batches (BudgetExhausted; the next pass carries on)
//	   │          │ yes
//	   │          ▼
//	   │   batch: one transaction, ≤ size rows (see store.PurgeExpiredBatch)
//	   │          │
//	   │          ▼
//	   └── pause (pacing) ◄── more rows?  ── no ──► daemon tables, same loop ──► RecordRun, unlock
//
// The lock is a session advisory lock on a connection held for the pass:
// one purge at a time across replicas and operators (invariant 7), and if
// the process dies, the connection and the lock die with it. Every batch is
// its own short transaction, so a pass stopped anywhere (budget, error,
// kill -9) loses nothing: what was deleted stays deleted, the rest waits
// for the next pass. Batches page by keyset on (expires_at, key), so later
// batches do not rescan the index entries of rows deleted before them, and
// delete the purgeable rows of the keyset range they chose (no ctid, so the
// statement also runs on engines without one); Config.BatchShape selects
// the ctid or primary-key shape instead (BENCHMARKS.md, "Portable purge").
//
// # Pacing
//
// A purge hurts the tool servers' writers through its duty cycle (CPU and
// WAL), not its locks (BENCHMARKS.md, "Purge"). So the purger holds
// the fraction of wall time spent inside DELETE transactions at or under
// DutyCycle: after a batch that took d, it pauses
//
//	max(BatchPause, d × (1 - DutyCycle) / DutyCycle)
//
// and it sizes batches by their duration: a batch longer than BatchTarget
// shrinks the next one in proportion (size × target / d, at most halving
// it); a batch that hit
// the statement timeout (BatchTimeout, rolled back whole) cuts it to a
// quarter; a batch well under the target (< ¾ of it) grows the next by a
// tenth, so the size creeps back after a slow spell instead of bouncing.
// Sizes stay within [BatchSize/10, BatchSize]. The pass stops between
// batches when MaxDuration is spent, and does not start a pause that would
// end past it.
package expiry
