// Package reconcile is ledgerkeeper's engine: it finds idempotency keys stuck
// in processing past their tool's window, asks the downstream through the
// tool's probe whether the effect exists, and records a decision.
//
// # One pass
//
//	for each tool with processing keys (in parallel, bounded):
//	    breaker open? ── yes ──► skip the tool this pass (its keys untouched)
//	    half-open?    ── another replica has the trial ──► skip
//	    probe trusted? (self-check) ── no ──► skip, probe_untrusted alert
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
// deadline). A graceful stop (Options.Stop closed, ctx still alive: serve's
// shutdown grace) leases nothing more and starts no probe, gives back the
// keys leased but not yet probing, and lets the probes in flight finish and
// their decisions be written; cancelling ctx then gives back what still
// runs. Either way the run is recorded as stopped (ledgerkeeper_runs: no
// error, stats "stopped": true; reconcile_passes_total{result="stopped"}),
// not failed.
//
// # Probe self-check
//
// A verdict changes the ledger only when it is evidence, and a probe broken
// on day one (a typo'd path, a renamed field, a filter the downstream
// ignores, wrong credentials) answers wrongly for every key alike. So before
// a pass writes any decision for a tool, the tool's probe is checked against
// the ledger's own ground truth:
//
//	present side  up to self_check.samples keys of the tool that its tool
//	              server completed itself (no reconciler or operator
//	              decision in the audit) within self_check.max_age, newest
//	              first: each must come back found, and every
//	              response_body field both outcomes have must be equal
//	absent side   one made-up key (SelfCheckKeyPrefix + random, with a
//	              request body of the same shape and made-up values): it
//	              must come back not_found
//
//	outcome       when                                  effect
//	untrusted     the absent side failed, or most       no key of the tool
//	              samples failed (all, when fewer       changes state; one
//	              than three were drawn)                probe_untrusted alert
//	inconclusive  the downstream did not answer the     no key changes state;
//	              absent side, or answered no sample    unanswered probes
//	              (probes.Unreachable)                  count for the breaker
//	trusted       otherwise; failed samples are         verdicts are acted on;
//	              disagreements (one record deleted     disagreements counted
//	              or changed downstream), reported
//
// A trusted check is stored in probe_self_checks and vouches for
// self_check.interval for the same probe configuration (Policy's
// ProbeFingerprint), whichever replica made it; any other result is checked
// again on the next pass. With no eligible key, the absent side decides
// alone ("present side unverified").
//
// # Circuit breaker
//
// Consecutive unknown verdicts of a tool (not no_probe) are counted in
// tool_breakers inside the transactions that record them, across passes and
// replicas; a conclusive verdict resets the count. At breaker.failures the
// breaker opens: probing the tool stops for breaker.cooldown, doubling on
// each re-open up to breaker.max_cooldown; one downstream_unreachable alert
// goes out for the tool (not one per key), keys left unprobed keep their
// attempt counts and back-off, and per-key probe_failing alerts are held
// back while it is open. After the cooldown the breaker is half-open: the
// replica that claims the trial (tool_breakers.trial_until) sends one probe
// (or the self-check, when one is due); unknown re-opens it, conclusive
// closes it and resolves the alert. Within a pass the count is also kept in
// memory, so that no probe starts after the verdict that will open it.
//
// # Evidence
//
// Probe errors and evidence pass through the configuration's redactor
// (registered secrets) and internal/safetext (valid UTF-8, no NUL, bounded)
// before they are stored or sent. A decision the database still refuses
// because of its evidence is retried once with the evidence replaced by a
// note of what was dropped: no downstream answer can leave a key undecided.
package reconcile
