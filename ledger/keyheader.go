package ledger

import (
	"context"
	"errors"
	"strings"
)

// ErrKeyHeaderInvalid is ParseKeyHeader's refusal of a quoted
// Idempotency-Key that is not a valid Structured Field String.
var ErrKeyHeaderInvalid = errors.New("the Idempotency-Key header is not a valid Structured Field String")

// ParseKeyHeader reads an Idempotency-Key header value. The IETF draft
// (draft-ietf-httpapi-idempotency-key-header) defines the header as an
// Item Structured Header whose value is a String (RFC 8941 §3.3.3):
// `Idempotency-Key: "wf-8812:step-3"`, quotes around printable ASCII, with
// `\"` and `\\` the only escapes. A quoted value is parsed as one, so a
// client that follows the draft and one that sends the bare key claim the
// same key. A value that does not start with a quote is the key as it
// stands (the bare form most clients send, and this package's before the
// draft). Surrounding spaces are ignored, as RFC 8941 parsing does.
func ParseKeyHeader(v string) (string, error) {
	v = strings.Trim(v, " \t")
	if !strings.HasPrefix(v, `"`) {
		return v, nil
	}
	var b strings.Builder
	for i := 1; i < len(v); i++ {
		c := v[i]
		switch {
		case c == '\\':
			i++
			if i == len(v) || (v[i] != '"' && v[i] != '\\') {
				return "", ErrKeyHeaderInvalid
			}
			b.WriteByte(v[i])
		case c == '"':
			// The string ends here; RFC 8941 allows parameters after an
			// Item (";name=value"), which the key does not use.
			if rest := v[i+1:]; rest != "" && !strings.HasPrefix(rest, ";") {
				return "", ErrKeyHeaderInvalid
			}
			return b.String(), nil
		case c < 0x20 || c > 0x7e:
			return "", ErrKeyHeaderInvalid
		default:
			b.WriteByte(c)
		}
	}
	return "", ErrKeyHeaderInvalid // no closing quote
}

// HeaderKey is the key a request's Idempotency-Key header claims:
// ParseKeyHeader's, except for a quoted value whose quoted form is already
// a row of the ledger. Before ParseKeyHeader, a quoted header was stored
// with its quotes; the retries of such a key keep claiming that row, so an
// attempt that straddles the upgrade is never run under a second key. The
// lookup costs one query, for quoted keys only.
func HeaderKey(ctx context.Context, db DBTX, raw string) (string, error) {
	key, err := ParseKeyHeader(raw)
	asSent := strings.Trim(raw, " \t")
	if err != nil || key == asSent {
		return key, err
	}
	switch _, err := Get(ctx, db, asSent); {
	case err == nil:
		return asSent, nil
	case errors.Is(err, ErrNotFound):
		return key, nil
	default:
		return "", err
	}
}
