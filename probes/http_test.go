package probes_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/internal/fielderr"
	"github.com/ledgerkeeper/ledgerkeeper/probes"
)

// server is a loopback downstream that records what it received.
type server struct {
	*httptest.Server
	mu   sync.Mutex
	reqs []recorded
}

type recorded struct {
	Method  string
	Path    string // r.URL.Path (decoded)
	RawPath string // r.URL.EscapedPath()
	Query   url.Values
	Header  http.Header
}

func newServer(t *testing.T, h http.HandlerFunc) *server {
	t.Helper()
	s := &server{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.reqs = append(s.reqs, recorded{r.Method, r.URL.Path, r.URL.EscapedPath(), r.URL.Query(), r.Header.Clone()})
		s.mu.Unlock()
		h(w, r)
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *server) requests() []recorded {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]recorded(nil), s.reqs...)
}

// reply answers every request with status and body.
func reply(status int, body string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
	}
}

func newHTTP(t *testing.T, cfg probes.HTTPConfig) *probes.HTTPProbe {
	t.Helper()
	p, err := probes.NewHTTP(cfg)
	if err != nil {
		t.Fatalf("NewHTTP: %v", err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

var testKey = probes.Key{
	Key:         "wf-8812:step-3:create_ticket",
	Tool:        "create_ticket",
	RequestBody: json.RawMessage(`{"account_id":"acc-1","customer":{"id":"cus 7"},"items":[{"sku":"sku/1"}],"amount":1200,"flag":true,"nothing":null,"empty":"","obj":{"a":1}}`),
	CreatedAt:   time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC),
	ClaimedAt:   time.Date(2025, 1, 2, 3, 4, 6, 0, time.UTC),
}

func assertVerdict(t *testing.T, res probes.Result, want probes.Verdict) {
	t.Helper()
	if res.Verdict != want {
		t.Fatalf("verdict = %q (err: %v, evidence: %s), want %q", res.Verdict, res.Err, res.Evidence, want)
	}
	switch want {
	case probes.Unknown:
		if res.Err == nil {
			t.Fatalf("unknown without an error")
		}
	case probes.Found:
		if res.Outcome == nil || !json.Valid(res.Outcome.Body) {
			t.Fatalf("found with outcome %+v", res.Outcome)
		}
	case probes.NotFound:
		if res.Err != nil || res.Outcome != nil {
			t.Fatalf("not_found with err %v, outcome %+v", res.Err, res.Outcome)
		}
	}
	if len(res.Evidence) > 0 && !json.Valid(res.Evidence) {
		t.Fatalf("evidence is not JSON: %s", res.Evidence)
	}
}

// assertJSON compares JSON documents by their encoding after a decode with
// UseNumber, so numbers must match digit for digit.
func assertJSON(t *testing.T, got json.RawMessage, want string) {
	t.Helper()
	norm := func(b []byte) string {
		dec := json.NewDecoder(strings.NewReader(string(b)))
		dec.UseNumber()
		var v any
		if err := dec.Decode(&v); err != nil {
			t.Fatalf("not JSON: %s: %v", b, err)
		}
		out, _ := json.Marshal(v)
		return string(out)
	}
	if g, w := norm(got), norm([]byte(want)); g != w {
		t.Fatalf("JSON = %s, want %s", g, w)
	}
}

func TestHTTPVerdicts(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		match    string
		status   int
		body     string
		want     probes.Verdict
		wantBody string // for Found
		errHas   string // for Unknown
	}{
		{name: "404", match: "data", status: 404, body: `{"error":"no such ticket"}`, want: probes.NotFound},
		{name: "404 non-JSON", match: "data", status: 404, body: `<html>not found</html>`, want: probes.Unknown, errHas: "a 404 without a JSON body may come from a router, not the API"},
		{name: "empty array", match: "data", status: 200, body: `{"data":[]}`, want: probes.NotFound},
		{name: "empty object", match: "data", status: 200, body: `{"data":{}}`, want: probes.NotFound},
		{name: "null", match: "data", status: 200, body: `{"data":null}`, want: probes.NotFound},
		{name: "missing member", match: "data", status: 200, body: `{"meta":{"count":0}}`, want: probes.Unknown, errHas: "the answer has no member `data`: did the downstream's API change?"},
		{name: "missing nested member", match: "data.items", status: 200, body: `{"data":{"total":0}}`, want: probes.Unknown, errHas: "no member `items` in `data`"},
		{name: "index past the end", match: "data.1", status: 200, body: `{"data":[{"id":"t-1"}]}`, want: probes.Unknown, errHas: "no element 1"},
		{name: "whole document empty object", status: 200, body: `{}`, want: probes.NotFound},
		{name: "whole document null", status: 200, body: `null`, want: probes.NotFound},
		{name: "nested empty array", match: "data.items", status: 200, body: `{"data":{"items":[]}}`, want: probes.NotFound},
		{name: "whole document empty array", status: 200, body: `[]`, want: probes.NotFound},
		{name: "one object", match: "data", status: 200, body: `{"data":{"id":"t-1","n":1}}`, want: probes.Found, wantBody: `{"id":"t-1","n":1}`},
		{name: "array of one", match: "data", status: 200, body: `{"data":[{"id":"t-1"}]}`, want: probes.Found, wantBody: `{"id":"t-1"}`},
		{name: "201", match: "data", status: 201, body: `{"data":[{"id":"t-1"}]}`, want: probes.Found, wantBody: `{"id":"t-1"}`},
		{name: "whole document object", status: 200, body: `{"id":"t-1"}`, want: probes.Found, wantBody: `{"id":"t-1"}`},
		{name: "nested match with index", match: "result.0.tickets", status: 200, body: `{"result":[{"tickets":[{"id":"t-1"}]}]}`, want: probes.Found, wantBody: `{"id":"t-1"}`},
		{name: "exact numbers", match: "data", status: 200, body: `{"data":{"amount":12345678901234567890.10,"big":9007199254740993}}`, want: probes.Found, wantBody: `{"amount":12345678901234567890.10,"big":9007199254740993}`},
		{name: "big but sane exponent", match: "data", status: 200, body: `{"data":{"n":1e300,"m":-2.5E-300}}`, want: probes.Found, wantBody: `{"n":1e300,"m":-2.5E-300}`},
		{name: "unstorable NUL", match: "data", status: 200, body: `{"data":{"id":"a\u0000b"}}`, want: probes.Unknown, errHas: "NUL"},
		{name: "unstorable NUL in a key", match: "data", status: 200, body: `{"data":{"\u0000":1}}`, want: probes.Unknown, errHas: "NUL"},
		{name: "unstorable number", match: "data", status: 200, body: `{"data":{"n":1e999999}}`, want: probes.Unknown, errHas: "out of range"},
		{name: "array of two", match: "data", status: 200, body: `{"data":[{"id":"t-1"},{"id":"t-2"}]}`, want: probes.Duplicate},
		{name: "scalar string", match: "data", status: 200, body: `{"data":"t-1"}`, want: probes.Unknown, errHas: "string"},
		{name: "scalar number", match: "data", status: 200, body: `{"data":0}`, want: probes.Unknown, errHas: "number"},
		{name: "scalar false", match: "data", status: 200, body: `{"data":false}`, want: probes.Unknown, errHas: "boolean"},
		{name: "array of non-objects", match: "data", status: 200, body: `{"data":["t-1"]}`, want: probes.Unknown, errHas: "element 0"},
		{name: "array with a non-object", match: "data", status: 200, body: `{"data":[{"id":"t-1"},2]}`, want: probes.Unknown, errHas: "element 1"},
		{name: "array of an empty object", match: "data", status: 200, body: `{"data":[{}]}`, want: probes.Unknown, errHas: "empty object"},
		{name: "shape mismatch", match: "data.items", status: 200, body: `{"data":"oops"}`, want: probes.Unknown, errHas: "shape"},
		{name: "name into an array", match: "data.id", status: 200, body: `{"data":[{"id":"t-1"}]}`, want: probes.Unknown, errHas: "shape"},
		{name: "through null", match: "data.items", status: 200, body: `{"data":null}`, want: probes.Unknown, errHas: "shape"},
		{name: "index into an object", match: "data.0", status: 200, body: `{"data":{"id":"t-1"}}`, want: probes.Unknown, errHas: "no member `0` in `data`"},
		{name: "non-JSON", match: "data", status: 200, body: `<html>ok</html>`, want: probes.Unknown, errHas: "not JSON"},
		{name: "empty body", match: "data", status: 200, body: ``, want: probes.Unknown, errHas: "not JSON"},
		{name: "trailing garbage", match: "data", status: 200, body: `{"data":{"id":1}} {"x":2}`, want: probes.Unknown, errHas: "not JSON"},
		{name: "204", match: "data", status: 204, body: ``, want: probes.Unknown, errHas: "not JSON"},
		{name: "500", match: "data", status: 500, body: `{"error":"db down"}`, want: probes.Unknown, errHas: "500"},
		{name: "503", match: "data", status: 503, body: `upstream unavailable`, want: probes.Unknown, errHas: "503"},
		{name: "429", match: "data", status: 429, body: `slow down`, want: probes.Unknown, errHas: "429"},
		{name: "401", match: "data", status: 401, body: `{"error":"unauthorized"}`, want: probes.Unknown, errHas: "401"},
		{name: "400", match: "data", status: 400, body: `bad`, want: probes.Unknown, errHas: "400"},
		{name: "410", match: "data", status: 410, body: `gone`, want: probes.Unknown, errHas: "410"},
		{name: "304", match: "data", status: 304, body: ``, want: probes.Unknown, errHas: "304"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := newServer(t, reply(tt.status, tt.body))
			p := newHTTP(t, probes.HTTPConfig{URL: srv.URL + "/v1/tickets?idempotency_key={key}", Match: tt.match, ResponseCode: 201})
			res := p.Probe(context.Background(), testKey)
			assertVerdict(t, res, tt.want)
			if tt.want == probes.Found {
				if res.Outcome.Code != 201 {
					t.Errorf("code = %d, want 201", res.Outcome.Code)
				}
				assertJSON(t, res.Outcome.Body, tt.wantBody)
			}
			if tt.want == probes.Duplicate && res.Err == nil {
				t.Errorf("duplicate without a description")
			}
			if tt.errHas != "" && !strings.Contains(res.Err.Error(), tt.errHas) {
				t.Errorf("err = %q, want it to mention %q", res.Err, tt.errHas)
			}
			var ev map[string]any
			if err := json.Unmarshal(res.Evidence, &ev); err != nil {
				t.Fatalf("evidence %s: %v", res.Evidence, err)
			}
			if ev["http_status"] != float64(tt.status) || ev["method"] != "GET" || ev["url"] != "/v1/tickets?idempotency_key=wf-8812%3Astep-3%3Acreate_ticket" {
				t.Errorf("evidence = %s", res.Evidence)
			}
			if n := len(srv.requests()); n != 1 {
				t.Errorf("server got %d requests, want 1", n)
			}
		})
	}
}

