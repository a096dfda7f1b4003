package probes

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/ledgerkeeper/ledgerkeeper/internal/retryafter"
)

// Unreachable reports whether an Unknown result means that the downstream
// did not answer: a transport error, a timeout, an HTTP 429 or 5xx, a
// database that refused the connection. Any other Unknown means the
// downstream answered and the probe did not understand the answer (a
// renamed field, an unexpected status, wrong credentials): the probe itself
// may be broken. An Unknown wrapping ErrNotRendered is not unreachable
// either: the downstream was never asked.
//
// The self-check uses the difference: a downstream that does not answer
// cannot vouch for its probe either way (the check is inconclusive and the
// circuit breaker counts it), while an answer the probe cannot read makes
// the probe untrusted.
func Unreachable(res Result) bool {
	if res.Verdict != Unknown || errors.Is(res.Err, ErrNotRendered) {
		return false
	}
	var ev struct {
		HTTPStatus int `json:"http_status"`
	}
	if len(res.Evidence) > 0 && json.Unmarshal(res.Evidence, &ev) == nil && ev.HTTPStatus != 0 {
		return ev.HTTPStatus == 429 || ev.HTTPStatus >= 500
	}
	err := res.Err
	if err == nil {
		return false
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EHOSTUNREACH) || errors.Is(err, syscall.ENETUNREACH) {
		return true
	}
	if _, ok := errors.AsType[*net.OpError](err); ok {
		return true
	}
	if _, ok := errors.AsType[*net.DNSError](err); ok {
		return true
	}
	if _, ok := errors.AsType[*pgconn.ConnectError](err); ok {
		return true
	}
	return pgconn.Timeout(err)
}

// Bounds of a downstream's Retry-After (RFC 9110 section 10.2.3) that the
// engine honours: a longer one is cut to MaxRetryAfter (a downstream's
// mistake must not silence a tool for a day), a shorter one (0, or a date
// already past) is raised to MinRetryAfter, so that a downstream answering
// "Retry-After: 0" forever cannot make the engine spin through its keys.
const (
	MaxRetryAfter = 10 * time.Minute
	MinRetryAfter = time.Second
)

// ThrottledError is the error of an Unknown whose downstream asked to be
// left alone for a while: an HTTP 429 or 503 with a valid Retry-After. The
// engine pauses the tool's probing for RetryAfter and counts no attempt
// against the key (see Throttled). A 429 or 503 without a readable
// Retry-After is an ordinary Unknown.
type ThrottledError struct {
	// Status is the HTTP status the downstream answered (429 or 503).
	Status int
	// RetryAfter is how long it asked to wait, within [MinRetryAfter,
	// MaxRetryAfter].
	RetryAfter time.Duration
}

func (e *ThrottledError) Error() string {
	return fmt.Sprintf("downstream answered %d %s with Retry-After %s: probing paused, no attempt counted",
		e.Status, http.StatusText(e.Status), e.RetryAfter)
}

// Throttled reports whether res is an Unknown whose downstream asked to be
// left alone, and for how long. Any probe may return it by wrapping a
// *ThrottledError in Result.Err.
func Throttled(res Result) (time.Duration, bool) {
	if res.Verdict != Unknown || res.Err == nil {
		return 0, false
	}
	te, ok := errors.AsType[*ThrottledError](res.Err)
	if !ok || te.RetryAfter <= 0 {
		return 0, false
	}
	return min(max(te.RetryAfter, MinRetryAfter), MaxRetryAfter), true
}

// parseRetryAfter reads a Retry-After value (package retryafter: delay-seconds
// or an HTTP-date, relative to now) clamped to [MinRetryAfter,
// MaxRetryAfter]. Anything else (empty, signed, fractional, not a date) is
// ignored: ok is false.
func parseRetryAfter(v string, now time.Time) (d time.Duration, ok bool) {
	d, ok = retryafter.Parse(v, now)
	if !ok {
		return 0, false
	}
	return min(max(d, MinRetryAfter), MaxRetryAfter), true
}
