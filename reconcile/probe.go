package reconcile

import (
	"context"
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/probes"
	"github.com/ledgerkeeper/ledgerkeeper/store"
)

// leaseMargin is the least lease left for a probe to start: the probe's
// timeout plus this, so the decision is written before the lease lapses
// and another replica may take the key.
const leaseMargin = 2 * time.Second

// handle probes one leased key and hands the answer on: into the tool's
// open batch, or to a writer. Whatever happens, the key's lease is given
// back in one place (heldKey.done) unless the answer was handed on, and its
// probe slots are taken in one place and given back in one (probeKey).
func (t *toolRun) handle(ctx context.Context, l store.Leased, leasedAt time.Time) {
	defer t.pace.inFlight.Done()
	if t.trialDone != nil {
		defer t.trialOnce.Do(func() { close(t.trialDone) })
	}
	k := &heldKey{t: t, l: l}
	defer k.done(ctx)
	res, ok := t.probeKey(ctx, k, leasedAt)
	if !ok {
		return
	}
	k.handedOn = true // the batch or the writer owns the lease now
	t.deliver(probed{t: t, l: l, res: res, leasedAt: leasedAt, answeredAt: time.Now()})
}

// heldKey is a leased key on its way through handle.
type heldKey struct {
	t        *toolRun
	l        store.Leased
	handedOn bool // its answer went on: the lease is no longer handle's
	// paused: given back because the tool is paused, so that the pass
	// leases it again once the pause is over (resumeAfterPause).
	paused bool
}