// TestHTTPAbsenceMustBeExplicit: a downstream that renamed the member the
// match path names ("data" → "items") answers 200 for a ticket that
// exists; reading the missing member as absence would mark the key
// failed_retryable and the retry would create a second ticket. Only a
// present null, [] or {} is absence.
func TestHTTPAbsenceMustBeExplicit(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		body   string
		want   probes.Verdict
		errHas string
	}{
		{"renamed field", `{"items":[{"id":"t-1"}]}`, probes.Unknown, "match `data`: the answer has no member `data`: did the downstream's API change?"},
		{"renamed field, none there", `{"items":[]}`, probes.Unknown, "the answer has no member `data`"},
		{"missing member", `{"meta":{"count":0}}`, probes.Unknown, "the answer has no member `data`"},
		{"not an object", `[{"id":"t-1"}]`, probes.Unknown, "the shape differs: the answer is an array"},
		{"present null", `{"data":null}`, probes.NotFound, ""},
		{"present empty array", `{"data":[]}`, probes.NotFound, ""},
		{"present empty object", `{"data":{}}`, probes.NotFound, ""},
		{"present", `{"data":[{"id":"t-1"}]}`, probes.Found, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := newServer(t, reply(200, tt.body))
			p := newHTTP(t, probes.HTTPConfig{URL: srv.URL + "/v1/tickets?idempotency_key={key}", Match: "data"})
			res := p.Probe(context.Background(), testKey)
			assertVerdict(t, res, tt.want)
			if tt.errHas != "" && !strings.Contains(res.Err.Error(), tt.errHas) {
				t.Fatalf("err = %q, want it to say %q", res.Err, tt.errHas)
			}
			if len(srv.requests()) != 1 {
				t.Fatalf("server got %d requests, want 1", len(srv.requests()))
			}
		})
	}
}

