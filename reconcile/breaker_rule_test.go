package reconcile

import "testing"

// The breaker opens at breaker.failures consecutive unknown verdicts, or at
// the first one when half-open; a conclusive verdict restarts the count and
// closes a half-open breaker. The database's count (countVerdicts) and a
// pass's own (recordVerdict) are judged by this one rule.
func TestBreakerCountOpensAtItsThreshold(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		before     breakerCount
		failures   int
		conclusive bool
		want       breakerCount
		wantOpens  bool
	}{
		{"first unknown", breakerCount{}, 5, false, breakerCount{consecutive: 1}, false},
		{"one below the threshold", breakerCount{consecutive: 3}, 5, false, breakerCount{consecutive: 4}, false},
		{"at the threshold", breakerCount{consecutive: 4}, 5, false, breakerCount{consecutive: 5}, true},
		{"past the threshold (other writers counted too)", breakerCount{consecutive: 7}, 5, false, breakerCount{consecutive: 8}, true},
		{"threshold of one", breakerCount{}, 1, false, breakerCount{consecutive: 1}, true},
		{"half-open: one unknown re-opens", breakerCount{consecutive: 5, halfOpen: true}, 5, false, breakerCount{consecutive: 6, halfOpen: true}, true},
		{"half-open from zero", breakerCount{halfOpen: true}, 5, false, breakerCount{consecutive: 1, halfOpen: true}, true},
		{"conclusive restarts the count", breakerCount{consecutive: 4}, 5, true, breakerCount{}, false},
		{"conclusive closes a half-open breaker", breakerCount{consecutive: 5, halfOpen: true}, 5, true, breakerCount{}, false},
		{"conclusive on a fresh count", breakerCount{}, 1, true, breakerCount{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, opens := tc.before.after(tc.conclusive, tc.failures)
			if got != tc.want || opens != tc.wantOpens {
				t.Fatalf("%+v.after(conclusive=%v, failures=%d) = %+v, %v; want %+v, %v",
					tc.before, tc.conclusive, tc.failures, got, opens, tc.want, tc.wantOpens)
			}
		})
	}
}

// The database's row as countVerdicts judges it, after the transaction's
// unknowns were added: closed, it opens at breaker.failures; half-open (it
// opened before and its cooldown is over), at one.
func TestBreakerThreshold(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		count    breakerCount
		failures int
		want     bool
	}{
		{breakerCount{consecutive: 0}, 5, false},
		{breakerCount{consecutive: 4}, 5, false},
		{breakerCount{consecutive: 5}, 5, true},
		{breakerCount{consecutive: 6}, 5, true},
		{breakerCount{consecutive: 0, halfOpen: true}, 5, false},
		{breakerCount{consecutive: 1, halfOpen: true}, 5, true},
		{breakerCount{consecutive: 1}, 1, true},
		{breakerCount{consecutive: 1, halfOpen: true}, 3, true},
	} {
		if got := tc.count.opens(tc.failures); got != tc.want {
			t.Errorf("%+v.opens(%d) = %v, want %v", tc.count, tc.failures, got, tc.want)
		}
	}
	if got := breakerThreshold(5, false); got != 5 {
		t.Errorf("breakerThreshold(5, closed) = %d, want 5", got)
	}
	if got := breakerThreshold(5, true); got != 1 {
		t.Errorf("breakerThreshold(5, half-open) = %d, want 1", got)
	}
}
