package reconcile

import (
	"context"
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/ledger/store"
	"github.com/ledgerkeeper/ledgerkeeper/probes"
)

// leaseMargin is the least lease left for a probe to start: the probe's
// timeout plus this, so the decision is written before the lease lapses
// and another replica may take the key.
const leaseMargin = 2 * time.Second

// handle probes one leased key and hands the answer to a writer.
func (t *toolRun) handle(ctx context.Context, l store.Leased, leasedAt time.Time) {
	p := t.p
	defer t.pace.inFlight.Done()
	if t.trialDone != nil {
		defer t.trialOnce.Do(func() { close(t.trialDone) })
	}
	release := func() {
		if p.opts.DryRun {
			return
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
		defer cancel()
		if err := store.ReleaseLease(rctx, p.e.pool, l.Key.Key, p.owner); err != nil {
			p.e.logger.Warn("release lease", "key", l.Key.Key, "err", err)
		}
	}
	// A stopping pass starts no probe: the key is given back, due at once.
	// So does a paused one (a downstream's Retry-After): no attempt counted.
	lim := t.limit()
	if lim.pausedFor() > 0 {
		t.pausedRelease(release)
		return
	}
	if ctx.Err() != nil || p.stopping() || t.isOpen() {
		release()
		return
	}
	// Per-tool, then global concurrency; held for the probe only.
	select {
	case t.sem <- struct{}{}:
	case <-ctx.Done():
		release()
		return
	case <-p.opts.Stop:
		release()
		return
	}
	// The tool's rate limit, shared by every pass of this process: waited
	// for holding the tool's slot only, so that a slow downstream never
	// holds a global slot another tool could use. A token that would come
	// too late for the lease is not taken; the key is given back.
	var latest time.Time
	if !p.opts.DryRun {
		latest = leasedAt.Add(p.e.cfg.Lease - t.policy.ProbeTimeout - leaseMargin)
	}
	if !lim.wait(ctx, p.opts.Stop, latest) {
		<-t.sem
		release()
		return
	}
	if lim.pausedFor() > 0 {
		<-t.sem
		t.pausedRelease(release)
		return
	}
	select {
	case p.sem <- struct{}{}:
	case <-ctx.Done():
		<-t.sem
		release()
		return
	case <-p.opts.Stop:
		<-t.sem
		release()
		return
	}
	free := func() { <-p.sem; <-t.sem }
	if lim.pausedFor() > 0 {
		free()
		t.pausedRelease(release)
		return
	}
	if t.isOpen() || p.stopping() {
		free()
		release()
		return
	}
	// Waited too long for a slot: the lease could lapse mid-probe and
	// another replica probe the key too. Give it back; it is due again.
	if !p.opts.DryRun && time.Until(leasedAt.Add(p.e.cfg.Lease)) < t.policy.ProbeTimeout+leaseMargin {
		free()
		release()
		p.e.logger.Debug("lease too short to probe; key given back", "key", l.Key.Key, "tool", t.tool)
		return
	}

	var res probes.Result
	started := time.Now()
	if t.policy.Probe == nil {
		// Not a probe failure: no probe ran, so no probe metric moves
		// and the breaker does not count it.
		res = probes.Result{Verdict: probes.Unknown, Err: errNoProbe}
	} else {
		res = t.policy.Probe.Probe(ctx, probes.Key{
			Key: l.Key.Key, Tool: l.Tool, RequestBody: l.RequestBody, CreatedAt: l.CreatedAt, ClaimedAt: l.ClaimedAt,
		})
		if _, throttled := probes.Throttled(res); p.e.metrics != nil && !throttled {
			p.e.metrics.observeProbe(t.tool, string(res.Verdict), time.Since(started))
		}
	}
	free()
	if after, ok := probes.Throttled(res); ok && t.policy.Probe != nil {
		// The downstream answered and asked us to wait: not a verdict, not
		// a failure. The key is given back as it was (attempts, back-off,
		// audit untouched: it stays due), the tool's probing pauses, and
		// the breaker counts nothing: the downstream is alive and we do
		// what it asked.
		until, started := lim.pause(after)
		t.pausedRelease(release)
		if started {
			p.e.logger.Warn("downstream asked to wait: probing paused, no attempt counted", "tool", t.tool,
				"retry_after", after, "paused_until", until, "err", p.e.cfg.Redactor.String(res.Err.Error()))
		}
		return
	}
	if ctx.Err() != nil {
		// Cancelled mid-probe (a graceful stop's grace ran out, or a hard
		// stop): whatever the probe said may be an artefact of the
		// cancellation. Give the key back; a crash is not an attempt. A
		// probe that answered within a graceful stop's grace (Options.Stop
		// closed, ctx alive) goes on to be written.
		release()
		return
	}
	t.mu.Lock()
	t.probed++
	t.mu.Unlock()
	// Counted as verdicts come, before the write, so that no probe starts
	// after the one that will open the breaker; the database's count, in
	// the decision's transaction, is what opens it.
	if t.policy.Probe != nil {
		t.recordVerdict(res.Verdict != probes.Unknown)
	}
	t.deliver(probed{t: t, l: l, res: res, leasedAt: leasedAt})
}
