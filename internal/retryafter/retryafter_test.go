package retryafter

import (
	"math"
	"testing"
	"time"
)

func TestParseReadsDelaySecondsOrAnHTTPDateAndNothingElse(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 30, 4, 0, 0, 500_000_000, time.UTC)
	cases := []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"120", 120 * time.Second, true},
		{"0", 0, true},
		{"007", 7 * time.Second, true},
		{" 5\t", 5 * time.Second, true},
		{"9223372036", 9223372036 * time.Second, true},
		{"9223372037", math.MaxInt64, true},
		{"99999999999999999999999", math.MaxInt64, true},
		{"Mon, 30 Nov 2026 04:01:30 GMT", 89*time.Second + 500*time.Millisecond, true},
		{"Monday, 30-Nov-26 04:01:30 GMT", 89*time.Second + 500*time.Millisecond, true}, // RFC 850
		{"Mon Nov 30 04:01:30 2026", 89*time.Second + 500*time.Millisecond, true},       // asctime
		{"Mon, 30 Nov 2026 04:00:00 GMT", 0, true},                                      // half a second ago
		{"Mon, 30 Nov 2026 03:00:00 GMT", 0, true},
		{"", 0, false},
		{" ", 0, false},
		{"+5", 0, false},
		{"-1", 0, false},
		{"1.5", 0, false},
		{"5s", 0, false},
		{"1 2", 0, false},
		{"٥", 0, false}, // a digit, not an ASCII one
		{"soon", 0, false},
		{"Mon, 99 Foo 2026 25:00:00 GMT", 0, false},
		{"2026-11-30T04:01:30Z", 0, false},
	}
	for _, c := range cases {
		got, ok := Parse(c.in, now)
		if got != c.want || ok != c.ok {
			t.Errorf("Parse(%q) = %s, %v; want %s, %v", c.in, got, ok, c.want, c.ok)
		}
	}
}
