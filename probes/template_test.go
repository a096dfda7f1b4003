package probes

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

func TestRenderURL(t *testing.T) {
	t.Parallel()
	k := Key{Key: "a/b?c#d%e f", Tool: "create_ticket", RequestBody: json.RawMessage(`{"acc":"x&y=z","n":42,"items":[{"sku":"s/1"}]}`)}
	tests := []struct {
		tmpl, want string
	}{
		{"http://h/v1/{key}", "http://h/v1/a%2Fb%3Fc%23d%25e%20f"},
		{"http://h/v1?k={key}", "http://h/v1?k=a%2Fb%3Fc%23d%25e+f"},
		{"https://h:8443/t/{tool}/x-{key}-y?acc={request.acc}&n={request.n}", "https://h:8443/t/create_ticket/x-a%2Fb%3Fc%23d%25e%20f-y?acc=x%26y%3Dz&n=42"},
		{"http://h/s/{request.items.0.sku}", "http://h/s/s%2F1"},
		{"http://[::1]:80/{key}", "http://[::1]:80/a%2Fb%3Fc%23d%25e%20f"},
		{"http://h", "http://h"},
		{"http://h?k={key}", "http://h?k=a%2Fb%3Fc%23d%25e+f"},
		{"http://h/a%20b/{tool}", "http://h/a%20b/create_ticket"},
	}
	for _, tt := range tests {
		tmpl, err := parseURLTemplate(tt.tmpl)
		if err != nil {
			t.Errorf("%s: %v", tt.tmpl, err)
			continue
		}
		u, err := tmpl.render(k)
		if err != nil {
			t.Errorf("%s: render: %v", tt.tmpl, err)
			continue
		}
		if got := u.String(); got != tt.want {
			t.Errorf("%s:\n got %s\nwant %s", tt.tmpl, got, tt.want)
		}
	}
}

func TestEscapePathValue(t *testing.T) {
	t.Parallel()
	in := "AZaz09-._~ /?#%;,:@&=+$!'()*[]\x00\x7fé"
	got := escapePathValue(in)
	if strings.Trim(got, "AZaz-._~%0123456789BCDEF") != "" {
		t.Errorf("escapePathValue left reserved characters: %q", got)
	}
	if !strings.HasPrefix(got, "AZaz09-._~%20%2F%3F%23%25") {
		t.Errorf("escapePathValue(%q) = %q", in, got)
	}
}

// TestRenderURLIsRFC6570SimpleExpansion: a placeholder in the path is
// RFC 6570's simple string expansion ({var}, level 1): every byte but the
// unreserved characters percent-encoded, non-ASCII as its UTF-8 bytes
// (§1.6), upper-case hex. The want values are the RFC's own examples
// (§1.2, §3.2.1, §3.2.2) and UTF-8 cases a library got wrong (it encoded
// code points, so "é" became %E9 and "Ā" %01, and dropped NUL: a probe for
// another key). In the query the only difference is form encoding's '+'
// for a space, which query parsers read as a space.
func TestRenderURLIsRFC6570SimpleExpansion(t *testing.T) {
	t.Parallel()
	tests := []struct{ value, path, query string }{
		{"value", "value", "value"},
		{"Hello World!", "Hello%20World%21", "Hello+World%21"},
		{"50%", "50%25", "50%25"},
		{"1024", "1024", "1024"},
		{"/foo/bar", "%2Ffoo%2Fbar", "%2Ffoo%2Fbar"},
		{"here ?", "here%20%3F", "here+%3F"},
		{"ab,c;d=e&f", "ab%2Cc%3Bd%3De%26f", "ab%2Cc%3Bd%3De%26f"},
		{"~a-b_c.d", "~a-b_c.d", "~a-b_c.d"},
		{"é", "%C3%A9", "%C3%A9"},
		{"Ā", "%C4%80", "%C4%80"},
		{"🔑", "%F0%9F%94%91", "%F0%9F%94%91"},
		{"a\x00b", "a%00b", "a%00b"},
		{"%2F", "%252F", "%252F"},
	}
	tmpl, err := parseURLTemplate("http://h/x/{request.customer-id}?q={request.customer-id}")
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range tests {
		body, _ := json.Marshal(map[string]string{"customer-id": tt.value})
		u, err := tmpl.render(Key{Key: "k", Tool: "t", RequestBody: body})
		if err != nil {
			t.Errorf("%q: %v", tt.value, err)
			continue
		}
		if want := "http://h/x/" + tt.path + "?q=" + tt.query; u.String() != want {
			t.Errorf("%q:\n got %s\nwant %s", tt.value, u, want)
		}
	}
}

