package reconcile

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/ledgerkeeper/ledgerkeeper/store"
)

// RateLimit bounds the probes one process sends to a tool's downstream
// (tools.T.probe.rate_limit). It is per process: N replicas send up to N
// times the rate, so set it to the downstream's allowance divided by the
// replica count.
type RateLimit struct {
	// RPS is probes per second, > 0. Zero means no limit (the default).
	RPS float64
	// Burst is how many probes may start at once after a quiet spell
	// (the token bucket's size). Default 1.
	Burst int
}

// maxPauseWait is the longest pause a pass waits out before probing its tool
// again. A longer one ends the tool's share of the pass (its keys stay due
// for a later pass): robfig/cron skips the ticks of a pass still running,
// so one paused tool must not hold back every other tool's next pass for
// long.
const maxPauseWait = 30 * time.Second

// toolLimit is one tool's politeness towards its downstream: the rate
// limiter and the pause a downstream asked for with Retry-After. The engine
// keeps one per probed tool for its whole life, so cron passes, on-demand
// passes and self-checks of one process share it.
type toolLimit struct {
	tool    string
	limiter *rate.Limiter // nil: no limit
	turn    chan struct{} // one waiter reserves and sleeps at a time
	metrics *Metrics      // may be nil

	mu    sync.Mutex
	until time.Time // probing paused until then (local monotonic time)
	since time.Time // when the latest pause began (zero: never paused)
	// shared is the latest pause end the other replicas know of (written
	// by this process, or read from the ledger): sharePause writes only a
	// later one.
	shared time.Time
}

func newToolLimit(tool string, rl RateLimit, m *Metrics) *toolLimit {
	l := &toolLimit{tool: tool, metrics: m, turn: make(chan struct{}, 1)}
	if rl.RPS > 0 {
		l.limiter = rate.NewLimiter(rate.Limit(rl.RPS), max(rl.Burst, 1))
	}
	return l
}

// wait blocks until the rate limit lets one probe go. It returns false,
// without taking a token, if ctx ends or stop closes first, or if the token
// would come after latest (non-zero: the latest time the probe may start,
// e.g. before its lease runs short). Time spent waiting is counted in
// ledgerkeeper_reconcile_probe_rate_limit_wait_seconds_total. A nil
// toolLimit or one without a limit never waits.
//
// Waiters take their turn one at a time, and each reserves its token only
// when its turn comes. Were every waiter to hold a reservation for its own
// future instant, a process starved of CPU for a moment would wake them all
// late and together, and the downstream would see them in one burst larger
// than the configured one; taken in turn, a late waker only delays the next
// reservation.
func (l *toolLimit) wait(ctx context.Context, stop <-chan struct{}, latest time.Time) bool {
	if l == nil || l.limiter == nil {
		return true
	}
	start := time.Now()
	defer func() { l.metrics.rateLimitWaited(l.tool, time.Since(start)) }()
	select {
	case l.turn <- struct{}{}:
	case <-ctx.Done():
		return false
	case <-stop:
		return false
	}
	defer func() { <-l.turn }()
	now := time.Now()
	r := l.limiter.ReserveN(now, 1)
	if !r.OK() {
		return false // burst < 1: cannot happen, newToolLimit makes it 1
	}
	d := r.DelayFrom(now)
	if d == 0 {
		return true
	}
	if !latest.IsZero() && now.Add(d).After(latest) {
		r.CancelAt(now) // the token goes back to the probes that can use it
		return false
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-ctx.Done():
	case <-stop:
	}
	r.Cancel()
	return false
}

// pause stops probing the tool for d, from now, unless it is paused longer
// already. started reports whether probing was running until this call
// (the first answer of a burst of 429s), for one log line per pause.
func (l *toolLimit) pause(d time.Duration) (until time.Time, started bool) {
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.until, started = extendPause(l.until, now, d)
	if started {
		l.since = now
	}
	l.metrics.probePaused(l.tool, l.until, started)
	return l.until, started
}

// toShare reports whether a pause ending at until is news to the other
// replicas (it ends over a second after what they were last told), and
// marks it told; d is how long it has left.
func (l *toolLimit) toShare(until time.Time) (d time.Duration, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !until.After(l.shared.Add(time.Second)) {
		return 0, false
	}
	l.shared = until
	return time.Until(until), true
}

// sharePause tells the other replicas of a pause this process began or
// lengthened (store.PauseProbing): the downstream answered all of us. A
// dry run writes nothing; a failed write is logged, this process's own
// pause holds either way.
func (t *toolRun) sharePause(ctx context.Context, until time.Time) {
	p := t.p
	d, ok := t.limit().toShare(until)
	if !ok || p.opts.DryRun || d <= 0 {
		return
	}
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := store.PauseProbing(wctx, p.e.pool, t.tool, d); err != nil {
		p.e.logger.Warn("probe pause not shared with the other replicas (this one keeps it)", "tool", t.tool, "err", err)
	}
}

