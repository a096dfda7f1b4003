package lease

import (
	"regexp"
	"testing"
)

func TestToken(t *testing.T) {
	t.Parallel()
	shape := regexp.MustCompile(`^host-1:42/[0-9a-f]{12}$`)
	seen := map[string]bool{}
	for range 1000 {
		tok := Token("host-1:42")
		if !shape.MatchString(tok) {
			t.Fatalf("Token = %q, want host-1:42/ and 12 hex digits", tok)
		}
		if seen[tok] {
			t.Fatalf("Token repeated %q within 1000 draws", tok)
		}
		seen[tok] = true
	}
}