// TestPlaceholderNames: a dot in a placeholder walks the request body
// ({request.customer.id} is the member id of customer), as RFC 6570 allows
// dots in a varname; member names may hold what RFC 6570's varnames may not
// (a '-', non-ASCII), which is why the names are ours to parse.
func TestPlaceholderNames(t *testing.T) {
	t.Parallel()
	k := Key{Key: "k1", Tool: "create_ticket", RequestBody: json.RawMessage(`{"customer":{"id":"c 1","e-mail":"a@b","café":"x"},"customer.id":"flat"}`)}
	tests := []struct{ tmpl, want string }{
		{"http://h/{request.customer.id}", "http://h/c%201"},
		{"http://h/{request.customer.e-mail}", "http://h/a%40b"},
		{"http://h/{request.customer.café}", "http://h/x"},
		{"http://h/{tool}/{key}", "http://h/create_ticket/k1"},
	}
	for _, tt := range tests {
		tmpl, err := parseURLTemplate(tt.tmpl)
		if err != nil {
			t.Errorf("%s: %v", tt.tmpl, err)
			continue
		}
		u, err := tmpl.render(k)
		if err != nil {
			t.Errorf("%s: render: %v", tt.tmpl, err)
			continue
		}
		if u.String() != tt.want {
			t.Errorf("%s: got %s, want %s", tt.tmpl, u, tt.want)
		}
	}
}

// A probe that cannot be built for a key (a placeholder the request body
// lacks, a body that is not JSON, an empty value, a dot-segment) never asks
// the downstream; its Unknown wraps ErrNotRendered with the message it
// always had, and is not Unreachable: the self-check calls a made-up key
// that cannot be rendered inconclusive, not the probe untrusted.
func TestProbesThatCannotBeRenderedWrapErrNotRendered(t *testing.T) {
	t.Parallel()
	var asked atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"data":[]}`))
	}))
	t.Cleanup(srv.Close)
	httpProbe := func(path string) Probe {
		p, err := NewHTTP(HTTPConfig{URL: srv.URL + path, Match: "data"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Close() })
		return p
	}
	sqlProbe := func(arg string) Probe {
		// Never connects: the args are rendered first.
		p, err := NewSQL(context.Background(), SQLConfig{DatabaseURL: "postgres://probe:pw@127.0.0.1:1/none",
			Query: "SELECT 1 AS one WHERE $1::text <> ''", Args: []string{arg}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Close() })
		return p
	}
	byRef, byKey := httpProbe("/t/{request.ref}"), httpProbe("/t/{key}")
	sqlByRef, sqlByKey := sqlProbe("request.ref"), sqlProbe("key")
	key := func(k, body string) Key {
		out := Key{Key: k, Tool: "create_ticket"}
		if body != "" {
			out.RequestBody = json.RawMessage(body)
		}
		return out
	}
	tests := []struct {
		name    string
		probe   Probe
		key     Key
		wantErr string // the whole message; a prefix when it ends in "…"
	}{
		{"no request body", byRef, key("k", ""), "http probe: {request.ref}: the key has no request body"},
		{"request body not JSON", byRef, key("k", "not json"), "http probe: {request.ref}: the key's request body is not valid JSON: …"},
		{"member missing", byRef, key("k", `{"title":"x"}`), "http probe: {request.ref}: not in the key's request body"},
		{"empty value", byRef, key("k", `{"ref":""}`), "http probe: {request.ref}: empty value; refusing to probe with it"},
		{"not a scalar", byRef, key("k", `{"ref":{"id":1}}`), "http probe: {request.ref}: is an object in the key's request body, want a string, number or boolean"},
		{"dot-segment", byKey, key("..", ""), `http probe: {key}: value ".." would be a dot-segment in the URL path; refusing to probe with it`},
		{"empty key", byKey, key("", ""), "http probe: {key}: empty value; refusing to probe with it"},
		{"sql: no request body", sqlByRef, key("k", ""), "sql probe: args[0]: {request.ref}: the key has no request body"},
		{"sql: member missing", sqlByRef, key("k", `{}`), "sql probe: args[0]: {request.ref}: not in the key's request body"},
		{"sql: empty key", sqlByKey, key("", ""), "sql probe: args[0]: {key}: empty value; refusing to probe with it"},
	}
	for _, tt := range tests {
		res := tt.probe.Probe(context.Background(), tt.key)
		if res.Verdict != Unknown || res.Err == nil {
			t.Fatalf("%s: %+v, want unknown", tt.name, res)
		}
		if !errors.Is(res.Err, ErrNotRendered) {
			t.Errorf("%s: err %q does not wrap ErrNotRendered", tt.name, res.Err)
		}
		if prefix, ok := strings.CutSuffix(tt.wantErr, "…"); ok {
			if !strings.HasPrefix(res.Err.Error(), prefix) {
				t.Errorf("%s: err = %q, want it to start %q", tt.name, res.Err, prefix)
			}
		} else if res.Err.Error() != tt.wantErr {
			t.Errorf("%s: err = %q, want %q", tt.name, res.Err, tt.wantErr)
		}
		if Unreachable(res) {
			t.Errorf("%s: a key that cannot be rendered reads as an unreachable downstream", tt.name)
		}
	}
	if n := asked.Load(); n != 0 {
		t.Errorf("the downstream was asked %d times", n)
	}

	// What the downstream answers, or not, is not a rendering error.
	ok := byRef.Probe(context.Background(), key("k", `{"ref":"r-1"}`))
	refused := sqlByRef.Probe(context.Background(), key("k", `{"ref":"r-1"}`))
	if ok.Verdict != NotFound || refused.Verdict != Unknown || errors.Is(refused.Err, ErrNotRendered) || !Unreachable(refused) {
		t.Errorf("rendered probes: http %+v, sql %+v", ok, refused)
	}
}
