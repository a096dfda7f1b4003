// Package operator owns what an operator does to one key by hand, and the
// rules those acts follow: resolve, hold, release, and inspect's judgement
// of what a key's state means. The command line (cmd/ledgerkeeper) is only
// flags, wiring and output around it; another binding (a chat command, an
// agent's tool) would call the same functions and get the same refusals.
//
// Every judgement uses the database's clock, never the caller's: "in flight"
// for resolve is decided under the key's row lock by store.DecideOperator,
// and Inspect reads now() with the key and judges against it.
//
// # Resolve
//
// Resolve writes an operator's decision about a key, after they checked
// the downstream themselves: MarkCompleted stores the outcome retries will
// replay, MarkRetryable marks the key failed_retryable so a retry may redo
// the work. In the order they are checked, it refuses:
//
//   - a request without a reason (it goes into the audit trail), a code
//     that is not an HTTP status, a body that is not JSON, an outcome on
//     MarkRetryable (ErrInvalid: the caller's mistake, exit 2);
//   - a 5xx outcome unless Force: the caching rule stores definitive
//     outcomes only, and a stored 500 would be replayed to every retry
//     forever (ErrInvalid);
//   - a key not in the ledger (ErrNoKey);
//   - a completed key (final: only purge removes it), and MarkRetryable of a
//     key already failed_retryable (RefusedFinal, RefusedAlreadyRetryable);
//   - a held key (RefusedHeld): release it first;
//   - without the serve configuration (Windows nil) unless Force: the tool's
//     processing window is unknown, so "in flight" cannot be judged
//     (RefusedNoConfiguration);
//   - a key in flight unless Force: claimed less than its window + grace
//     ago, or heartbeating within its heartbeat_timeout, by the database's
//     clock under the row lock (RefusedInFlight; nothing written);
//   - a key that changed since it was read (finished, re-claimed, put on
//     hold in between): nothing changes, the refusal is audited
//     (RefusedChanged).
//
// MarkCompleted also applies to a failed_retryable key still owned by the
// attempt that was marked (no retry has re-claimed it, same claimed_at):
// the effect turned out to exist after all, and storing it stops the retry
// that would redo it. Every check that matters for safety is repeated by
// store.DecideOperator under the row lock; the earlier reads only give a
// clearer refusal. A resolved key's open alerts are resolved in the same
// transaction.
//
// # Hold and release
//
// Hold puts a key on hold: the reconciler neither probes nor decides it,
// purge keeps it and Resolve refuses it, until Release. A key already held
// is refused with the hold in force (RefusedAlreadyHeld: who, since when,
// why) unless Replace, which replaces it and audits the replaced hold. A
// hold binds ledgerkeeper only: the tool side still answers retries as the
// key's status says. Release of a key without a hold is ErrNotHeld. Both
// are audited (verdict "operator", actions "hold" and "release").
//
// # Inspect
//
// Inspect gathers a key's row, reconcile state (of its current claim),
// hold, audit trail and open alerts, and judges them (Judge):
//
//	processing, claimed < window ago or heartbeat < heartbeat_timeout ago → in flight: the reconciler leaves it alone
//	processing, otherwise                                                 → stuck: the reconciler's to probe
//	completed / failed_retryable                                          → settled
//	not in the ledger, audit trail remains                                → purged (or deleted): its history is all there is
//	not in the ledger, no audit trail                                     → ErrNoKey
//
// Held is reported beside the condition: a held key is never probed,
// decided or purged whatever its condition. A lease counts as active while
// it has not expired by the same clock.
package operator
