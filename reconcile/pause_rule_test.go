package reconcile

import (
	"testing"
	"time"
)

// A pause only ever lengthens: answers in flight when a pause began come
// back with their own Retry-After, and a shorter one must not cut the longer
// pause short.
func TestExtendPauseKeepsTheLaterEnd(t *testing.T) {
	t.Parallel()
	now := time.Now()
	for _, tc := range []struct {
		name        string
		until       time.Time // the pause so far (zero: never paused)
		d           time.Duration
		wantUntil   time.Time
		wantStarted bool
	}{
		{"never paused", time.Time{}, 2 * time.Second, now.Add(2 * time.Second), true},
		{"pause over", now.Add(-time.Second), 2 * time.Second, now.Add(2 * time.Second), true},
		{"pause ending now", now, 2 * time.Second, now.Add(2 * time.Second), true},
		{"longer pause lengthens", now.Add(time.Second), 2 * time.Second, now.Add(2 * time.Second), false},
		{"shorter pause keeps the longer", now.Add(2 * time.Minute), 2 * time.Second, now.Add(2 * time.Minute), false},
		{"equal end keeps it", now.Add(2 * time.Second), 2 * time.Second, now.Add(2 * time.Second), false},
		{"zero asks keeps the pause", now.Add(time.Second), 0, now.Add(time.Second), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			until, started := extendPause(tc.until, now, tc.d)
			if !until.Equal(tc.wantUntil) || started != tc.wantStarted {
				t.Fatalf("extendPause(now%+v, now, %s) = (now%+v, %v), want (now%+v, %v)",
					tc.until.Sub(now), tc.d, until.Sub(now), started, tc.wantUntil.Sub(now), tc.wantStarted)
			}
		})
	}
}

// A short pause within the pass's budget is waited out; a pause longer than
// maxPauseWait, one that would outlast the pass, or one that interrupts a
// half-open breaker's trial ends the tool's share instead.
func TestPauseDecision(t *testing.T) {
	t.Parallel()
	const budget = 5 * time.Minute
	for _, tc := range []struct {
		name     string
		left     time.Duration
		budget   time.Duration
		halfOpen bool
		want     pauseAction
	}{
		{"not paused", 0, budget, false, pauseNone},
		{"not paused, half-open", 0, budget, true, pauseNone},
		{"not paused, out of time", 0, 0, false, pauseNone},
		{"short pause", 2 * time.Second, budget, false, pauseWait},
		{"at the wait cap", maxPauseWait, budget, false, pauseWait},
		{"just past the wait cap", maxPauseWait + time.Nanosecond, budget, false, pauseEnd},
		{"two minutes", 2 * time.Minute, budget, false, pauseEnd},
		{"long pause, long budget", 2 * time.Minute, time.Hour, false, pauseEnd},
		{"ends just within the budget", 2 * time.Second, 2*time.Second + time.Nanosecond, false, pauseWait},
		{"ends with the budget", 2 * time.Second, 2 * time.Second, false, pauseEnd},
		{"pass out of time", 2 * time.Second, -time.Second, false, pauseEnd},
		{"half-open trial interrupted", 2 * time.Second, budget, true, pauseEnd},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := pauseDecision(tc.left, tc.budget, tc.halfOpen); got != tc.want {
				t.Fatalf("pauseDecision(%s, %s, %v) = %d, want %d", tc.left, tc.budget, tc.halfOpen, got, tc.want)
			}
		})
	}
}