// TestNewHTTPRefusesPathSpellings: "$.data" read as a dotted path names a
// member "$" that no answer has; it is refused with the dotted form.
func TestNewHTTPRefusesPathSpellings(t *testing.T) {
	t.Parallel()
	srv := newServer(t, reply(200, `{"data":[{"id":"t-1"}]}`))
	for _, tt := range []struct {
		match   string
		mapping map[string]string
		hint    string
	}{
		{"$.data", nil, `write "data"`},
		{"$.data[0]", nil, `write "data.0"`},
		{"$", nil, `write "" (empty: the whole answer)`},
		{"data[0]", nil, `write "data.0"`},
		{"/data/items", nil, `JSON Pointer; paths here are dotted: write "data.items"`},
		{"data", map[string]string{"id": "$.data[0].id"}, `response_body field "id": "$.data[0].id" looks like JSONPath`},
		{"data", map[string]string{"id": "/id"}, `write "id"`},
		{"$.data[*]", nil, "no wildcard"},
	} {
		p, err := probes.NewHTTP(probes.HTTPConfig{URL: srv.URL + "/v1/{key}", Match: tt.match, ResponseBody: tt.mapping})
		if err == nil {
			_ = p.Close()
			t.Errorf("match %q, response_body %v: accepted", tt.match, tt.mapping)
			continue
		}
		if !strings.Contains(err.Error(), tt.hint) {
			t.Errorf("match %q, response_body %v: err = %q, want it to contain %q", tt.match, tt.mapping, err, tt.hint)
		}
	}
	if n := len(srv.requests()); n != 0 {
		t.Fatalf("a refused probe sent %d requests", n)
	}
}

func TestHTTPEvidenceMatches(t *testing.T) {
	t.Parallel()
	for body, want := range map[string]string{
		`{"data":[]}`:                     `"matches":0`,
		`{"data":[{"id":1}]}`:             `"matches":1`,
		`{"data":[{"id":1},{"id":2},{}]}`: ``, // unknown: no count
		`{"data":[{"id":1},{"id":2}]}`:    `"matches":2`,
	} {
		srv := newServer(t, reply(200, body))
		p := newHTTP(t, probes.HTTPConfig{URL: srv.URL + "/t/{key}", Match: "data"})
		res := p.Probe(context.Background(), testKey)
		if want == "" {
			if strings.Contains(string(res.Evidence), "matches") {
				t.Errorf("%s: evidence %s counts matches of garbage", body, res.Evidence)
			}
		} else if !strings.Contains(string(res.Evidence), want) {
			t.Errorf("%s: evidence %s, want %s", body, res.Evidence, want)
		}
	}
}

func TestHTTPRedirectNotFollowed(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		client *http.Client
	}{
		{"own client", nil},
		// A caller's client that would follow redirects must not.
		{"caller's client", &http.Client{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			target := newServer(t, reply(200, `{"data":{"id":"forged"}}`))
			for _, status := range []int{301, 302, 307, 308} {
				redir := newServer(t, func(w http.ResponseWriter, r *http.Request) {
					http.Redirect(w, r, target.URL+"/v1/tickets", status)
				})
				p := newHTTP(t, probes.HTTPConfig{URL: redir.URL + "/v1/tickets/{key}", Match: "data", Client: tc.client})
				res := p.Probe(context.Background(), testKey)
				assertVerdict(t, res, probes.Unknown)
				if !strings.Contains(res.Err.Error(), fmt.Sprint(status)) || strings.Contains(res.Err.Error(), target.URL) {
					t.Errorf("err = %q: want the status, not the redirect target", res.Err)
				}
				if n := len(redir.requests()); n != 1 {
					t.Errorf("redirecting server got %d requests, want 1", n)
				}
			}
			if n := len(target.requests()); n != 0 {
				t.Errorf("redirect target got %d requests, want 0", n)
			}
		})
	}
}

func TestHTTPTimeout(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	arrived := make(chan struct{}, 1)
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	t.Cleanup(func() { close(release) }) // runs before srv.Close
	p := newHTTP(t, probes.HTTPConfig{URL: srv.URL + "/v1/{key}", Timeout: 100 * time.Millisecond})
	start := time.Now()
	res := p.Probe(context.Background(), testKey)
	assertVerdict(t, res, probes.Unknown)
	if !errors.Is(res.Err, context.DeadlineExceeded) {
		t.Errorf("err = %v, want it to wrap context.DeadlineExceeded", res.Err)
	}
	if !strings.Contains(res.Err.Error(), "100ms") {
		t.Errorf("err = %q, want it to name the timeout", res.Err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("probe took %s despite a 100ms timeout", d)
	}
	<-arrived
}

func TestHTTPTimeoutWhileReadingBody(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, `{"data":[{"id":"t-1"}`)
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	t.Cleanup(func() { close(release) })
	p := newHTTP(t, probes.HTTPConfig{URL: srv.URL + "/v1/{key}", Match: "data", Timeout: 100 * time.Millisecond})
	res := p.Probe(context.Background(), testKey)
	assertVerdict(t, res, probes.Unknown)
	if !errors.Is(res.Err, context.DeadlineExceeded) {
		t.Errorf("err = %v, want it to wrap context.DeadlineExceeded", res.Err)
	}
}

func TestHTTPCallerCancel(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	arrived := make(chan struct{})
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		close(arrived)
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	t.Cleanup(func() { close(release) })
	p := newHTTP(t, probes.HTTPConfig{URL: srv.URL + "/v1/{key}"})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-arrived:
			cancel()
		case <-ctx.Done():
		}
	}()
	res := p.Probe(ctx, testKey)
	assertVerdict(t, res, probes.Unknown)
	if !errors.Is(res.Err, context.Canceled) {
		t.Errorf("err = %v, want it to wrap context.Canceled", res.Err)
	}
}

func TestHTTPTransportError(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.NotFoundHandler())
	addr := srv.URL
	srv.Close() // nothing listens there any more
	p := newHTTP(t, probes.HTTPConfig{URL: addr + "/v1/{key}", Headers: map[string]string{"Authorization": "Bearer sekrit-token-123"}})
	res := p.Probe(context.Background(), testKey)
	assertVerdict(t, res, probes.Unknown)
	if strings.Contains(res.Err.Error(), "sekrit") {
		t.Errorf("err leaks a header: %v", res.Err)
	}
}

