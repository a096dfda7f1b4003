package reconcile

import (
	"testing"
	"time"
)

// A key on its way to its probe: a pause gives it back to be leased again
// after the pause (even when the pass is stopping too), a stop, a
// cancellation or an open breaker gives it back, and so does a lease that
// would no longer outlast the probe (past lastStart; zero: a dry run, no
// bound).
func TestJudgeStart(t *testing.T) {
	t.Parallel()
	now := time.Now()
	for _, tc := range []struct {
		name            string
		paused, refused bool
		lastStart       time.Time
		want            startGate
	}{
		{"free to go", false, false, now.Add(time.Second), startGo},
		{"at the last safe start", false, false, now, startGo},
		{"just past the last safe start", false, false, now.Add(-time.Nanosecond), startLate},
		{"long past", false, false, now.Add(-time.Minute), startLate},
		{"dry run: no bound", false, false, time.Time{}, startGo},
		{"paused", true, false, now.Add(time.Second), startPaused},
		{"paused and stopping", true, true, now.Add(time.Second), startPaused},
		{"paused and late", true, false, now.Add(-time.Minute), startPaused},
		{"stopping", false, true, now.Add(time.Second), startRefused},
		{"stopping and late", false, true, now.Add(-time.Minute), startRefused},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := judgeStart(tc.paused, tc.refused, now, tc.lastStart); got != tc.want {
				t.Fatalf("judgeStart(paused=%v, refused=%v, now, now%+v) = %d, want %d",
					tc.paused, tc.refused, tc.lastStart.Sub(now), got, tc.want)
			}
		})
	}
}
