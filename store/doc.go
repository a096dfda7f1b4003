// Package store is the reconciler's and the operator's side of the
// idempotency ledger: everything on idempotency_keys and its bookkeeping
// tables that a tool server never calls. Package ledger (which this one
// imports for Key, the statuses, DBTX and the sentinel errors) is the tool
// side.
//
// It owns the SQL of these tables:
//
//   - idempotency_keys, the reconciler's reads and transitions: leases of
//     due keys (LeaseDue, PeekDue, ProcessingTools), the compare-and-set
//     decisions on one write path for two kinds, the reconciler's (Decision,
//     always under its lease: Decide, DecideMany) and an operator's
//     (OperatorDecision: no lease, in flight judged by the database's clock
//     under the row lock unless Force: DecideOperator); KeyStanding,
//     Statuses, stats and the p99 processing time; the purge of expired keys
//     (PurgeExpiredBatch, under the purge lock).
//   - reconcile_state: per-attempt bookkeeping and the lease (GetState,
//     ReleaseLease(s)); orphans trimmed by PurgeDaemonBatch.
//   - reconcile_audit: every decision (InsertAudit, History).
//   - key_holds: operator holds (PutHold, ReplaceHold, ReleaseHold; ErrHeld).
//   - tool_breakers: the breaker's rows (LoadBreaker, CountBreakerFailures,
//     OpenBreaker, ResetBreaker, ClaimBreakerTrial).
//   - probe_self_checks: self-check samples (SelfCheckSamples, and
//     NewestGroundTruth at any age) and records.
//   - probe_canaries: effects operators marked as known to exist downstream,
//     the self-check's present-side witnesses (AddCanary, RemoveCanary,
//     Canaries; audited as canary_added and canary_removed; never purged).
//   - ledgerkeeper_runs: RecordRun, LastRuns, and their trimming.
//   - stuck_samples: the console's chart of stuck keys, one row per tool
//     per 5-minute bucket (RecordStuckSamples, StuckSamplesSince); its
//     bucket and pruning cutoff are bound by the caller, not now().
//
// Every comparison of timestamps uses the database's clock (now()), as in
// package ledger. A write based on a stale read changes nothing: each
// transition names the status and claimed_at it read, and re-checks them
// under the row lock (queueDecision).
package store
