// Package reconcile is ledgerkeeper's engine: it finds idempotency keys stuck
// in processing past their tool's window, asks the downstream through the
// tool's probe whether the effect exists, and records a decision.
//
// # One pass
//
//	for each tool with processing keys (in parallel, bounded):
//	    breaker open? ── yes ──► skip the tool this pass (its keys untouched)
//	    half-open?    ── another replica has the trial ──► skip
//	    opening self-check trusted? ── no ──► skip, probe_untrusted alert
//	    loop, one batch at a time (up to 2 s of leases):
//	        LeaseDue (FOR NO KEY UPDATE SKIP LOCKED + lease row; committed)
//	        for each leased key (bounded: global and per-tool concurrency):
//	            probe   ── no row lock is held while it runs ──
//	            hold the answer (self-check off: straight to decide)
//	        closing self-check trusted? ── no ──► give the batch back, stop
//	        for each held answer (not_found: only with a witness):
//	            decide  ── one transaction per group: compare-and-set
//	                       transition, bookkeeping, audit row, alerts
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
// whose probe has finished and whose batch's closing check passed is still
// written (with a short, detached deadline), while answers still waiting
// for their closer are given back. A graceful stop (Options.Stop closed, ctx
// still alive: serve's shutdown grace) leases nothing more and starts no
// key's probe, gives back the keys leased but not yet probing, lets the
// probes in flight finish, runs the last batch's closing check (its only
// probes after the stop) and writes the batch if it passed; cancelling ctx
// then gives back what still runs. Either way the run is recorded as stopped (ledgerkeeper_runs: no
// error, stats "stopped": true; reconcile_passes_total{result="stopped"}),
// not failed.
//
// # Probe self-check and the bracket
//
// A verdict changes the ledger only when it is evidence, and a probe broken
// on day one (a typo'd path, a renamed field, a filter the downstream
// ignores, wrong credentials) or by a change in the world (an ingress that
// begins answering every path with its own 404 page) answers wrongly for
// every key alike. So the tool's probe is checked against the ledger's own
// ground truth:
//
//	absent side   one made-up key (SelfCheckKeyPrefix + random, with a
//	              request body shaped like a sample's, a canary's or a due
//	              key's, its values made up): it must come back not_found.
//	              Probed first and alone: unanswered, no sample is sent
//	present side  up to self_check.samples effects known to exist, in
//	              order: keys of the tool its tool server completed itself
//	              (no reconciler or operator decision in the audit) within
//	              self_check.max_age, newest first; canaries (declared in
//	              tools.T.probe.self_check.canaries, or marked with
//	              `ledgerkeeper probe canary add`); the tool's newest key
//	              completed by its tool server at any age (witness only: it
//	              may be gone downstream, so its absence is no failure).
//	              Each must come back found, every response_body field both
//	              outcomes have equal
//
//	outcome       when                                  effect
//	untrusted     the absent side failed, or most       no key of the tool
//	              judged samples failed (all, when      changes state; one
//	              fewer than three)                     probe_untrusted alert
//	inconclusive  the absent side was not answered or   no key changes state;
//	              could not be rendered, or samples     unanswered probes
//	              were judged (not witness-only) and    count for the breaker;
//	              none was found                        no alert
//	trusted       otherwise; failed samples are         verdicts are acted on;
//	              disagreements (one record deleted     disagreements counted
//	              or changed downstream), reported
//
// Every batch of a tool's verdicts is bracketed (bracket.go): a check
// trusted before its first probe (the opener: fresh for every pass, never a
// stored one) and another sent after its last answer (the closer, which
// opens the next batch: B batches cost B+1 checks, plus a rerun of a closer
// interrupted by a short Retry-After). The batch's answers wait in memory,
// under their leases (renewed when the closer or a pause would outlast
// them; a pause they cannot outlast gives the batch back), for the closer;
// a closer that is not trusted gives the whole batch back (no attempt, no
// back-off, no audit row, report action withheld_untrusted) and, when
// untrusted, its probe_untrusted alert says what changed since the opener.
// Batches of the pass already closed by a trusted check are still written.
// A not_found is applied only when each check of its bracket saw a
// present-side sample (any of them) come back found; otherwise it is held
// (withheld_unwitnessed) and one probe_unwitnessed alert says how to add a
// canary. found and duplicate verdicts need no witness. The bracket holds
// for every pass alike: serve's, `reconcile`, `reconcile --key`, a
// half-open trial. Checks are stored in probe_self_checks for `status` and
// `probe check`; a stored check vouches for nothing.
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
// replica that claims the trial (tool_breakers.trial_until) runs the
// opening self-check, whose made-up key goes first and alone: one request
// to a downstream still down; unknown re-opens it, conclusive closes it and
// resolves the alert. The self-check's unanswered probes are counted before
// any key of the tool is probed, and when a closing check cannot conclude,
// the batch's unanswered probes count too. Within a pass the count is also
// kept in memory, so that no probe starts after the verdict that will open
// it. An opening is logged, counted and alerted once, however many keys the
// writer group that opened it held.
//
// # Evidence
//
// Probe errors and evidence pass through the configuration's redactor
// (registered secrets) and internal/safetext (valid UTF-8, no NUL, bounded)
// before they are stored or sent. A decision the database still refuses
// because of its evidence is retried once with the evidence replaced by a
// note of what was dropped: no downstream answer can leave a key undecided.
package reconcile
