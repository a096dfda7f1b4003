// Package reconcile is ledgerkeeper's engine: it finds idempotency keys stuck
// in processing past their tool's window, asks the downstream through the
// tool's probe whether the effect exists, and records a decision.
//
// # One pass
//
//	for each tool with processing keys (in parallel, bounded):
//	    breaker open? ── yes ──► skip the tool this pass (its keys untouched)
//	    loop:
//	        LeaseDue (FOR NO KEY UPDATE SKIP LOCKED + lease row; committed)
//	        for each leased key (bounded: global and per-tool concurrency):
//	            probe   ── no row lock is held while it runs ──
//	            decide  ── one transaction: compare-and-set transition,
//	                       bookkeeping, audit row, alerts into the outbox
//
// # Decisions
//
//	verdict      key past dedup window?  decision
//	found        —                       completed with the probe's outcome
//	not_found    no                      failed_retryable (after a second
//	                                     not_found confirm_not_found_after
//	                                     later, when set)
//	not_found    yes                     stays processing, escalated at once
//	duplicate    —                       stays processing, alerted at once
//	unknown      —                       stays processing, attempts+1, back-off,
//	no probe                             alerted past alert_after_attempts or
//	                                     alert_after_age
//
// Every write is conditional on what was probed (status processing, the same
// claimed_at, our lease, no hold). When the original attempt finished while
// the probe ran, nothing is overwritten and the audit says
// "resolved_by_original".
//
// # Crashes and cancellation
//
// A lease that expires without a decision (the process died) makes the key
// due again at once: a crash is not a failed attempt. A pass cancelled
// mid-probe gives its leases back without counting an attempt; a decision
// whose probe has finished is still written (with a short, detached
// deadline), so a graceful stop loses no evidence.
//
// # Circuit breaker
//
// After breaker.failures consecutive unknown verdicts for one tool in a pass
// (one, when the breaker has opened before and not yet closed), probing that
// tool stops for breaker.cooldown, doubling on each re-open up to
// breaker.max_cooldown; one downstream_unreachable alert goes out for the
// tool (not one per key), keys left unprobed keep their attempt counts, and
// per-key probe_failing alerts for the tool are held back while it is open.
// A conclusive verdict closes it and resolves the alert.
package reconcile
