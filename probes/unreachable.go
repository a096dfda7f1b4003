package probes

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"
)

// Unreachable reports whether an Unknown result means that the downstream
// did not answer: a transport error, a timeout, an HTTP 429 or 5xx, a
// database that refused the connection. Any other Unknown means the
// downstream answered and the probe did not understand the answer (a
// renamed field, an unexpected status, wrong credentials): the probe itself
// may be broken.
//
// The self-check uses the difference: a downstream that does not answer
// cannot vouch for its probe either way (the check is inconclusive and the
// circuit breaker counts it), while an answer the probe cannot read makes
// the probe untrusted.
func Unreachable(res Result) bool {
	if res.Verdict != Unknown {
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
