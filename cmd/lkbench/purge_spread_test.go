package main

import (
	"strings"
	"testing"
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
