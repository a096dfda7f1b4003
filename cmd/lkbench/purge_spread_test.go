package main

import (
	"strings"
	"testing"
	"time"
)

// The ratios' base is the median of every no-purge window of the run (not
// the last one), and the spread table puts the none-vs-none ratios, the
// noise floor, beside each variant's median and range over rounds.
func TestPurgeSpreadAgainstTheMedianNoneWindow(t *testing.T) {
	res := func(v string, round int, p50, p99 float64) purgeResult {
		return purgeResult{Variant: v, Round: round, During: latency{P50ms: p50, P99ms: p99}}
	}
	results := []purgeResult{
		res("none", 1, 1.0, 10), res("river", 1, 2.0, 30),
		res("river", 2, 3.0, 20), res("none", 2, 3.0, 30),
		res("none", 3, 2.0, 20),
	}
	b, ok := noneBaseline(results)
	if !ok || b.P50ms != 2.0 || b.P99ms != 20 {
		t.Fatalf("baseline = %+v, %v; want the medians 2.0 and 20", b, ok)
	}
	var out strings.Builder
	printPurgeSpread(&out, []string{"none", "river"}, results)
	for _, want := range []string{
		"none (noise floor)  3       1.00x                      [0.50, 1.50]",
		"river               2       1.25x                      [1.00, 1.50]",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("spread lacks %q:\n%s", want, out.String())
		}
	}
	if m := median([]float64{4, 1, 3, 2}); m != 2.5 {
		t.Errorf("median of four = %v, want 2.5", m)
	}
}

// The bisection starts between a variant's highest sustained grid step and
// the lowest failed one above it, whatever order the steps ran in.
func TestBracketOfGridSteps(t *testing.T) {
	step := func(v string, rate float64, ok bool) variantStep {
		return variantStep{Variant: v, loadStep: loadStep{Rate: rate, Sustained: ok}}
	}
	steps := []variantStep{
		step("raw", 1000, true), step("raw", 2000, false), step("raw", 1500, true),
		step("raw", 3000, false), step("mw", 1000, false), step("mw", 500, true),
		step("all", 1000, true),
	}
	for _, tc := range []struct {
		v      string
		lo, hi float64
	}{{"raw", 1500, 2000}, {"mw", 500, 1000}, {"all", 1000, 0}, {"none", 0, 0}} {
		if lo, hi := bracketOf(steps, tc.v); lo != tc.lo || hi != tc.hi {
			t.Errorf("bracketOf(%s) = %v, %v; want %v, %v", tc.v, lo, hi, tc.lo, tc.hi)
		}
	}
}

// The writer's excess over a span is the sum of each request's latency
// less the base (a faster request counts negative), whatever the span's
// length; the spread table divides it by the rows and puts the no-purge
// windows' excess over the same span beside it.
func TestPurgeExcessIsTheWritersExtraWaitingPerRow(t *testing.T) {
	t0 := time.Unix(1000, 0)
	l := &openLoop{}
	for i, lat := range []int{1, 1, 3, 5, 1, 0} {
		l.samples = append(l.samples, sample{sched: t0.Add(time.Duration(i) * time.Second), lat: time.Duration(lat) * time.Millisecond})
	}
	if m := l.mean(t0, t0.Add(2*time.Second)); m != time.Millisecond {
		t.Fatalf("mean of the window before = %v, want 1ms", m)
	}
	// Requests at 2..5 s: 3, 5, 1 and 0 ms against 1 ms: 2 + 4 + 0 - 1.
	if ms, n := l.excess(t0.Add(2*time.Second), t0.Add(6*time.Second), time.Millisecond); ms != 5 || n != 4 {
		t.Fatalf("excess = %v ms over %d requests, want 5 over 4", ms, n)
	}
	results := []purgeResult{
		{Variant: "none", During: latency{P50ms: 1, P99ms: 2}, ExcessMsPerSec: 0.5},
		{Variant: "none", During: latency{P50ms: 1, P99ms: 2}, ExcessMsPerSec: -0.5},
		{Variant: "river", Rows: 2000, During: latency{P50ms: 1, P99ms: 2}, ExcessMsPer1kRows: 30, ExcessSeconds: 20},
	}
	var out strings.Builder
	printPurgeSpread(&out, []string{"none", "river"}, results)
	// river: 10 s per 1,000 rows, so none's floor is ±0.5 ms/s × 10 s.
	var river string
	for line := range strings.SplitSeq(out.String(), "\n") {
		if strings.HasPrefix(line, "river ") {
			river = strings.Join(strings.Fields(line), " ")
		}
	}
	if want := "30.0 [30.0, 30.0] [-5.0, 5.0]"; !strings.HasSuffix(river, want) {
		t.Errorf("river's row %q does not end in %q:\n%s", river, want, out.String())
	}
}
