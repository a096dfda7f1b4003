package secret

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/ledgerkeeper/ledgerkeeper/ledger/ledgertest/testwait"
)

func TestStringRemovesEveryFormOfARegisteredValue(t *testing.T) {
	t.Parallel()
	const tok = `s3cr3t/tok en+"<&>é`
	r := New()
	r.Register(tok)
	jsonStr, _ := json.Marshal(tok)
	for _, text := range []string{
		"raw " + tok + " end",
		"query http://x/v1?api=" + url.QueryEscape(tok) + "&k=1",
		"path http://x/" + url.PathEscape(tok) + "/y",
		"json {\"t\":" + string(jsonStr) + "}",
		fmt.Sprintf("go-quoted %q", tok),
		fmt.Sprintf("ascii %+q", tok),
	} {
		got := r.String(text)
		if strings.Contains(got, "s3cr3t") || !strings.Contains(got, Mask) {
			t.Errorf("%q → %q", text, got)
		}
	}
}

func TestShortAndEmptyValuesAreNotRegistered(t *testing.T) {
	t.Parallel()
	r := New()
	r.Register("", "  ", "1", "pw", "abc")
	if got := r.String("a pw of 1 abc"); got != "a pw of 1 abc" {
		t.Fatalf("short values redacted: %q", got)
	}
}

func TestLongestValueWinsAndMaskIsNeverRematched(t *testing.T) {
	t.Parallel()
	r := New()
	r.Register("dact", "abcd1234", "abcd")
	if got := r.String("x abcd1234 abcd y"); got != "x "+Mask+" "+Mask+" y" {
		t.Fatalf("got %q", got)
	}
}

func TestBuiltInPatterns(t *testing.T) {
	t.Parallel()
	var r *Redactor // nil: patterns only
	for _, c := range []struct{ in, want string }{
		{"dial postgres://app:hunter2@db:5432/x failed", "dial postgres://app:" + Mask + "@db:5432/x failed"},
		{"get https://u:p%40ss@api.example/v1?x=1", "get https://u:" + Mask + "@api.example/v1?x=1"},
		{"host=db user=app password=hunter2 dbname=x", "host=db user=app password=" + Mask + " dbname=x"},
		{"host=db password='with space' dbname=x", "host=db password=" + Mask + " dbname=x"},
		{"GET /v1?idempotency_key=k&api_key=abc123&x=1", "GET /v1?idempotency_key=k&api_key=" + Mask + "&x=1"},
		{"Authorization: Bearer eyJhbGciOi.J9x", "Authorization: Bearer " + Mask},
		// Every scheme passes the prefilter that spares the regexp.
		{"auth: bearer eyJhbGciOi.J9x", "auth: bearer " + Mask},
		{"auth: BEARER eyJhbGciOi.J9x", "auth: BEARER " + Mask},
		{"auth: Basic dXNlcjpwYXNz1", "auth: Basic " + Mask},
		{"auth: basic dXNlcjpwYXNz1", "auth: basic " + Mask},
		{"auth: Token 0123456789abcdef", "auth: Token " + Mask},
		{"token xoxb-123-456-abc", "token xox?-" + Mask},
		{"post https://hooks.slack.com/services/T0/B0/XYZ: 404", "post https://hooks.slack.com/" + Mask + ": 404"},
		// Prose and URLs without credentials stay as they are.
		{"Bearer authentication failed", "Bearer authentication failed"},
		{"http://host:8080/path and a@b.example", "http://host:8080/path and a@b.example"},
		{"key=wf-1 status=processing", "key=wf-1 status=processing"},
	} {
		if got := r.String(c.in); got != c.want {
			t.Errorf("%q:\n got %q\nwant %q", c.in, got, c.want)
		}
	}
}

func TestRegisterAlsoRegistersEmbeddedPasswords(t *testing.T) {
	t.Parallel()
	r := New()
	r.Register("postgres://app:pa55word@db:5432/ledger", "host=h user=u password='q uoted pw'")
	for _, text := range []string{
		"auth failed for pa55word", // a library printing the password alone
		"pgx: password q uoted pw rejected",
	} {
		if got := r.String(text); strings.Contains(got, "pa55word") || strings.Contains(got, "uoted pw") {
			t.Errorf("%q → %q", text, got)
		}
	}
}

