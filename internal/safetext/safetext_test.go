package safetext

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// safe is what every result must be: valid UTF-8 without NUL.
func safe(t *testing.T, s string) {
	t.Helper()
	if !utf8.ValidString(s) || strings.IndexByte(s, 0) >= 0 {
		t.Fatalf("unsafe text %q", s)
	}
}

func TestClean(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ in, want string }{
		{"plain", "plain"},
		{"nul\x00byte", "nulbyte"},
		{"bad\xff\xfeutf8", "bad\uFFFDutf8"},
		{"cut é\xc3", "cut é\uFFFD"},
		{"\x00\x00", ""},
	} {
		got := Clean(c.in)
		safe(t, got)
		if got != c.want {
			t.Errorf("Clean(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestClipIsBoundedAndCutsOnCharacters(t *testing.T) {
	t.Parallel()
	e3000 := strings.Repeat("é", 1500) // 3,000 bytes of "é"
	for _, c := range []struct {
		in  string
		max int
	}{
		{e3000, 500}, {e3000, 501}, {e3000, 1}, {e3000, 2}, {e3000, 3}, {e3000, 4},
		{"abc\x00" + e3000 + "\xff", 100},
		{strings.Repeat("€", 10), 10},
		{strings.Repeat("😀", 10), 9},
	} {
		got := Clip(c.in, c.max)
		safe(t, got)
		if len(got) > c.max {
			t.Errorf("Clip(%d bytes, %d) = %d bytes", len(c.in), c.max, len(got))
		}
		if c.max >= 4+len(Ellipsis) && !strings.HasSuffix(got, Ellipsis) {
			t.Errorf("Clip(%d bytes, %d) = %q: no ellipsis", len(c.in), c.max, got)
		}
	}
	// The longest prefix that fits with the ellipsis is kept.
	if got := Clip(e3000, 501); got != strings.Repeat("é", 249)+Ellipsis {
		t.Errorf("Clip(é×1500, 501) = %d bytes %q…", len(got), got[:10])
	}
	if got := Clip("short", 5); got != "short" {
		t.Errorf("a text that fits was cut: %q", got)
	}
	if got := Clip("a\x00b", 0); got != "ab" {
		t.Errorf("maxBytes 0 must only clean: %q", got)
	}
}

func TestClipRunes(t *testing.T) {
	t.Parallel()
	e3000 := strings.Repeat("é", 1500)
	got := ClipRunes(e3000+"\x00\xff", 150)
	safe(t, got)
	if n := utf8.RuneCountInString(got); n != 150 || !strings.HasSuffix(got, Ellipsis) {
		t.Fatalf("%d runes, %q", n, got)
	}
	if got := ClipRunes("héllo", 5); got != "héllo" {
		t.Fatalf("fits but cut: %q", got)
	}
	if got := ClipRunes("héllo!", 5); got != "héll"+Ellipsis {
		t.Fatalf("got %q", got)
	}
	if got := ClipRunes("ab", 1); got != Ellipsis {
		t.Fatalf("got %q", got)
	}
}

func FuzzClip(f *testing.F) {
	f.Add("é\x00\xff", 3)
	f.Add(strings.Repeat("é", 100), 7)
	f.Fuzz(func(t *testing.T, s string, n int) {
		n = n % 4096
		got := Clip(s, n)
		safe(t, got)
		if n > 0 && len(got) > n {
			t.Fatalf("Clip(%q, %d) = %q: too long", s, n, got)
		}
		if c := Clean(s); n <= 0 || len(c) <= n {
			if got != c {
				t.Fatalf("Clip(%q, %d) = %q, want the cleaned text %q", s, n, got, c)
			}
		} else if !strings.HasPrefix(c, strings.TrimSuffix(got, Ellipsis)) {
			t.Fatalf("Clip(%q, %d) = %q is not a prefix", s, n, got)
		}
		r := ClipRunes(s, n)
		safe(t, r)
		if n > 0 && utf8.RuneCountInString(r) > n {
			t.Fatalf("ClipRunes(%q, %d) = %q: too long", s, n, r)
		}
	})
}
