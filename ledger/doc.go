// Package ledger is the tool side of the idempotency ledger, and all a tool
// server needs to import: the idempotency_keys model (Key, the statuses, the
// column widths, the sentinel errors), Claim, Complete, Heartbeat, Abandon
// and Get; Run, which applies them to one call of a tool whatever its
// transport; the net/http Middleware, a thin adapter over Run (package
// ledger/mcpkey is the MCP one); Fingerprint, the request_hash of a
// request's arguments; and NewPool and FollowPrimary, a pgxpool that
// follows the writable primary across failovers (a node that turned
// read-only, went into recovery or shut down is left by every connection),
// with FailoverReason and NothingWritten, the classification of the errors
// a failover produces.
//
// The reconciler's and the operator's side of the same table (leases,
// decisions, holds, breakers, self-checks, stats, purge, audit) is package
// store, in the daemon's module (github.com/ledgerkeeper/ledgerkeeper/store),
// which imports this one; this module (ledger/go.mod) does not require the
// daemon's, so a tool server never sees LeaseDue or DecideMany, nor builds
// against the daemon's requirements.
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
// Claim, Complete, Heartbeat and Abandon are here; the reconciler's
// transitions (a probe's completion, MarkRetryable) and the operator's are
// store's. Every transition is compare-and-set: it names the status and the
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
// business rejections. An unresolved technical failure (5xx, timeout, crash),
// a "try again later" (408, 425, 429) and an MCP tool error are never
// stored: the key stays processing for the reconciler, so a retry gets 409
// until the downstream has been asked whether the effect happened.
// Definitive is this rule, once, for every transport.
//
// # Time
//
// Every comparison of timestamps uses the database's clock (now()), never a
// replica's, so clock skew between hosts cannot shorten a processing window.
package ledger
