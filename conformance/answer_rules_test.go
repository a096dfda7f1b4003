package conformance

import (
	"strings"
	"testing"
)

// Keys go out as RFC 8941 sf-strings: quoted, `"` and `\` escaped, nothing
// else touched.
func TestSFString(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"":                      `""`,
		"wf-8812:step-3:create": `"wf-8812:step-3:create"`,
		`a"b`:                   `"a\"b"`,
		`a\b`:                   `"a\\b"`,
		`"`:                     `"\""`,
		"sp ace":                `"sp ace"`,
	} {
		if got := sfString(in); got != want {
			t.Errorf("sfString(%q) = %s, want %s", in, got, want)
		}
	}
}

// Bodies are evidence on one line: quoted (newlines escaped), clipped on a
// rune boundary.
func TestQuoteKeepsBodiesOnOneLine(t *testing.T) {
	t.Parallel()
	html := "<!DOCTYPE html>\n<html>\n<body><h1>502 Bad Gateway</h1></body>\n</html>\n"
	if got := quote([]byte(html)); strings.ContainsAny(got, "\n\r") || !strings.HasPrefix(got, `"<!DOCTYPE html>\n<html>`) {
		t.Errorf("quote(html) = %s", got)
	}
	long := strings.Repeat("é", clipAt) // two bytes each
	got := quote([]byte(long))
	if !strings.HasSuffix(got, `…"`) || strings.Contains(got, `\x`) || len(got) > clipAt+8 {
		t.Errorf("quote(long) = %s (%d bytes)", got, len(got))
	}
	if got := quote(nil); got != `""` {
		t.Errorf("quote(nil) = %s", got)
	}
}

// A replay is the same status and body, compared as canonical JSON with
// ledger.Middleware's idempotent_replay flag set aside (tolerated, never
// required); anything else in the body counts.
func TestNormalise(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		a, b string
		same bool
	}{
		{`{"id":"T-1","n":1}`, `{ "n":1, "id":"T-1" }`, true},
		{`{"ok":true,"idempotent_replay":false,"original_response":{"id":1}}`, `{"ok":true,"idempotent_replay":true,"original_response":{"id":1}}`, true},
		{`{"id":"T-1"}`, `{"id":"T-2"}`, false},
		{`{"original_response":{"idempotent_replay":false}}`, `{"original_response":{"idempotent_replay":true}}`, false},
		{"<html>a</html>", "<html>a</html>", true},
		{"<html>a</html>", "<html>b</html>", false},
		{"", "", true},
	} {
		if got := normalise([]byte(c.a)) == normalise([]byte(c.b)); got != c.same {
			t.Errorf("normalise(%s) == normalise(%s): %v, want %v", c.a, c.b, got, c.same)
		}
	}
	if (reply{}).replays(reply{}) {
		t.Error("two answers with no content (no answer at all) are not a replay")
	}
}

// An MCP in-flight answer is recognised by its retry-after, under the
// names a server may use, bare or vendor-prefixed; nothing else counts.
func TestRetryAfter(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		meta map[string]any
		want float64
		ok   bool
	}{
		{map[string]any{"ledgerkeeper/retryAfterSeconds": float64(2)}, 2, true},
		{map[string]any{"retryAfter": float64(1)}, 1, true},
		{map[string]any{"io.example/RetryAfter": float64(0)}, 0, true},
		{map[string]any{"retryAfter": int(3)}, 3, true},
		{map[string]any{"retryAfter": "2"}, 0, false},
		{map[string]any{"retryAfter": float64(-1)}, 0, false},
		{map[string]any{"retry": float64(1)}, 0, false},
		{nil, 0, false},
	} {
		got, ok := retryAfter(c.meta)
		if got != c.want || ok != c.ok {
			t.Errorf("retryAfter(%v) = %v, %v; want %v, %v", c.meta, got, ok, c.want, c.ok)
		}
	}
}
