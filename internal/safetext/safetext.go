// Package safetext makes text safe to store in PostgreSQL and to send to
// Slack: valid UTF-8, no NUL bytes, and at most a given number of bytes, cut
// on a character boundary. It is the one truncation helper of ledgerkeeper:
// a cut in the middle of a UTF-8 sequence, or a NUL byte, makes a text
// column refuse the row (SQLSTATE 22021), and a decision whose evidence
// cannot be stored would leave its key undecided forever.
package safetext

import (
	"strings"
	"unicode/utf8"
)

// Ellipsis marks a cut.
const Ellipsis = "…"

// Clean replaces invalid UTF-8 with U+FFFD and drops NUL bytes.
func Clean(s string) string {
	if utf8.ValidString(s) && strings.IndexByte(s, 0) < 0 {
		return s
	}
	s = strings.ToValidUTF8(s, "\uFFFD")
	return strings.ReplaceAll(s, "\x00", "")
}

// Clip returns Clean(s) cut to at most maxBytes bytes on a character
// boundary, with Ellipsis appended (within maxBytes) when it was cut.
// maxBytes <= 0 means no bound.
func Clip(s string, maxBytes int) string {
	s = Clean(s)
	if maxBytes <= 0 || len(s) <= maxBytes {
		return s
	}
	limit := maxBytes - len(Ellipsis)
	if limit <= 0 {
		limit = maxBytes
	}
	cut := 0
	for i := range s { // i walks rune starts
		if i > limit {
			break
		}
		cut = i
	}
	if len(s) <= limit {
		cut = len(s)
	}
	out := s[:cut]
	if len(out)+len(Ellipsis) <= maxBytes {
		out += Ellipsis
	}
	return out
}

// ClipRunes is Clip measured in characters rather than bytes, for limits
// that count characters (Slack's header block: 150).
func ClipRunes(s string, maxRunes int) string {
	s = Clean(s)
	if maxRunes <= 0 || utf8.RuneCountInString(s) <= maxRunes {
		return s
	}
	n := 0
	for i := range s {
		if n == maxRunes-1 {
			return s[:i] + Ellipsis
		}
		n++
	}
	return s
}
