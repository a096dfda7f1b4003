package reconcile

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/internal/safetext"
	"github.com/ledgerkeeper/ledgerkeeper/probes"
	"github.com/ledgerkeeper/ledgerkeeper/store"
)

// A tool's verdicts change the ledger only from inside a bracket: a trusted
// self-check finished before the batch's first probe was sent (the opener),
// and another, sent after the batch's last answer came back, finished
// trusted too (the closer). The closer of one batch opens the next, so a
// pass of B batches costs B+1 checks. Until its closer is in, a batch's
// answers are held in memory under their leases; a closer that is not
// trusted gives every key of the batch back untouched (no attempt, no
// back-off, no audit row), as an open breaker does. A stored check never
// vouches for a batch: the world may have changed since it ran.
//
//	 opener ──► lease, probe, lease, probe … ──► closer ──► trusted: write the
//	 (trusted)  (answers held, ≤ bracketSpan)     │        batch; closer opens
//	                                              │        the next batch
//	                                              └──────► otherwise: give the
//	                                                       keys back, stop
//
// A not_found is applied only when both checks of its bracket saw a
// present-side sample come back found (Policy.WitnessNotRequired turns that
// off); otherwise it is held like the rest of an unconfirmed batch and one
// probe_unwitnessed alert says how to add a canary. found and duplicate
// verdicts need no witness: the absent side vouches for them.

// bracketSpan is how long a batch takes new keys after its first was
// leased: long enough that the closing check (two probe round trips) is a
// small share of the batch's time at full concurrency (BENCHMARKS.md, "The
// self-check bracket"), short enough that answers wait well within their
// leases.
const bracketSpan = 2 * time.Second

// maxPausedClosers bounds how often a closing check interrupted by a
// downstream's Retry-After is run again in one pass.
const maxPausedClosers = 3

// Report actions of keys whose verdict was withheld (not decisions: nothing
// was written, the key is due again).
const (
	// ActionWithheldUntrusted: the batch's closing self-check was not
	// trusted (or could not conclude): no verdict of the batch was applied.
	ActionWithheldUntrusted = "withheld_untrusted"
	// ActionWithheldUnwitnessed: a not_found held because no present-side
	// sample of the bracket's checks came back found.
	ActionWithheldUnwitnessed = "withheld_unwitnessed"
)

// batch is a tool's open bracket: the trusted check that opened it and the
// answers waiting for its closer.
type batch struct {
	mu     sync.Mutex
	opener *CheckResult
	held   []probed
	leased int
	start  time.Time
	// leasesFrom is when the batch's oldest lease was taken or last
	// renewed (local monotonic time): its answers must be written before
	// leasesFrom + reconcile.lease.
	leasesFrom time.Time
	shape      json.RawMessage // a leased key's request body, for the made-up key
	// lastShape outlives take: the request body a re-run opener's
	// made-up key is shaped like.
	lastShape json.RawMessage
	closeNow  bool // close after the keys leased so far (half-open trial)
}

// noteLeased adds keys just leased to the batch.
func (b *batch) noteLeased(keys []store.Leased) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.leased == 0 {
		b.start = time.Now()
		b.leasesFrom = b.start
	}
	b.leased += len(keys)
	if b.shape == nil {
		for _, l := range keys {
			if len(l.RequestBody) > 0 {
				b.shape, b.lastShape = l.RequestBody, l.RequestBody
				break
			}
		}
	}
}

// due reports whether the batch should be closed before more keys join it.
func (b *batch) due() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.leased > 0 && (b.closeNow || time.Since(b.start) >= bracketSpan)
}

func (b *batch) hold(pr probed) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.held = append(b.held, pr)
}

// take empties the batch, returning what it held.
func (b *batch) take() (held []probed, shape json.RawMessage, opener *CheckResult, leasesFrom time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	held, shape, opener, leasesFrom = b.held, b.shape, b.opener, b.leasesFrom
	b.held, b.shape, b.leased, b.closeNow = nil, nil, 0, false
	return held, shape, opener, leasesFrom
}

// deliver hands a probed key on: to the writers at once for a tool whose
// self-check is off, or into the open batch, to wait for its closer.
func (t *toolRun) deliver(pr probed) {
	if t.bracketed {
		t.bk.hold(pr)
		return
	}
	t.p.decisions <- pr
}

