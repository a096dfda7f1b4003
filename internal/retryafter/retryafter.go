// Package retryafter reads an HTTP Retry-After value the one way the daemon
// reads it, for the probes (a throttled downstream) and for Slack (a rate
// limit). Each caller bounds the delay with its own limits.
//
// RFC 9110 section 10.2.3: https://www.rfc-editor.org/rfc/rfc9110#section-10.2.3
//
//	Retry-After = HTTP-date / delay-seconds
//	delay-seconds = 1*DIGIT
package retryafter

import (
	"math"
	"net/http"
	"strings"
	"time"
)

// Parse returns the delay a Retry-After value v asks for, measured from now,
// and whether v is valid.
//
// delay-seconds is one or more ASCII digits and nothing else (no sign, no
// fraction); a number too large for a time.Duration saturates at the
// largest one, so a caller's cap applies to it. An HTTP-date is any of the
// three forms a recipient must accept (http.ParseTime); a date already past
// asks for no wait: 0. Whitespace around the value (OWS) is ignored. Anything
// else, "+5", "-1", "1.5" and "" among it, is invalid: ok is false.
func Parse(v string, now time.Time) (d time.Duration, ok bool) {
	v = strings.Trim(v, " \t")
	if v == "" {
		return 0, false
	}
	if seconds, digits := delaySeconds(v); digits {
		return seconds, true
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	return max(t.Sub(now), 0), true
}

// delaySeconds reads v as 1*DIGIT; digits is false when v is not one.
func delaySeconds(v string) (d time.Duration, digits bool) {
	const limit = math.MaxInt64 / int64(time.Second)
	var n int64
	for i := range len(v) {
		c := v[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		if n <= limit {
			n = n*10 + int64(c-'0')
		}
	}
	if n > limit {
		return math.MaxInt64, true
	}
	return time.Duration(n) * time.Second, true
}
