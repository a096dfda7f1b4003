package backoff

import (
	"math"
	"testing"
	"time"
)

func TestDelay(t *testing.T) {
	t.Parallel()
	const s = time.Second
	tests := []struct {
		base, maxDelay time.Duration
		attempt        int
		jitter         float64
		want           time.Duration
	}{
		{10 * s, time.Minute, 0, 0, 10 * s},
		{10 * s, time.Minute, -3, 1, 10 * s},
		{10 * s, time.Minute, 1, 0, 20 * s},
		{10 * s, time.Minute, 2, 1, 40 * s},
		{10 * s, time.Minute, 3, 1, time.Minute}, // 80s capped
		{10 * s, time.Minute, 62, 1, time.Minute},
		{10 * s, time.Minute, 63, 1, time.Minute},
		{10 * s, time.Minute, math.MaxInt, 1, time.Minute},
		{time.Duration(math.MaxInt64), time.Duration(math.MaxInt64), 5, 1, time.Duration(math.MaxInt64)},
		{time.Minute, 10 * s, 0, 1, 10 * s}, // base above the cap
		{30 * s, 30 * time.Minute, 2, 1.1, 132 * s},
		{30 * s, 30 * time.Minute, 2, 0.9, 108 * s},
		{10 * s, time.Minute, 9, 1.1, 66 * s}, // jitter applies after the cap
		{10 * s, time.Minute, 1, 0.5, 10 * s},
		{0, time.Minute, 4, 1, 0},
		{-s, time.Minute, 1, 1, 0},
		{10 * s, time.Minute, 1, -1, 0},
	}
	for _, tt := range tests {
		if got := Delay(tt.base, tt.maxDelay, tt.attempt, tt.jitter); got != tt.want {
			t.Errorf("Delay(%s, %s, %d, %v) = %s, want %s", tt.base, tt.maxDelay, tt.attempt, tt.jitter, got, tt.want)
		}
	}
}

func TestDelayNeverDecreases(t *testing.T) {
	t.Parallel()
	prev := time.Duration(0)
	for attempt := range 100 {
		d := Delay(7*time.Millisecond, 3*time.Hour, attempt, 1)
		if d < prev || d > 3*time.Hour {
			t.Fatalf("attempt %d: %s after %s (cap 3h)", attempt, d, prev)
		}
		prev = d
	}
}

func TestJitter(t *testing.T) {
	t.Parallel()
	seenLow, seenHigh := false, false
	for range 1000 {
		j := Jitter(0.5, 1)
		if j < 0.5 || j > 1 {
			t.Fatalf("Jitter(0.5, 1) = %v", j)
		}
		seenLow = seenLow || j < 0.6
		seenHigh = seenHigh || j > 0.9
	}
	if !seenLow || !seenHigh {
		t.Errorf("1000 draws did not spread over [0.5, 1] (low %v, high %v)", seenLow, seenHigh)
	}
}
