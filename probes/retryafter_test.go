package probes_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/probes"
)

// TestHTTPProbeSurfacesRetryAfter: a 429 or 503 that says when to come back
// is Throttled with that pause (seconds or HTTP-date, capped at
// MaxRetryAfter, at least MinRetryAfter); one whose Retry-After is missing
// or garbage, or another status with one, is an ordinary unknown.
func TestHTTPProbeSurfacesRetryAfter(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name       string
		status     int
		retryAfter string
		throttled  bool
		min, max   time.Duration // the pause, when throttled
	}{
		{"429 seconds", 429, "2", true, 2 * time.Second, 2 * time.Second},
		{"503 seconds", 503, " 7 ", true, 7 * time.Second, 7 * time.Second},
		{"429 http-date", 429, "date+4s", true, 2 * time.Second, 4 * time.Second},
		{"429 date in the past is the floor", 429, "date-1h", true, probes.MinRetryAfter, probes.MinRetryAfter},
		{"429 zero is the floor", 429, "0", true, probes.MinRetryAfter, probes.MinRetryAfter},
		{"429 an hour is capped", 429, "3600", true, probes.MaxRetryAfter, probes.MaxRetryAfter},
		{"429 overflow is capped", 429, "99999999999999999999999", true, probes.MaxRetryAfter, probes.MaxRetryAfter},
		{"429 a date a day away is capped", 429, "date+24h", true, probes.MaxRetryAfter, probes.MaxRetryAfter},
		{"429 without Retry-After", 429, "", false, 0, 0},
		{"429 negative", 429, "-5", false, 0, 0},
		{"429 signed", 429, "+5", false, 0, 0},
		{"429 fraction", 429, "1.5", false, 0, 0},
		{"429 garbage", 429, "soon", false, 0, 0},
		{"503 garbage date", 503, "Mon, 99 Foo 2026 25:00:00 GMT", false, 0, 0},
		{"500 with Retry-After", 500, "2", false, 0, 0},
		{"200 with Retry-After", 200, "2", false, 0, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				v := c.retryAfter
				if d, ok := strings.CutPrefix(v, "date"); ok {
					// An HTTP-date that far from the moment of answering.
					off, _ := time.ParseDuration(d)
					v = time.Now().Add(off).UTC().Format(http.TimeFormat)
				}
				if v != "" {
					w.Header().Set("Retry-After", v)
				}
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(c.status)
				fmt.Fprint(w, `{"data":[]}`)
			}))
			defer srv.Close()
			p, err := probes.NewHTTP(probes.HTTPConfig{URL: srv.URL + "/t?k={key}", Match: "data"})
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			res := probes.Guard(p, 5*time.Second).Probe(context.Background(), probes.Key{Key: "k1", Tool: "t"})
			after, throttled := probes.Throttled(res)
			if throttled != c.throttled {
				t.Fatalf("Throttled = %v (%s), want %v; result %+v", throttled, after, c.throttled, res)
			}
			if !throttled {
				if c.status != 200 && res.Verdict != probes.Unknown {
					t.Fatalf("verdict %s, want unknown", res.Verdict)
				}
				return
			}
			if after < c.min || after > c.max {
				t.Fatalf("pause %s, want within [%s, %s]", after, c.min, c.max)
			}
			var te *probes.ThrottledError
			if !errors.As(res.Err, &te) || te.Status != c.status {
				t.Fatalf("error %v does not carry the status %d", res.Err, c.status)
			}
			// Still a downstream that did not answer, for the self-check.
			if !probes.Unreachable(res) {
				t.Fatalf("a throttled answer must be Unreachable: %+v", res)
			}
		})
	}
}

// TestThrottledClampsAnyProbesPause: a Go probe's ThrottledError is
// honoured within the same bounds.
func TestThrottledClampsAnyProbesPause(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		after time.Duration
		want  time.Duration
		ok    bool
	}{
		{time.Hour, probes.MaxRetryAfter, true},
		{time.Millisecond, probes.MinRetryAfter, true},
		{3 * time.Second, 3 * time.Second, true},
		{0, 0, false},
		{-time.Second, 0, false},
	} {
		res := probes.Result{Verdict: probes.Unknown, Err: fmt.Errorf("go probe: %w", &probes.ThrottledError{Status: 429, RetryAfter: c.after})}
		got, ok := probes.Throttled(res)
		if ok != c.ok || got != c.want {
			t.Errorf("Throttled(%s) = %s, %v; want %s, %v", c.after, got, ok, c.want, c.ok)
		}
	}
	// A conclusive verdict is never a pause, whatever error it carries.
	if _, ok := probes.Throttled(probes.Result{Verdict: probes.Duplicate, Err: &probes.ThrottledError{Status: 429, RetryAfter: time.Second}}); ok {
		t.Fatal("a duplicate is not throttled")
	}
}