// openBatch runs the check that opens the tool's first batch of the pass (due:
// a due key, modelling the made-up key's request). It reports whether the
// tool may be probed.
func (t *toolRun) openBatch(ctx context.Context, due json.RawMessage) (bool, error) {
	r, err := t.check(ctx, due, func(CheckResult) checkContext { return checkContext{} })
	if err != nil {
		return false, fmt.Errorf("self-check of tool %q: %w", t.tool, err)
	}
	t.mu.Lock()
	t.lastCheck = &r
	switch {
	case r.Paused:
		t.note = "downstream asked to wait (HTTP 429/503 Retry-After) during the self-check: no key probed, none changed; the next pass checks again"
	case !r.Trusted():
		t.untrusted = true
		t.note = "probe not trusted, no key changed: self-check " + r.Summary
	}
	t.mu.Unlock()
	if !r.Trusted() {
		return false, nil
	}
	t.bk.mu.Lock()
	t.bk.opener = &r
	if t.bk.lastShape == nil {
		t.bk.lastShape = due
	}
	t.bk.mu.Unlock()
	return true, nil
}

// openedBefore reports whether the batch's opening check began before at:
// then it vouches for no probe started after at.
func (b *batch) openedBefore(at time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.opener != nil && !at.IsZero() && b.opener.CheckedAt.Before(at)
}

// freshOpener makes sure the check that opens the next probes is fresh. A
// pause since the batch's opener: the answers from before it are closed
// (their closer, sent after the pause, opens what follows), and if none
// was held a new opener is run; the keys the pause gave back are probed
// only after it (mayStart holds them back until then). An idle tool share
// (no key leased) whose opener is older than bracketSpan runs a new one
// too. It reports whether the tool may be probed.
func (t *toolRun) freshOpener(ctx context.Context) (bool, error) {
	pausedSince := t.limit().pausedSince()
	t.bk.mu.Lock()
	afterPause := t.bk.opener != nil && !pausedSince.IsZero() && t.bk.opener.CheckedAt.Before(pausedSince)
	idle := t.bk.leased == 0 && t.bk.opener != nil && time.Since(t.bk.opener.CheckedAt) > bracketSpan
	leased, shape := t.bk.leased, t.bk.lastShape
	t.bk.mu.Unlock()
	switch {
	case afterPause && leased > 0:
		if goOn, err := t.closeBatch(ctx); !goOn || err != nil {
			return goOn, err
		}
		if !t.bk.openedBefore(pausedSince) {
			return true, nil // the closer, sent after the pause, opens
		}
	case !afterPause && !idle:
		return true, nil
	}
	return t.openBatch(ctx, shape)
}

// closeBatch waits for every key of the open batch to be answered, runs the
// closing check and applies the batch's verdicts only if it is trusted. It
// reports whether the tool's share of the pass goes on (the closer then
// opens the next batch).
func (t *toolRun) closeBatch(ctx context.Context) (bool, error) {
	p := t.p
	t.pace.inFlight.Wait()
	held, shape, opener, leasesFrom := t.bk.take()
	if len(held) == 0 {
		return true, nil // nothing to vouch for: the opener still opens
	}
	if ctx.Err() != nil {
		t.withhold(ctx, held, ActionWithheldUntrusted, "not applied: the pass was cancelled before the batch's closing self-check")
		return false, nil //nolint:nilerr // a cancel is no failure of the bracket: the held answers are withheld, as a failed check's would be
	}
	var notFound, unanswered int
	for _, pr := range held {
		switch {
		case pr.res.Verdict == probes.NotFound:
			notFound++
		case probes.Unreachable(pr.res):
			unanswered++
		}
	}
	witnessed := func(r CheckResult) bool {
		return t.policy.WitnessNotRequired || (opener != nil && opener.Witnessed() && r.Witnessed())
	}
	var r CheckResult
	var err error
	// The closer, and the writes after it, must end before the batch's
	// leases lapse: once lapsed, another replica may lease and probe the
	// same keys. closerTime bounds one closer (its two round trips).
	closerTime := 2*t.policy.ProbeTimeout + leaseMargin
	for try := 0; ; try++ {
		if held, leasesFrom = t.keepLeases(ctx, held, leasesFrom, closerTime); len(held) == 0 {
			return false, nil
		}
		r, err = t.check(ctx, shape, func(r CheckResult) checkContext {
			cc := checkContext{opener: opener, batchUnanswered: unanswered}
			if !witnessed(r) {
				cc.heldNotFound = notFound
			}
			return cc
		})
		// A downstream that asked to wait during the closer: its answers
		// are held under their leases while a short pause is waited out,
		// then the closer runs again; a long one gives the batch back.
		if err != nil || !r.Paused || try == maxPausedClosers {
			break
		}
		// Waited out only if the leases, renewed now, outlast the pause
		// and the closer after it.
		if t.limit().pausedFor()+closerTime >= p.e.cfg.Lease {
			break
		}
		if held, leasesFrom = t.keepLeases(ctx, held, leasesFrom, p.e.cfg.Lease); len(held) == 0 {
			return false, nil
		}
		if !t.awaitPause(ctx) {
			break
		}
	}
	t.mu.Lock()
	t.lastCheck = &r
	t.mu.Unlock()
	if err != nil {
		t.withhold(ctx, held, ActionWithheldUntrusted, "not applied: the batch's closing self-check failed: "+p.e.cfg.Redactor.String(err.Error()))
		return false, fmt.Errorf("closing self-check of tool %q: %w", t.tool, err)
	}
	if !r.Trusted() {
		why := "not applied: the batch's closing self-check was " + r.Summary
		if opener != nil {
			why += "; " + changedSince(*opener, r)
		}
		t.withhold(ctx, held, ActionWithheldUntrusted, why)
		t.mu.Lock()
		t.untrusted = true
		t.note = "probe not trusted after a batch, its verdicts withheld: self-check " + r.Summary
		t.mu.Unlock()
		p.e.logger.Warn("closing self-check not trusted: the batch's verdicts are withheld, its keys given back",
			"tool", t.tool, "keys", len(held), "outcome", r.Outcome, "summary", r.Summary)
		return false, nil
	}
	apply := held
	if !witnessed(r) {
		var hold []probed
		apply = apply[:0:0]
		for _, pr := range held {
			if pr.res.Verdict == probes.NotFound {
				hold = append(hold, pr)
			} else {
				apply = append(apply, pr)
			}
		}
		if len(hold) > 0 {
			t.withhold(ctx, hold, ActionWithheldUnwitnessed, "not_found held: no present-side sample of the self-check came back found; add a canary (ledgerkeeper probe canary add)")
			t.mu.Lock()
			t.note = fmt.Sprintf("%d not_found verdict(s) held: no present-side witness (probe_unwitnessed)", len(hold))
			t.mu.Unlock()
		}
	}
	// Handed to the writers in the background: the next batch is leased
	// and probed while this one is written (runTool waits for the hand-over
	// before it returns, so the writers' channel closes after it).
	t.handing.Go(func() {
		for _, pr := range apply {
			p.decisions <- pr
		}
	})
	t.bk.mu.Lock()
	t.bk.opener = &r
	t.bk.mu.Unlock()
	return true, nil
}