func TestHTTPBodyLimit(t *testing.T) {
	t.Parallel()
	const limit = 64
	exact := `{"data":{"id":"` + strings.Repeat("x", limit-len(`{"data":{"id":""}}`)) + `"}}`
	if len(exact) != limit {
		t.Fatalf("bad fixture: %d bytes", len(exact))
	}
	over := `{"data":{"id":"` + strings.Repeat("x", limit-len(`{"data":{"id":""}}`)+1) + `"}}`
	for _, tc := range []struct {
		body string
		want probes.Verdict
	}{
		{exact, probes.Found},
		{over, probes.Unknown},
		{strings.Repeat(" ", 10<<20) + `{"data":[]}`, probes.Unknown}, // a huge body is not read to the end
	} {
		srv := newServer(t, reply(200, tc.body))
		p := newHTTP(t, probes.HTTPConfig{URL: srv.URL + "/v1/{key}", Match: "data", MaxBodyBytes: limit})
		res := p.Probe(context.Background(), testKey)
		assertVerdict(t, res, tc.want)
		if tc.want == probes.Unknown && !strings.Contains(res.Err.Error(), "larger than 64 bytes") {
			t.Errorf("err = %q", res.Err)
		}
	}
}

func TestHTTPDefaultBodyLimit(t *testing.T) {
	t.Parallel()
	big := `{"data":[],"pad":"` + strings.Repeat("x", int(probes.DefaultMaxBodyBytes)) + `"}`
	srv := newServer(t, reply(200, big))
	p := newHTTP(t, probes.HTTPConfig{URL: srv.URL + "/v1/{key}", Match: "data"})
	assertVerdict(t, p.Probe(context.Background(), testKey), probes.Unknown)
}

func TestHTTPResponseBodyMapping(t *testing.T) {
	t.Parallel()
	srv := newServer(t, reply(200, `{"data":[{"id":"t-1","meta":{"created_at":"2025-01-02T03:04:05Z","tags":["a","b"]},"amount":10.50,"note":null}]}`))
	tests := []struct {
		name    string
		mapping map[string]string
		want    probes.Verdict
		body    string
	}{
		{"fields", map[string]string{"ticket_id": "id", "created_at": "meta.created_at", "first_tag": "meta.tags.0", "amount": "amount", "note": "note"}, probes.Found,
			`{"ticket_id":"t-1","created_at":"2025-01-02T03:04:05Z","first_tag":"a","amount":10.50,"note":null}`},
		{"whole object under a name", map[string]string{"ticket": ""}, probes.Found,
			`{"ticket":{"id":"t-1","meta":{"created_at":"2025-01-02T03:04:05Z","tags":["a","b"]},"amount":10.50,"note":null}}`},
		{"missing field", map[string]string{"ticket_id": "id", "url": "links.self"}, probes.Unknown, ""},
		{"index out of range", map[string]string{"tag": "meta.tags.5"}, probes.Unknown, ""},
		{"path through a scalar", map[string]string{"x": "id.y"}, probes.Unknown, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := newHTTP(t, probes.HTTPConfig{URL: srv.URL + "/v1/{key}", Match: "data", ResponseCode: 201, ResponseBody: tt.mapping})
			res := p.Probe(context.Background(), testKey)
			assertVerdict(t, res, tt.want)
			if tt.want == probes.Found {
				assertJSON(t, res.Outcome.Body, tt.body)
			} else if !strings.Contains(res.Err.Error(), "response_body field") {
				t.Errorf("err = %q", res.Err)
			}
		})
	}
}

func TestHTTPHeadersAreSentNeverShown(t *testing.T) {
	t.Parallel()
	const token = "Bearer tok-0123456789abcdef"
	// The downstream rejects the token and echoes it, as some do.
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusUnauthorized)
		fmt.Fprintf(w, `{"error":"invalid credentials %q for %s"}`, r.Header.Get("Authorization"), r.Header.Get("X-Api-Key"))
	})
	p := newHTTP(t, probes.HTTPConfig{
		URL:     srv.URL + "/v1/tickets?idempotency_key={key}",
		Headers: map[string]string{"Authorization": token, "X-Api-Key": "k3y-s3cr3t", "Accept": "application/vnd.tickets+json"},
	})
	res := p.Probe(context.Background(), testKey)
	assertVerdict(t, res, probes.Unknown)
	reqs := srv.requests()
	if len(reqs) != 1 {
		t.Fatalf("%d requests", len(reqs))
	}
	h := reqs[0].Header
	if h.Get("Authorization") != token || h.Get("X-Api-Key") != "k3y-s3cr3t" || h.Get("Accept") != "application/vnd.tickets+json" {
		t.Errorf("headers sent: %v", h)
	}
	for _, s := range []string{"tok-0123456789abcdef", "k3y-s3cr3t", "Bearer"} {
		if strings.Contains(res.Err.Error(), s) || strings.Contains(string(res.Evidence), s) {
			t.Errorf("secret %q shown: err %q, evidence %s", s, res.Err, res.Evidence)
		}
	}
	if !strings.Contains(res.Err.Error(), "401") || !strings.Contains(res.Err.Error(), "invalid credentials") {
		t.Errorf("err = %q: want the status and a snippet", res.Err)
	}
}

func TestHTTPErrorSnippetIsShortAndPrintable(t *testing.T) {
	t.Parallel()
	srv := newServer(t, reply(500, "line1\nline2\x00\x1b[31m"+strings.Repeat("é", 1000)+"\xff"))
	p := newHTTP(t, probes.HTTPConfig{URL: srv.URL + "/v1/{key}"})
	res := p.Probe(context.Background(), testKey)
	assertVerdict(t, res, probes.Unknown)
	msg := res.Err.Error()
	if len(msg) > 600 || strings.ContainsAny(msg, "\n\x00\x1b") {
		t.Errorf("err is not a short printable line (%d bytes): %q", len(msg), msg)
	}
}

func TestHTTPMethods(t *testing.T) {
	t.Parallel()
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodHead {
			if strings.HasSuffix(r.URL.Path, "/missing") {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusNotFound)
			}
			return
		}
		b, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, `{"data":{"method":%q,"body_bytes":%d}}`, r.Method, len(b))
	})

	post := newHTTP(t, probes.HTTPConfig{URL: srv.URL + "/search?key={key}", Method: "post", Match: "data"})
	res := post.Probe(context.Background(), testKey)
	assertVerdict(t, res, probes.Found)
	assertJSON(t, res.Outcome.Body, `{"method":"POST","body_bytes":0}`)
	if !strings.Contains(string(res.Evidence), `"method":"POST"`) {
		t.Errorf("evidence = %s", res.Evidence)
	}

	head := newHTTP(t, probes.HTTPConfig{URL: srv.URL + "/tickets/{key}", Method: "HEAD", ResponseCode: 201})
	res = head.Probe(context.Background(), testKey)
	assertVerdict(t, res, probes.Found)
	if res.Outcome.Code != 201 {
		t.Errorf("code = %d", res.Outcome.Code)
	}
	assertJSON(t, res.Outcome.Body, `{}`)

	headMissing := newHTTP(t, probes.HTTPConfig{URL: srv.URL + "/tickets/missing", Method: "HEAD"})
	assertVerdict(t, headMissing.Probe(context.Background(), testKey), probes.NotFound)

	var methods []string
	for _, r := range srv.requests() {
		methods = append(methods, r.Method)
	}
	if got := strings.Join(methods, ","); got != "POST,HEAD,HEAD" {
		t.Errorf("methods = %s", got)
	}
}

