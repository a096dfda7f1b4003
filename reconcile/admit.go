package reconcile

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/ledger/store"
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
	if err != nil || len(due) == 0 {
		return false, err
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
