package reconcile

import (
	"context"
	"testing"
	"time"
)

// A key of a bracketed tool whose batch opened before the tool's latest
// pause does not start its probe once the pause is over: the opener vouches
// for nothing sent after the pause began, so the key goes back (as a paused
// one) until a fresh check opens the next batch. A tool whose self-check is
// off, or a batch opened after the pause, starts as usual.
func TestProbeAfterAPauseNeedsAnOpenerFromAfterIt(t *testing.T) {
	t.Parallel()
	opened := time.Now().Add(-3 * time.Second)
	pauseBegan := opened.Add(time.Second) // and ended: until is in the past
	cases := []struct {
		name      string
		bracketed bool
		opener    time.Time
		want      startGate
	}{
		{"opened before the pause", true, opened, startPaused},
		{"opened after the pause", true, pauseBegan.Add(time.Second), startGo},
		{"self-check off", false, opened, startGo},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			lim := newToolLimit("tickets", RateLimit{}, nil)
			lim.since, lim.until = pauseBegan, pauseBegan.Add(time.Second)
			tr := &toolRun{p: &pass{opts: Options{}}, bracketed: c.bracketed}
			tr.bk.opener = &CheckResult{CheckedAt: c.opener}
			if got := tr.mayStart(context.Background(), lim, time.Time{}); got != c.want {
				t.Fatalf("mayStart = %v, want %v", got, c.want)
			}
		})
	}
}