// adoptSharedPause pauses the tool's probing in this process when another
// replica's downstream asked to wait longer than this process knows
// (store.ProbePausedFor, by the database's clock). A failed read is
// logged: the tool's own answers still pause it.
func (t *toolRun) adoptSharedPause(ctx context.Context) {
	lim := t.limit()
	if lim == nil {
		return
	}
	p := t.p
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	d, err := store.ProbePausedFor(rctx, p.e.pool, t.tool)
	if err != nil {
		if ctx.Err() == nil {
			p.e.logger.Warn("probe pause of the other replicas not read", "tool", t.tool, "err", err)
		}
		return
	}
	if d <= lim.pausedFor()+time.Second {
		return
	}
	until, began := lim.pause(d)
	lim.mu.Lock()
	lim.shared = until
	lim.mu.Unlock()
	if began {
		p.e.logger.Warn("downstream asked another replica to wait: probing paused here too, no attempt counted", "tool", t.tool, "paused_for", d.Round(time.Second))
	}
}

// extendPause is a pause's end after a downstream asks, at now, for d more,
// the pause having lasted until then so far: the later of the two ends, so
// that answers overlapping in flight never cut a longer pause short.
// started reports whether the tool was not paused at now.
func extendPause(until, now time.Time, d time.Duration) (time.Time, bool) {
	started := !until.After(now)
	if end := now.Add(d); end.After(until) {
		until = end
	}
	return until, started
}

// pausedSince is when the tool's latest pause began (zero: never paused).
// A self-check finished before then vouches for no probe sent after it: the
// world may change during a pause (one often comes with a redeploy).
func (l *toolLimit) pausedSince() time.Time {
	if l == nil {
		return time.Time{}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.since
}

// pausedFor is how long the tool's probing stays paused (0: not paused).
func (l *toolLimit) pausedFor() time.Duration {
	if l == nil {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return max(time.Until(l.until), 0)
}

// limit is the engine's toolLimit of the pass's tool (nil: a tool without
// a probe, never limited).
func (t *toolRun) limit() *toolLimit { return t.p.e.limits[t.tool] }

// awaitPause holds the tool's share of the pass while a downstream's
// Retry-After pause lasts: it waits out a short pause (at most
// maxPauseWait, within the pass's time budget) and returns true to go on
// leasing; it returns false to end the share (a longer pause, a half-open
// breaker whose trial the pause interrupted, a stop), noting why in the
// tool's report. Keys are neither leased nor probed while paused, so the
// pass does not spin.
func (t *toolRun) awaitPause(ctx context.Context) bool {
	p := t.p
	t.adoptSharedPause(ctx)
	for {
		// Looped: answers still in flight when the pause began may have
		// lengthened it meanwhile.
		left := t.limit().pausedFor()
		t.mu.Lock()
		halfOpen := t.halfOpen
		t.mu.Unlock()
		budget := p.e.cfg.MaxDuration - time.Since(p.report.StartedAt)
		switch pauseDecision(left, budget, halfOpen) {
		case pauseNone:
			return true
		case pauseEnd:
			t.mu.Lock()
			t.note = fmt.Sprintf("downstream asked to wait (HTTP 429/503 Retry-After): probing paused until %s; its keys stay due, no attempt counted",
				time.Now().Add(left).UTC().Format(time.RFC3339))
			t.mu.Unlock()
			return false
		}
		timer := time.NewTimer(left)
		select {
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
			return false
		case <-p.opts.Stop:
			timer.Stop()
			return false
		}
	}
}

// pauseAction is what a tool's share of a pass does about a pause.
type pauseAction int

const (
	pauseNone pauseAction = iota // not paused: go on
	pauseWait                    // wait the pause out, then look again
	pauseEnd                     // end the tool's share: its keys stay due
)

// pauseDecision is awaitPause's rule, for a pause with left to run and a
// pass with budget left of its time: a pause is waited out only when it is
// short (at most maxPauseWait) and ends within the pass's time budget; a
// half-open breaker's share ends at once (its trial was interrupted, and no
// batch goes out untried).
func pauseDecision(left, budget time.Duration, halfOpen bool) pauseAction {
	switch {
	case left <= 0:
		return pauseNone
	case halfOpen || left > maxPauseWait || left >= budget:
		return pauseEnd
	default:
		return pauseWait
	}
}

// pace is what a tool's share of a pass knows of its keys and the pause.
type pace struct {
	inFlight sync.WaitGroup // keys queued to the tool's workers, not yet handled
	// givenBack: a key was given back because of a pause (heldKey.done),
	// so the pass leases again once the pause is over.
	givenBack atomic.Bool
}

// resumeAfterPause is asked when no key is left to lease: it waits for the
// keys in flight, and if a pause gave some back, waits the pause out (see
// awaitPause) and returns true to lease them again.
func (t *toolRun) resumeAfterPause(ctx context.Context) bool {
	t.pace.inFlight.Wait()
	return t.pace.givenBack.Swap(false) && t.awaitPause(ctx)
}