// keepLeases makes sure the held keys' leases have at least need left: when
// the oldest (taken or renewed at from) has less, all are renewed at once.
// Keys whose lease is no longer this pass's (lapsed and taken by another
// replica) are dropped from the batch: their answers are not ours to
// write, and the report lists them as withheld. It returns the keys kept
// and when their leases were renewed.
func (t *toolRun) keepLeases(ctx context.Context, held []probed, from time.Time, need time.Duration) ([]probed, time.Time) {
	p := t.p
	if p.opts.DryRun || time.Until(from.Add(p.e.cfg.Lease)) >= need {
		return held, from
	}
	keys := make([]string, len(held))
	for i, pr := range held {
		keys[i] = pr.l.Key.Key
	}
	renewedAt := time.Now()
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
	renewed, err := store.ExtendLeases(rctx, p.e.pool, keys, p.owner, p.e.cfg.Lease)
	cancel()
	if err != nil {
		p.e.logger.Warn("renew the leases of a batch waiting for its closing self-check", "tool", t.tool, "err", err)
		t.withhold(ctx, held, ActionWithheldUntrusted, "not applied: the batch's leases could not be renewed before its closing self-check")
		return nil, from
	}
	ours := make(map[string]bool, len(renewed))
	for _, k := range renewed {
		ours[k] = true
	}
	kept, lost := held[:0:0], []probed(nil)
	for _, pr := range held {
		if ours[pr.l.Key.Key] {
			kept = append(kept, pr)
		} else {
			lost = append(lost, pr)
		}
	}
	for _, pr := range lost {
		p.addWithheld(KeyResult{Key: pr.l.Key.Key, Tool: pr.l.Tool, Verdict: string(pr.res.Verdict), Action: ActionWithheldUntrusted,
			Attempts: pr.l.Attempts, Error: "not applied: its lease lapsed before the batch's closing self-check"})
	}
	return kept, renewedAt
}

// withhold gives back keys whose verdicts are not applied: leases released
// in one statement, attempts, back-off and audit untouched; each is listed
// in the report with why.
func (t *toolRun) withhold(ctx context.Context, held []probed, action, why string) {
	p := t.p
	why = safetext.Clip(why, maxErrorBytes)
	if !p.opts.DryRun {
		keys := make([]string, len(held))
		for i, pr := range held {
			keys[i] = pr.l.Key.Key
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
		defer cancel()
		if err := store.ReleaseLeases(rctx, p.e.pool, keys, p.owner); err != nil {
			p.e.logger.Warn("give back withheld keys", "tool", t.tool, "err", err) // their leases lapse
		}
	}
	for _, pr := range held {
		p.addWithheld(KeyResult{Key: pr.l.Key.Key, Tool: pr.l.Tool, Verdict: string(pr.res.Verdict), Action: action,
			Attempts: pr.l.Attempts, Error: why, AgeSecond: pr.l.Now.Sub(pr.l.ClaimedAt).Seconds()})
	}
}