func TestHTTPRequestPlaceholders(t *testing.T) {
	t.Parallel()
	srv := newServer(t, reply(200, `{"data":[]}`))
	tests := []struct {
		tmpl      string
		body      string // request body; "-" for none
		wantPath  string // decoded path segments joined by |, "" when unknown
		wantQuery string
	}{
		{"/accounts/{request.account_id}/tickets?customer={request.customer.id}", "", "|accounts|acc-1|tickets", "customer=cus+7"},
		{"/skus/{request.items.0.sku}", "", "|skus|sku/1", ""},
		{"/x?amount={request.amount}&flag={request.flag}&tool={tool}", "", "|x", "amount=1200&flag=true&tool=create_ticket"},
		{"/x/{request.missing}", "", "", ""},
		{"/x/{request.customer.id.deeper}", "", "", ""},
		{"/x/{request.items.1.sku}", "", "", ""},
		{"/x/{request.nothing}", "", "", ""},
		{"/x/{request.empty}", "", "", ""},
		{"/x/{request.obj}", "", "", ""},
		{"/x/{request.items}", "", "", ""},
		{"/x/{request.account_id}", "-", "", ""},
		{"/x/{request.account_id}", "not json", "", ""},
		{"/x?big={request.n}", `{"n":123456789012345678901234567890}`, "|x", "big=123456789012345678901234567890"},
	}
	for _, tt := range tests {
		p := newHTTP(t, probes.HTTPConfig{URL: srv.URL + tt.tmpl, Match: "data"})
		k := testKey
		switch tt.body {
		case "":
		case "-":
			k.RequestBody = nil
		default:
			k.RequestBody = json.RawMessage(tt.body)
		}
		before := len(srv.requests())
		res := p.Probe(context.Background(), k)
		reqs := srv.requests()[before:]
		if tt.wantPath == "" {
			assertVerdict(t, res, probes.Unknown)
			if len(reqs) != 0 {
				t.Errorf("%s: probed with a bad value: %+v", tt.tmpl, reqs)
			}
			continue
		}
		assertVerdict(t, res, probes.NotFound)
		if len(reqs) != 1 {
			t.Fatalf("%s: %d requests", tt.tmpl, len(reqs))
		}
		if got := strings.Join(segments(t, reqs[0].RawPath), "|"); got != tt.wantPath {
			t.Errorf("%s: path segments %q, want %q", tt.tmpl, got, tt.wantPath)
		}
		if got := reqs[0].Query.Encode(); got != tt.wantQuery {
			t.Errorf("%s: query %q, want %q", tt.tmpl, got, tt.wantQuery)
		}
	}
}

// segments splits an escaped path into its decoded segments.
func segments(t *testing.T, escaped string) []string {
	t.Helper()
	parts := strings.Split(escaped, "/")
	for i, p := range parts {
		d, err := url.PathUnescape(p)
		if err != nil {
			t.Fatalf("segment %q: %v", p, err)
		}
		parts[i] = d
	}
	return parts
}

// Keys are chosen by agents and workflows: none may change where the probe
// goes or what it asks.
func TestHTTPHostileKeys(t *testing.T) {
	t.Parallel()
	srv := newServer(t, reply(200, `{"data":[]}`))
	p := newHTTP(t, probes.HTTPConfig{URL: srv.URL + "/v1/tickets/{key}/status?idempotency_key={key}&tool={tool}", Match: "data"})
	keys := []string{
		"a/b", "../../admin", "/", "?", "?x=1", "&", "a&b=c", "#", "#frag", "%", "%2F", "%zz", "100%",
		" ", "with space", "a+b", "a;b", "a,b", "a=b", "a:b", "@host", "\\", "\t\r\n", "'\"<>`{}|^",
		"ünïcødé-键-🔑", strings.Repeat("k", 128), strings.Repeat("/..", 42) + "/",
		"...", ".a", "a.", "%2e%2e", "%2E%2E",
	}
	perPath := map[string]int{}
	for _, key := range keys {
		k := testKey
		k.Key = key
		res := p.Probe(context.Background(), k)
		assertVerdict(t, res, probes.NotFound)
		reqs := srv.requests()
		r := reqs[len(reqs)-1]
		seg := segments(t, r.RawPath)
		if len(seg) != 5 || seg[0] != "" || seg[1] != "v1" || seg[2] != "tickets" || seg[3] != key || seg[4] != "status" {
			t.Errorf("key %q: path %q (segments %q)", key, r.RawPath, seg)
		}
		if !strings.HasPrefix(r.Path, "/v1/tickets/") || !strings.HasSuffix(r.Path, "/status") || r.Path[len("/v1/tickets/"):len(r.Path)-len("/status")] != key {
			t.Errorf("key %q: r.URL.Path = %q", key, r.Path)
		}
		if got := r.Query["idempotency_key"]; len(got) != 1 || got[0] != key {
			t.Errorf("key %q: idempotency_key = %q", key, got)
		}
		if got := r.Query["tool"]; len(got) != 1 || got[0] != testKey.Tool {
			t.Errorf("key %q: tool = %q", key, got)
		}
		if len(r.Query) != 2 {
			t.Errorf("key %q: query has %d parameters: %v", key, len(r.Query), r.Query)
		}
		perPath[seg[1]+"/"+seg[2]+"/*/"+seg[4]]++
	}
	if len(srv.requests()) != len(keys) || perPath["v1/tickets/*/status"] != len(keys) {
		t.Errorf("requests per path: %v for %d keys", perPath, len(keys))
	}
}

