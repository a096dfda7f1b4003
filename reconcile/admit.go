package reconcile

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/store"
)

// admit decides whether this pass probes the tool at all: not while its
// breaker is open, nor while another replica sends the half-open trial, nor
// while its probe is not trusted (its self-check failed or could not
// conclude). Keys left alone keep their attempt counts and back-off.
func (t *toolRun) admit(ctx context.Context, lp store.LeaseParams) (bool, error) {
	p := t.p
	// Nothing due (keys still in flight, backing off): nothing to vouch
	// for, so no probe, check or trial is spent on the tool.
	lp.Limit = 1
	due, err := store.PeekDue(ctx, p.e.pool, lp, store.Leased{})
	if err = skipUnreachable(ctx, err); err != nil {
		return false, err
	}
	if len(due) == 0 {
		return false, t.keepCheckFresh(ctx)
	}
	br, err := store.LoadBreaker(ctx, p.e.pool, t.tool)
	if err != nil {
		return false, err
	}
	if br.Open() {
		t.mu.Lock()
		t.open, t.openUntil = true, br.OpenUntil
		t.note = fmt.Sprintf("circuit breaker open until %s: probing paused", br.OpenUntil.UTC().Format(time.RFC3339))
		t.mu.Unlock()
		return false, nil
	}
	t.consecutive = br.Consecutive
	if br.HalfOpen() {
		if !p.opts.DryRun {
			ok, err := store.ClaimBreakerTrial(ctx, p.e.pool, t.tool, p.e.cfg.Lease)
			if err != nil {
				return false, err
			}
			if !ok {
				t.note = "circuit breaker half-open: another reconciler is sending the trial probe"
				return false, nil
			}
		}
		t.halfOpen = true
		t.trialDone = make(chan struct{})
	}
	if t.bracketed {
		// The check that opens the first batch: fresh, never a stored one.
		// Its unanswered probes count for the breaker before any key of the
		// tool is probed.
		if on, err := t.openBatch(ctx, due[0].RequestBody); err != nil || !on {
			return false, err
		}
	}
	// The self-check's answers may have re-opened (or closed) the breaker.
	return !t.isOpen(), nil
}

func slogLevelFor(outcome string) slog.Level {
	if outcome == CheckTrusted {
		return slog.LevelDebug
	}
	return slog.LevelWarn
}

// keepCheckFresh checks the probe of a tool with keys in flight and none
// due when its stored check is older than self_check.interval (or of
// another configuration): vouching for nothing, it keeps `status` current
// and tells on-call of a broken probe before its keys come due.
func (t *toolRun) keepCheckFresh(ctx context.Context) error {
	p := t.p
	if !t.bracketed || p.opts.DryRun || len(p.opts.Keys) > 0 {
		return nil
	}
	rec, err := store.GetSelfCheck(ctx, p.e.pool, t.tool)
	switch {
	case err == nil && rec.Fingerprint == t.policy.ProbeFingerprint && rec.Now.Sub(rec.CheckedAt) < p.e.cfg.SelfCheck.Interval:
		return nil
	case err != nil && !errors.Is(err, ledger.ErrNotFound):
		return err
	}
	if br, err := store.LoadBreaker(ctx, p.e.pool, t.tool); err != nil || br.Open() || br.HalfOpen() {
		return err // an open breaker's tool is left alone
	}
	if !t.awaitPause(ctx) {
		return nil
	}
	r, err := t.check(ctx, nil, func(CheckResult) checkContext { return checkContext{} })
	if err == nil {
		t.mu.Lock()
		t.lastCheck = &r
		t.mu.Unlock()
	}
	return err
}