// done gives the key back unless its answer was handed on: the lease is
// released, no attempt is counted, and the key is due again at once.
func (k *heldKey) done(ctx context.Context) {
	if k.handedOn {
		return
	}
	p := k.t.p
	if k.paused {
		k.t.pace.givenBack.Store(true)
	}
	p.countGivenBack(k.l.Key.Key)
	if p.opts.DryRun {
		return
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
	defer cancel()
	if err := store.ReleaseLease(rctx, p.e.pool, k.l.Key.Key, p.owner); err != nil {
		p.e.logger.Warn("release lease", "key", k.l.Key.Key, "err", err)
	}
}

// probeKey takes the key's probe slots, sends its probe if it may still
// start, and returns the answer to hand on; ok false: the key goes back (k
// notes a pause). The slots are held until the answer has been counted
// for the breaker and a throttled answer has paused the tool, so that no
// probe of the tool starts between an answer and what it changes.
func (t *toolRun) probeKey(ctx context.Context, k *heldKey, leasedAt time.Time) (res probes.Result, ok bool) {
	p := t.p
	lim := t.limit()
	s := slots{t: t}
	defer s.release()
	switch s.acquire(ctx, lim, t.lastStart(leasedAt)) {
	case startPaused:
		k.paused = true
		return res, false
	case startLate:
		p.e.logger.Debug("lease too short to probe; key given back", "key", k.l.Key.Key, "tool", t.tool)
		return res, false
	case startRefused:
		return res, false
	}

	if t.policy.Probe == nil {
		// Not a probe failure: no probe ran, so no probe metric moves
		// and the breaker does not count it.
		res = probes.Result{Verdict: probes.Unknown, Err: errNoProbe}
	} else {
		l := k.l
		started := time.Now()
		res = t.policy.Probe.Probe(ctx, probes.Key{
			Key: l.Key.Key, Tool: l.Tool, RequestBody: l.RequestBody, CreatedAt: l.CreatedAt, ClaimedAt: l.ClaimedAt,
		})
		if after, throttled := probes.Throttled(res); throttled {
			// The downstream answered and asked us to wait: not a verdict,
			// not a failure. The key is given back as it was (attempts,
			// back-off, audit untouched: it stays due), the tool's probing
			// pauses, and the breaker counts nothing: the downstream is
			// alive and we do what it asked.
			until, began := lim.pause(after)
			k.paused = true
			if began {
				p.e.logger.Warn("downstream asked to wait: probing paused, no attempt counted", "tool", t.tool,
					"retry_after", after, "paused_until", until, "err", p.e.cfg.Redactor.String(res.Err.Error()))
			}
			t.sharePause(ctx, until)
			return res, false
		}
		if p.e.metrics != nil {
			p.e.metrics.observeProbe(t.tool, string(res.Verdict), time.Since(started))
		}
	}
	if ctx.Err() != nil {
		// Cancelled mid-probe (a graceful stop's grace ran out, or a hard
		// stop): whatever the probe said may be an artefact of the
		// cancellation. Give the key back; a crash is not an attempt. A
		// probe that answered within a graceful stop's grace (Options.Stop
		// closed, ctx alive) goes on to be written.
		return res, false
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
	return res, true
}

// lastStart is the latest time a key leased at leasedAt may start its
// probe: its lease must outlast the probe's timeout plus leaseMargin. Zero
// (no bound) in a dry run, which leases nothing.
func (t *toolRun) lastStart(leasedAt time.Time) time.Time {
	if t.p.opts.DryRun {
		return time.Time{}
	}
	return leasedAt.Add(t.p.e.cfg.Lease - t.policy.ProbeTimeout - leaseMargin)
}

// startGate is whether a key may go on towards its probe.
type startGate int

const (
	startGo      startGate = iota
	startRefused           // the pass stops or was cancelled, or the tool's breaker opened
	startPaused            // the downstream asked to wait (Retry-After)
	startLate              // too little lease left: the probe could outlast it
)

// judgeStart is the rule for a key on its way to its probe: a stopping,
// cancelled or breaker-stopped tool starts no probe; a paused one gives the
// key back to be leased after the pause; and no probe starts after
// lastStart (zero: no bound), or another replica could take the key while
// it runs.
func judgeStart(paused, refused bool, now, lastStart time.Time) startGate {
	switch {
	case paused:
		return startPaused
	case refused:
		return startRefused
	case !lastStart.IsZero() && now.After(lastStart):
		return startLate
	}
	return startGo
}

// mayStart judges the key now (judgeStart). A key of a batch whose opening
// check is older than the tool's latest pause waits like a paused one: it
// goes back, to be probed after a fresh check (freshOpener).
func (t *toolRun) mayStart(ctx context.Context, lim *toolLimit, lastStart time.Time) startGate {
	paused := lim.pausedFor() > 0 || (t.bracketed && t.bk.openedBefore(lim.pausedSince()))
	return judgeStart(paused, ctx.Err() != nil || t.p.stopping() || t.isOpen(), time.Now(), lastStart)
}

// slots are the probe slots one key holds: its tool's (Policy.Concurrency)
// and the pass's (Config.Concurrency, every tool together).
type slots struct {
	t          *toolRun
	tool, pass bool
}

// acquire takes the tool's slot, a token of its rate limit, then a slot of
// the pass, and reports whether the key may start its probe. The rate limit
// (shared by every pass of the process) is waited for holding the tool's
// slot only, so that a slow downstream never holds a global slot another
// tool could use; a token that would come after lastStart is not taken.
// The key is judged (mayStart) before each wait and after the last: one
// whose tool paused, stopped or ran out of lease meanwhile goes back
// without waiting for the rest. What acquire took, release gives back.
func (s *slots) acquire(ctx context.Context, lim *toolLimit, lastStart time.Time) startGate {
	t, p := s.t, s.t.p
	waits := [...]func() bool{
		func() bool { return s.take(ctx, t.sem, &s.tool) },
		func() bool { return lim.wait(ctx, p.opts.Stop, lastStart) },
		func() bool { return s.take(ctx, p.sem, &s.pass) },
	}
	for _, wait := range waits {
		if g := t.mayStart(ctx, lim, lastStart); g != startGo {
			return g
		}
		if !wait() {
			return startRefused
		}
	}
	return t.mayStart(ctx, lim, lastStart)
}

// take waits for a place in sem, unless ctx ends or the pass stops first.
func (s *slots) take(ctx context.Context, sem chan struct{}, held *bool) bool {
	select {
	case sem <- struct{}{}:
		*held = true
		return true
	case <-ctx.Done():
	case <-s.t.p.opts.Stop:
	}
	return false
}

// release gives back the slots held.
func (s *slots) release() {
	if s.pass {
		<-s.t.p.sem
	}
	if s.tool {
		<-s.t.sem
	}
	s.tool, s.pass = false, false
}
