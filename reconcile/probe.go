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
		if p.e.metrics != nil {
			p.e.metrics.observeProbe(t.tool, string(res.Verdict), time.Since(started))
		}
	}
	free()
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
	p.decisions <- probed{t: t, l: l, res: res, leasedAt: leasedAt}
}
