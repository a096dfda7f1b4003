package expiry

import (
	"context"
	"time"
)

// Clock is the purger's time source: the budget and the pacing read it, and
// the pauses between batches go through it. Tests substitute one that moves
// only when told, so they need no sleeps.
type Clock interface {
	Now() time.Time
	// Sleep pauses for d, or until ctx is done (then it returns ctx.Err()).
	Sleep(ctx context.Context, d time.Duration) error
}

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

func (realClock) Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// pacer sizes batches and the pauses between them (see doc.go, Pacing).
// Batches never shrink below a tenth of BatchSize: below that, a batch's
// fixed cost (round trips, commit) dominates, and a batch that is slow
// because the machine is busy would not get faster, only less useful.
type pacer struct {
	min, max int
	size     int
	target   time.Duration
	duty     float64
	minPause time.Duration
	// busy is the time spent inside batches so far.
	busy time.Duration
}

func newPacer(c Config) *pacer {
	return &pacer{
		min:      max(1, c.BatchSize/10),
		max:      c.BatchSize,
		size:     c.BatchSize,
		target:   c.BatchTarget,
		duty:     c.DutyCycle,
		minPause: max(0, c.BatchPause),
	}
}

// observe records a batch that took d (timedOut: it hit the statement
// timeout and was rolled back), adjusts the next batch's size and returns
// the pause to take before it.
func (p *pacer) observe(d time.Duration, timedOut bool) time.Duration {
	p.busy += d
	switch {
	case timedOut:
		p.size = max(p.min, p.size/4)
	case d > p.target:
		// In proportion, but at most halved: one batch slowed by a
		// checkpoint or a noisy neighbour is not a trend.
		p.size = max(p.min, p.size/2, int(float64(p.size)*float64(p.target)/float64(d)))
	case d < p.target*3/4:
		p.size = min(p.max, p.size+max(1, p.size/10))
	}
	// d × (1-duty)/duty of rest after d of work keeps work/(work+rest) at
	// duty.
	pause := time.Duration(float64(d) * (1 - p.duty) / p.duty)
	return max(pause, p.minPause)
}
