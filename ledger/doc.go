// Package ledger owns the idempotency_keys table: its model, every SQL
// statement that touches it, the tool-side API (Claim, Complete, Heartbeat,
// Abandon) with its net/http middleware, and the compare-and-set transitions
// the reconciler needs.
//
// # Key lifecycle
//
//	              Claim (INSERT ... ON CONFLICT DO NOTHING)
//	                          │
//	                          ▼
//	   ┌──────────────── processing ◄──────────────────┐
//	   │ Complete /           │ MarkRetryable          │ Claim of the same
//	   │ CompleteFromProbe /  │ (positive evidence     │ request: re-claimed
//	   │ operator             │  of absence) / Abandon │ with a fresh claimed_at
//	   ▼                      ▼                        │
//	completed ◄──────── failed_retryable ──────────────┘
//	(terminal)  Complete by the original
//	            attempt (same claimed_at)
//
// Every transition is compare-and-set: it names the status and the
// claimed_at it read, so a write based on a stale read changes nothing and
// reports ErrConflict. The one edge a reader may not expect
// (ARCHITECTURE.md, "Transitions"), failed_retryable → completed, is taken
// only by the attempt that owns the row's claimed_at (or by an operator's
// resolve --completed): if the original attempt finishes after the reconciler
// judged it absent, and no retry has re-claimed the key yet, its real outcome
// is kept instead of being lost (and redone by the next retry).
//
// # Caching rule
//
// Definitive outcomes are stored: 2xx, and 4xx that are validation or
// business rejections. An unresolved technical failure (5xx, timeout, crash)
// is never stored: the key stays processing for the reconciler, so a retry
// gets 409 until the downstream has been asked whether the effect happened.
//
// # Time
//
// Every comparison of timestamps uses the database's clock (now()), never a
// replica's, so clock skew between hosts cannot shorten a processing window.
package ledger
