// Package backoff is the one exponential back-off of ledgerkeeper: the delay
// before a key's next probe (reconcile) and before a failed alert message is
// retried (alerts).
//
// Delay is pure (no clock, no randomness), so a caller that must stay
// deterministic, like the reconciler's decision table, passes the jitter it
// drew; Jitter draws one.
package backoff

import (
	"math/rand/v2"
	"time"
)

// Delay is base·2^attempt, capped at maxDelay, times jitter. attempt 0 (or
// less) gives base; a jitter of 0 means 1 (none). The doubling cannot
// overflow: a delay that would pass maxDelay is maxDelay. The result is
// never negative. jitter above 1 may take it past maxDelay, by that factor.
func Delay(base, maxDelay time.Duration, attempt int, jitter float64) time.Duration {
	base, maxDelay = max(base, 0), max(maxDelay, 0)
	d := maxDelay
	if attempt <= 0 {
		d = min(base, maxDelay)
	} else if attempt < 63 && base <= maxDelay>>attempt {
		d = base << attempt
	}
	if jitter == 0 || jitter == 1 {
		return d
	}
	return max(time.Duration(float64(d)*jitter), 0)
}

// Jitter draws a factor for Delay uniformly from [lo, hi]: (0.9, 1.1) spreads
// delays ±10%; (0.5, 1) is "equal jitter", half fixed and half random, never
// above the cap.
func Jitter(lo, hi float64) float64 {
	return lo + (hi-lo)*rand.Float64() //nolint:gosec // G404: jitter spreads retries; nothing depends on it being unpredictable
}