// A whole path segment of "." or ".." is removed by URL normalisation
// (escaped or not), so it is refused rather than sent; in the query it is
// harmless.
func TestHTTPDotSegmentKeys(t *testing.T) {
	t.Parallel()
	srv := newServer(t, reply(200, `{"data":[]}`))
	inPath := newHTTP(t, probes.HTTPConfig{URL: srv.URL + "/v1/tickets/{key}", Match: "data"})
	inQuery := newHTTP(t, probes.HTTPConfig{URL: srv.URL + "/v1/tickets?k={key}", Match: "data"})
	for _, key := range []string{".", ".."} {
		k := testKey
		k.Key = key
		res := inPath.Probe(context.Background(), k)
		assertVerdict(t, res, probes.Unknown)
		if !strings.Contains(res.Err.Error(), "dot-segment") {
			t.Errorf("err = %q", res.Err)
		}
		assertVerdict(t, inQuery.Probe(context.Background(), k), probes.NotFound)
	}
	reqs := srv.requests()
	if len(reqs) != 2 {
		t.Fatalf("%d requests, want 2 (query only)", len(reqs))
	}
	for i, want := range []string{".", ".."} {
		if reqs[i].Path != "/v1/tickets" || reqs[i].Query.Get("k") != want {
			t.Errorf("request %d: %+v", i, reqs[i])
		}
	}
}

func TestHTTPEmptyKeyRefused(t *testing.T) {
	t.Parallel()
	srv := newServer(t, reply(200, `{"data":[]}`))
	p := newHTTP(t, probes.HTTPConfig{URL: srv.URL + "/v1/tickets?k={key}", Match: "data"})
	k := testKey
	k.Key = ""
	assertVerdict(t, p.Probe(context.Background(), k), probes.Unknown)
	if n := len(srv.requests()); n != 0 {
		t.Errorf("%d requests with an empty key", n)
	}
}

func TestNewHTTPRejects(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		cfg    probes.HTTPConfig
		errHas string
	}{
		{"no url", probes.HTTPConfig{}, "http://"},
		{"ftp", probes.HTTPConfig{URL: "ftp://h/x"}, "http://"},
		{"no host", probes.HTTPConfig{URL: "http:///x/{key}"}, "host"},
		{"placeholder in host", probes.HTTPConfig{URL: "http://{key}.example/x"}, "host"},
		{"placeholder in port", probes.HTTPConfig{URL: "http://example:{request.port}/x"}, "host"},
		{"placeholder in scheme", probes.HTTPConfig{URL: "{tool}://example/x"}, "http://"},
		{"credentials", probes.HTTPConfig{URL: "http://user:pw@example/x"}, "credentials"},
		{"bad port", probes.HTTPConfig{URL: "http://example:99999x/x"}, "port"},
		{"fragment", probes.HTTPConfig{URL: "http://example/x?k={key}#f"}, "fragment"},
		{"unknown placeholder", probes.HTTPConfig{URL: "http://example/x/{id}"}, `"id"`},
		{"request without path", probes.HTTPConfig{URL: "http://example/x/{request.}"}, "needs a path"},
		{"request bare", probes.HTTPConfig{URL: "http://example/x/{request}"}, "unknown placeholder"},
		{"bad request path", probes.HTTPConfig{URL: "http://example/x/{request.a..b}"}, "empty segment"},
		{"unclosed brace", probes.HTTPConfig{URL: "http://example/x/{key"}, "'{' without '}'"},
		{"stray brace", probes.HTTPConfig{URL: "http://example/x/key}"}, "'}' without '{'"},
		{"unescaped literal", probes.HTTPConfig{URL: "http://example/a b/{key}"}, "percent-encoded"},
		{"method", probes.HTTPConfig{URL: "http://example/x", Method: "DELETE"}, "DELETE"},
		{"head with match", probes.HTTPConfig{URL: "http://example/x", Method: "HEAD", Match: "data"}, "HEAD"},
		{"head with body", probes.HTTPConfig{URL: "http://example/x", Method: "HEAD", ResponseBody: map[string]string{"a": "b"}}, "HEAD"},
		{"code", probes.HTTPConfig{URL: "http://example/x", ResponseCode: 99}, "response_code"},
		{"code high", probes.HTTPConfig{URL: "http://example/x", ResponseCode: 600}, "response_code"},
		{"match", probes.HTTPConfig{URL: "http://example/x", Match: ".data"}, "match"},
		{"mapping path", probes.HTTPConfig{URL: "http://example/x", ResponseBody: map[string]string{"id": "a."}}, `"id"`},
		{"mapping field", probes.HTTPConfig{URL: "http://example/x", ResponseBody: map[string]string{"": "a"}}, "empty output field"},
		{"timeout", probes.HTTPConfig{URL: "http://example/x", Timeout: -time.Second}, "timeout"},
		{"max body", probes.HTTPConfig{URL: "http://example/x", MaxBodyBytes: -1}, "max_body_bytes"},
		{"header name", probes.HTTPConfig{URL: "http://example/x", Headers: map[string]string{"Bad Name": "v"}}, "Bad Name"},
		{"header value", probes.HTTPConfig{URL: "http://example/x", Headers: map[string]string{"Authorization": "Bearer s3cr3t\r\nX-Evil: 1"}}, "Authorization"},
	}
	for _, tt := range tests {
		p, err := probes.NewHTTP(tt.cfg)
		if err == nil {
			_ = p.Close()
			t.Errorf("%s: NewHTTP(%+v) succeeded", tt.name, tt.cfg)
			continue
		}
		if !strings.Contains(err.Error(), tt.errHas) {
			t.Errorf("%s: err = %q, want it to mention %q", tt.name, err, tt.errHas)
		}
		if strings.Contains(err.Error(), "s3cr3t") {
			t.Errorf("%s: err leaks a header value: %q", tt.name, err)
		}
	}
}

func TestHTTPHostHeader(t *testing.T) {
	t.Parallel()
	var host string
	var mu sync.Mutex
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		host = r.Host
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		_, _ = io.WriteString(w, `{}`)
	})
	p := newHTTP(t, probes.HTTPConfig{URL: srv.URL + "/x/{key}", Headers: map[string]string{"host": "tickets.internal"}})
	assertVerdict(t, p.Probe(context.Background(), testKey), probes.NotFound)
	mu.Lock()
	defer mu.Unlock()
	if host != "tickets.internal" {
		t.Errorf("Host = %q", host)
	}
}

func TestHTTPConcurrent(t *testing.T) {
	t.Parallel()
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, `{"data":[{"key":%q}]}`, r.URL.Query().Get("k"))
	})
	p := newHTTP(t, probes.HTTPConfig{URL: srv.URL + "/x?k={key}", Match: "data", ResponseBody: map[string]string{"key": "key"}})
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() {
			k := testKey
			k.Key = fmt.Sprintf("key-%d", i)
			res := p.Probe(context.Background(), k)
			if res.Verdict != probes.Found || string(res.Outcome.Body) != fmt.Sprintf(`{"key":"key-%d"}`, i) {
				t.Errorf("key %d: %+v", i, res)
			}
		})
	}
	wg.Wait()
}