func TestJSONRedactsDecodedStrings(t *testing.T) {
	t.Parallel()
	const tok = "tok<&>\"en"
	r := New()
	r.Register(tok, "keyname")
	// The writer chose escapes of its own: \u0074 is "t", \u003c is "<".
	doc := json.RawMessage(`{"err":"got \u0074ok\u003c\u0026\u003e\"en back","n":12345678901234567890,"list":["keyname",1.50],"keyname":true,"html":"<b>"}`)
	got := r.JSON(doc)
	if !json.Valid(got) {
		t.Fatalf("invalid JSON: %s", got)
	}
	var v map[string]any
	if err := json.Unmarshal(got, &v); err != nil {
		t.Fatal(err)
	}
	if v["err"] != "got "+Mask+" back" || strings.Contains(string(got), "keyname") {
		t.Fatalf("not redacted: %s", got)
	}
	// Numbers keep their exact text; HTML is not re-escaped.
	if !strings.Contains(string(got), "12345678901234567890") || !strings.Contains(string(got), "1.50") || !strings.Contains(string(got), `"<b>"`) {
		t.Fatalf("document changed beyond its secrets: %s", got)
	}
	// Nothing to redact: the very same bytes.
	clean := json.RawMessage(`{"a" : 1.0, "b":"\u0041"}`)
	if got := r.JSON(clean); string(got) != string(clean) {
		t.Fatalf("clean document rewritten: %s", got)
	}
	// Not JSON: a JSON string of the redacted text.
	bad := r.JSON(json.RawMessage(`{"a": "tok<&>"en`))
	var s string
	if err := json.Unmarshal(bad, &s); err != nil || strings.Contains(s, "tok<") {
		t.Fatalf("invalid document: %s (%v)", bad, err)
	}
}

func TestErrorKeepsChainAndRedactsMessage(t *testing.T) {
	t.Parallel()
	r := New()
	r.Register("hunter22")
	base := fmt.Errorf("open hunter22: %w", fs.ErrNotExist)
	err := r.Error(base)
	if strings.Contains(err.Error(), "hunter22") || !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("%v", err)
	}
	if r.Error(nil) != nil {
		t.Fatal("nil error became non-nil")
	}
}

type stringer struct{ s string }

func (s stringer) String() string { return s.s }

func TestHandlerRedactsMessageAndEveryAttribute(t *testing.T) {
	t.Parallel()
	const tok = "tok-abcdef"
	r := New()
	r.Register(tok)
	for _, format := range []string{"text", "json"} {
		var buf bytes.Buffer
		var h slog.Handler = slog.NewTextHandler(&buf, nil)
		if format == "json" {
			h = slog.NewJSONHandler(&buf, nil)
		}
		log := slog.New(NewHandler(h, r)).With("with", "w "+tok).WithGroup("g")
		log.Info("probe "+tok+" failed",
			"url", "http://x/?api_key="+tok,
			"err", errors.New("dial "+tok),
			"s", stringer{tok},
			"list", []string{tok},
			"grp", slog.GroupValue(slog.String("inner", tok)),
			"n", 5432, "d", 3)
		out := buf.String()
		if strings.Contains(out, "abcdef") || strings.Count(out, Mask) < 7 || !strings.Contains(out, "5432") {
			t.Errorf("%s: %s", format, out)
		}
	}
}

func TestWriterRedactsLinesSplitAcrossWrites(t *testing.T) {
	t.Parallel()
	r := New()
	r.Register("split-secret")
	var buf bytes.Buffer
	w := NewWriter(&buf, func() *Redactor { return r })
	for _, part := range []string{"a spl", "it-sec", "ret b\nnext split-", "secret"} {
		if _, err := w.Write([]byte(part)); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	if got := buf.String(); got != "a "+Mask+" b\nnext "+Mask {
		t.Fatalf("got %q", got)
	}
}

func TestConcurrentRegisterAndString(t *testing.T) {
	t.Parallel()
	r := New()
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for j := range 50 {
				r.Register(fmt.Sprintf("value-%d-%d", i, j))
				_ = r.String("value-1-1 value-2-2")
			}
		})
	}
	testwait.Wait(t, &wg, testwait.Timeout)
	if got := r.String("value-7-49"); got != Mask {
		t.Fatalf("got %q", got)
	}
}
