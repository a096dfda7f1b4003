package main

import (
	"context"
	"math"
	"slices"
	"sync"
	"time"
)

// loadStep is what one fixed arrival rate gave.
type loadStep struct {
	Rate float64 `json:"rate"`
	// Sent requests were issued; Skipped were due but never issued because
	// the driver fell more than maxLag behind (the step is then overloaded).
	Sent    int `json:"sent"`
	Skipped int `json:"skipped"`
	Errors  int `json:"errors"`
	// Achieved is completed requests per second, from the first due time
	// to the last completion.
	Achieved float64 `json:"achieved_per_sec"`
	P50ms    float64 `json:"p50_ms"`
	P99ms    float64 `json:"p99_ms"`
	MaxMs    float64 `json:"max_ms"`
	// Sustained: nothing skipped, no error, and Achieved within 5% of Rate.
	Sustained bool `json:"sustained"`
}

// openLoopDriver issues requests at a fixed arrival rate, whatever their
// latency: request i is due at start + i/rate and its latency counts from
// then, so a stall shows in every request it delays (no coordinated
// omission). At most MaxInFlight requests run at once; a request that
// waits for a slot is late, and its lateness is in its latency.
type openLoopDriver struct {
	MaxInFlight int
	// MaxLag ends a step early when the driver is this far behind the
	// schedule: the rate is past saturation, and queueing more only
	// measures the queue. Default 2s.
	MaxLag time.Duration
}

// Run drives op at rate for d. op gets the request's index within the step.
func (o openLoopDriver) Run(ctx context.Context, rate float64, d time.Duration, op func(ctx context.Context, i int64) error) loadStep {
	maxLag := o.MaxLag
	if maxLag <= 0 {
		maxLag = 2 * time.Second
	}
	slots := make(chan struct{}, max(o.MaxInFlight, 1))
	total := int64(rate * d.Seconds())
	lats := make([]time.Duration, 0, total)
	var mu sync.Mutex
	var wg sync.WaitGroup
	var errs int
	last := time.Time{}
	start := time.Now()
	interval := float64(time.Second) / rate
	step := loadStep{Rate: rate}
	for i := int64(0); i < total && ctx.Err() == nil; i++ {
		due := start.Add(time.Duration(float64(i) * interval))
		if w := time.Until(due); w > 0 {
			t := time.NewTimer(w)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
			}
		} else if -w > maxLag {
			step.Skipped = int(total - i)
			break
		}
		slots <- struct{}{}
		step.Sent++
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := op(ctx, i)
			lat := time.Since(due)
			now := time.Now()
			<-slots
			mu.Lock()
			defer mu.Unlock()
			lats = append(lats, lat)
			if err != nil {
				errs++
			}
			if now.After(last) {
				last = now
			}
		}()
	}
	wg.Wait()
	step.Errors = errs
	if len(lats) > 0 {
		step.Achieved = math.Round(float64(len(lats)-errs) / last.Sub(start).Seconds())
		slices.Sort(lats)
		step.P50ms, step.P99ms, step.MaxMs = ms(quantile(lats, 0.50)), ms(quantile(lats, 0.99)), ms(lats[len(lats)-1])
	}
	step.Sustained = step.Skipped == 0 && errs == 0 && step.Achieved >= 0.95*rate
	return step
}

// quantile is the p-quantile of sorted (nearest rank).
func quantile(sorted []time.Duration, p float64) time.Duration {
	i := int(math.Ceil(p*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}