// nginxDefault404 is what an ingress's default backend answers for a path
// no route knows: a typo'd probe url gets it for every key.
const nginxDefault404 = "<html>\r\n<head><title>404 Not Found</title></head>\r\n<body>\r\n<center><h1>404 Not Found</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n"

// answer404 answers every request with a 404 of this Content-Type ("" for
// none) and body.
func answer404(contentType, body string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if contentType != "" {
			w.Header().Set("Content-Type", contentType)
		} else {
			// Without it net/http would sniff one from the body.
			w.Header()["Content-Type"] = nil
		}
		w.WriteHeader(http.StatusNotFound)
		_, _ = io.WriteString(w, body)
	}
}

const routerMsg = "a 404 without a JSON body may come from a router, not the API"

// A 404 is absence only when the API says so in JSON: a router's HTML,
// text or empty 404 is what every key gets when the probe's path is wrong,
// so it is unknown (and not unreachable: the downstream answered, the
// probe may be broken). not_found_on_404: any restores the old rule.
func TestHTTP404IsAbsenceOnlyWithAJSONBody(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name        string
		contentType string
		body        string
		want        probes.Verdict // with the default rule (json)
		errHas      []string
	}{
		{name: "JSON empty object", contentType: "application/json", body: `{}`, want: probes.NotFound},
		{name: "JSON error", contentType: "application/json; charset=utf-8", body: `{"error":{"code":"ticket_not_found","message":"no such ticket"}}`, want: probes.NotFound},
		{name: "problem+json", contentType: "application/problem+json", body: `{"type":"about:blank","status":404}`, want: probes.NotFound},
		{name: "JSON null", contentType: "application/json", body: `null`, want: probes.NotFound},
		{name: "nginx default backend", contentType: "text/html", body: nginxDefault404, want: probes.Unknown,
			errHas: []string{routerMsg, `Content-Type "text/html"`, `body "<html> <head><title>404 Not Found</title>`}},
		{name: "Go mux text", contentType: "text/plain; charset=utf-8", body: "404 page not found\n", want: probes.Unknown,
			errHas: []string{routerMsg, `Content-Type "text/plain; charset=utf-8"`, `body "404 page not found"`}},
		{name: "empty", body: ``, want: probes.Unknown, errHas: []string{routerMsg, "no Content-Type", "body (empty)"}},
		{name: "empty with a JSON Content-Type", contentType: "application/json", body: ``, want: probes.Unknown,
			errHas: []string{routerMsg, "the body is not JSON"}},
		{name: "JSON Content-Type, HTML body", contentType: "application/json", body: nginxDefault404, want: probes.Unknown,
			errHas: []string{routerMsg, `Content-Type "application/json", but the body is not JSON`}},
		{name: "JSON body, HTML Content-Type", contentType: "text/html", body: `{}`, want: probes.Unknown, errHas: []string{routerMsg}},
		{name: "bad Content-Type", contentType: "application/json;;", body: `{}`, want: probes.Unknown, errHas: []string{routerMsg}},
		{name: "JSON and trailing garbage", contentType: "application/json", body: `{} <html>`, want: probes.Unknown, errHas: []string{routerMsg}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := newServer(t, answer404(tt.contentType, tt.body))
			target := srv.URL + "/v1/tickets?idempotency_key={key}"
			for _, mode := range []string{"", probes.NotFoundOn404JSON} {
				res := newHTTP(t, probes.HTTPConfig{URL: target, Match: "data", NotFoundOn404: mode}).Probe(context.Background(), testKey)
				assertVerdict(t, res, tt.want)
				for _, s := range tt.errHas {
					if !strings.Contains(res.Err.Error(), s) {
						t.Errorf("not_found_on_404 %q: err = %q, want it to mention %q", mode, res.Err, s)
					}
				}
				if res.Verdict == probes.Unknown && (probes.Unreachable(res) || errors.Is(res.Err, probes.ErrNotRendered)) {
					t.Errorf("a router's 404 reads as a downstream that did not answer, or a key that could not be rendered: %v", res.Err)
				}
				if !strings.Contains(string(res.Evidence), `"http_status":404`) {
					t.Errorf("evidence = %s", res.Evidence)
				}
			}
			res := newHTTP(t, probes.HTTPConfig{URL: target, Match: "data", NotFoundOn404: probes.NotFoundOn404Any}).Probe(context.Background(), testKey)
			assertVerdict(t, res, probes.NotFound)
		})
	}
}

// A HEAD answer has no body: a 404 is absence when its Content-Type is
// JSON (the body a GET would get), unknown otherwise.
func TestHTTPHead404IsJudgedByItsContentType(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		contentType string
		want        probes.Verdict
	}{
		{"application/json", probes.NotFound},
		{"text/html", probes.Unknown},
		{"", probes.Unknown},
	} {
		srv := newServer(t, answer404(tc.contentType, ""))
		p := newHTTP(t, probes.HTTPConfig{URL: srv.URL + "/tickets/{key}", Method: "HEAD"})
		res := p.Probe(context.Background(), testKey)
		assertVerdict(t, res, tc.want)
		if tc.want == probes.Unknown && !strings.Contains(res.Err.Error(), routerMsg) {
			t.Errorf("%q: err = %v", tc.contentType, res.Err)
		}
		anyRule := newHTTP(t, probes.HTTPConfig{URL: srv.URL + "/tickets/{key}", Method: "HEAD", NotFoundOn404: "any"})
		assertVerdict(t, anyRule.Probe(context.Background(), testKey), probes.NotFound)
	}
}

// With not_found_body a JSON 404 is absence only when the member at its
// path holds its value: an ingress that answers JSON 404s of its own (for a
// route, not a ticket) is told apart from the API.
func TestHTTPNotFoundBodyMustSayAbsent(t *testing.T) {
	t.Parallel()
	const notAbsent = "the 404's body does not say the effect is absent: "
	tests := []struct {
		name   string
		equals string // default "ticket_not_found"
		ctype  string // default application/json
		body   string
		want   probes.Verdict
		errHas string
	}{
		{name: "match", body: `{"error":{"code":"ticket_not_found","message":"no such ticket"}}`, want: probes.NotFound},
		{name: "mismatch", body: `{"error":{"code":"route_not_found"}}`, want: probes.Unknown,
			errHas: notAbsent + `error.code is "route_not_found", want "ticket_not_found"`},
		{name: "empty string", body: `{"error":{"code":""}}`, want: probes.Unknown, errHas: `error.code is "", want "ticket_not_found"`},
		{name: "missing member", body: `{"error":{"message":"no route"}}`, want: probes.Unknown,
			errHas: notAbsent + "the body has no member `code` in `error`"},
		{name: "missing parent", body: `{}`, want: probes.Unknown, errHas: notAbsent + "the body has no member `error`"},
		{name: "parent is a string", body: `{"error":"ticket_not_found"}`, want: probes.Unknown, errHas: notAbsent + "the shape differs"},
		{name: "null", body: `{"error":{"code":null}}`, want: probes.Unknown, errHas: "error.code is null"},
		{name: "object", body: `{"error":{"code":{"name":"ticket_not_found"}}}`, want: probes.Unknown, errHas: "error.code is an object"},
		{name: "number matches its text", equals: "404", body: `{"error":{"code":404}}`, want: probes.NotFound},
		{name: "string matches a number's text", equals: "404", body: `{"error":{"code":"404"}}`, want: probes.NotFound},
		{name: "number spelt otherwise", equals: "404", body: `{"error":{"code":404.0}}`, want: probes.Unknown, errHas: `error.code is 404.0, want "404"`},
		{name: "boolean", equals: "true", body: `{"error":{"code":true}}`, want: probes.NotFound},
		{name: "boolean mismatch", equals: "true", body: `{"error":{"code":false}}`, want: probes.Unknown, errHas: `error.code is false, want "true"`},
		{name: "a router's HTML still", ctype: "text/html", body: nginxDefault404, want: probes.Unknown, errHas: routerMsg},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := newServer(t, answer404(cmpOr(tt.ctype, "application/json"), tt.body))
			p := newHTTP(t, probes.HTTPConfig{URL: srv.URL + "/v1/tickets/{key}",
				NotFoundBody: &probes.NotFoundBody{Path: "error.code", Equals: cmpOr(tt.equals, "ticket_not_found")}})
			res := p.Probe(context.Background(), testKey)
			assertVerdict(t, res, tt.want)
			if tt.errHas != "" && !strings.Contains(res.Err.Error(), tt.errHas) {
				t.Errorf("err = %q, want it to mention %q", res.Err, tt.errHas)
			}
		})
	}
	// A 2xx answer is judged by match alone, whatever not_found_body says.
	srv := newServer(t, reply(200, `{"data":[]}`))
	p := newHTTP(t, probes.HTTPConfig{URL: srv.URL + "/v1/tickets/{key}", Match: "data",
		NotFoundBody: &probes.NotFoundBody{Path: "error.code", Equals: "ticket_not_found"}})
	assertVerdict(t, p.Probe(context.Background(), testKey), probes.NotFound)
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// The 404 settings an operator can get wrong are refused by NewHTTP and, by
// their own keys, by CheckHTTPSettings (config check).
func TestHTTPNotFoundSettingsRefused(t *testing.T) {
	t.Parallel()
	body := func(path, equals string) *probes.NotFoundBody {
		return &probes.NotFoundBody{Path: path, Equals: equals}
	}
	tests := []struct {
		name       string
		cfg        probes.HTTPConfig
		newErrHas  string   // "" : NewHTTP accepts it
		wantFields []string // CheckHTTPSettings' fields
	}{
		{name: "json", cfg: probes.HTTPConfig{NotFoundOn404: "json"}},
		{name: "any", cfg: probes.HTTPConfig{NotFoundOn404: "any"}},
		{name: "json with a body", cfg: probes.HTTPConfig{NotFoundOn404: "json", NotFoundBody: body("error.code", "ticket_not_found")}},
		{name: "default with a body", cfg: probes.HTTPConfig{NotFoundBody: body("code", "404")}},
		{name: "unknown mode", cfg: probes.HTTPConfig{NotFoundOn404: "always"}, newErrHas: `not_found_on_404 "always" not supported (want json or any)`,
			wantFields: []string{"not_found_on_404"}},
		{name: "upper-case mode", cfg: probes.HTTPConfig{NotFoundOn404: "ANY"}, newErrHas: "not_found_on_404", wantFields: []string{"not_found_on_404"}},
		{name: "any with a body", cfg: probes.HTTPConfig{NotFoundOn404: "any", NotFoundBody: body("error.code", "ticket_not_found")},
			newErrHas: "not_found_body contradicts not_found_on_404: any", wantFields: []string{"not_found_body"}},
		{name: "HEAD with a body", cfg: probes.HTTPConfig{Method: "HEAD", NotFoundBody: body("error.code", "ticket_not_found")},
			newErrHas: "a HEAD response has no body", wantFields: []string{"not_found_body"}},
		{name: "body without a path", cfg: probes.HTTPConfig{NotFoundBody: body("", "ticket_not_found")},
			newErrHas: "not_found_body needs both path and equals", wantFields: []string{"not_found_body.path"}},
		{name: "body without equals", cfg: probes.HTTPConfig{NotFoundBody: body("error.code", "")},
			newErrHas: "not_found_body needs both path and equals", wantFields: []string{"not_found_body.equals"}},
		{name: "empty body", cfg: probes.HTTPConfig{NotFoundBody: body("", "")},
			newErrHas: "not_found_body needs both path and equals", wantFields: []string{"not_found_body.path", "not_found_body.equals"}},
		{name: "JSONPath spelling", cfg: probes.HTTPConfig{NotFoundBody: body("$.error.code", "x")},
			newErrHas: `not_found_body.path: "$.error.code" looks like JSONPath`, wantFields: []string{"not_found_body.path"}},
		{name: "empty segment", cfg: probes.HTTPConfig{NotFoundBody: body("error..code", "x")},
			newErrHas: "not_found_body.path: JSON path", wantFields: []string{"not_found_body.path"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := tt.cfg
			cfg.URL = "http://tickets.internal/v1/tickets/{key}"
			p, err := probes.NewHTTP(cfg)
			switch {
			case tt.newErrHas == "" && err != nil:
				t.Fatalf("NewHTTP: %v", err)
			case tt.newErrHas == "":
				_ = p.Close()
			case err == nil:
				_ = p.Close()
				t.Fatalf("NewHTTP accepted it, want an error mentioning %q", tt.newErrHas)
			case !strings.Contains(err.Error(), tt.newErrHas):
				t.Fatalf("NewHTTP: %v, want it to mention %q", err, tt.newErrHas)
			}
			var fields []string
			fes, _ := fielderr.All(probes.CheckHTTPSettings(cfg))
			for _, fe := range fes {
				fields = append(fields, fe.Field)
			}
			if strings.Join(fields, ",") != strings.Join(tt.wantFields, ",") {
				t.Fatalf("CheckHTTPSettings fields = %q (%v), want %q", fields, fes, tt.wantFields)
			}
		})
	}
}
