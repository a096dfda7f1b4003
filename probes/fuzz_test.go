package probes

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"
)

// FuzzURLTemplate: whatever the key, tool and request values, the rendered
// URL parses, keeps the template's scheme, host, port and path prefix, and
// each value decodes back exactly from its own path segment or query value.
// A value that cannot be sent safely (empty; "." or ".." as a path segment)
// is refused instead.
func FuzzURLTemplate(f *testing.F) {
	for _, s := range [][3]string{
		{"wf-8812:step-3:create_ticket", "create_ticket", "acc-1"},
		{"a/b", "t?x", "c&d=e"},
		{"..", ".", "#frag"},
		{"%2F%2e%2E", "%", "%zz"},
		{" ", "+", "a+b c"},
		{"ünï/cødé-🔑", "\x00\r\n", "\xff\xfe"},
		{strings.Repeat("k", 128), "http://evil/", "@evil.example:80"},
		{"", "tool", ""},
		{"../../admin", "..;", "?q=1#x"},
	} {
		f.Add(s[0], s[1], s[2])
	}
	tmpl, err := parseURLTemplate("http://probe.test:8080/v1/{key}/x/{tool}?q={request.v}&k={key}")
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, key, tool, reqVal string) {
		body, err := json.Marshal(map[string]string{"v": reqVal})
		if err != nil {
			t.Fatal(err)
		}
		// JSON carries text: invalid UTF-8 arrives as U+FFFD.
		var decoded map[string]string
		if err := json.Unmarshal(body, &decoded); err != nil {
			t.Fatal(err)
		}
		wantV := decoded["v"]

		u, err := tmpl.render(Key{Key: key, Tool: tool, RequestBody: body})
		refused := func(s string) bool { return s == "" || s == "." || s == ".." }
		if refused(key) || refused(tool) || wantV == "" {
			if err == nil {
				t.Fatalf("rendered %s for key %q tool %q v %q; want a refusal", u, key, tool, wantV)
			}
			return
		}
		if err != nil {
			t.Fatalf("key %q tool %q v %q: %v", key, tool, wantV, err)
		}

		// What a client sends, parsed again as a server would.
		s := u.String()
		if _, err := http.NewRequest(http.MethodGet, s, nil); err != nil {
			t.Fatalf("%s: not a valid request URL: %v", s, err)
		}
		got, err := url.Parse(s)
		if err != nil {
			t.Fatalf("%s does not parse: %v", s, err)
		}
		if got.Scheme != "http" || got.Host != "probe.test:8080" || got.Hostname() != "probe.test" || got.Port() != "8080" || got.User != nil || got.Fragment != "" {
			t.Fatalf("%s: origin changed: %+v", s, got)
		}
		esc := got.EscapedPath()
		if !strings.HasPrefix(esc, "/v1/") {
			t.Fatalf("%s: path prefix lost: %s", s, esc)
		}
		segs := strings.Split(esc, "/")
		if len(segs) != 5 || segs[0] != "" || segs[1] != "v1" || segs[3] != "x" {
			t.Fatalf("%s: path structure changed: %q", s, segs)
		}
		for i, want := range map[int]string{2: key, 4: tool} {
			dec, err := url.PathUnescape(segs[i])
			if err != nil || dec != want {
				t.Fatalf("%s: segment %d decodes to %q (%v), want %q", s, i, dec, err, want)
			}
		}
		if got.Path != "/v1/"+key+"/x/"+tool {
			t.Fatalf("%s: decoded path %q", s, got.Path)
		}
		q, err := url.ParseQuery(got.RawQuery)
		if err != nil {
			t.Fatalf("%s: query does not parse: %v", s, err)
		}
		if len(q) != 2 || len(q["q"]) != 1 || q["q"][0] != wantV || len(q["k"]) != 1 || q["k"][0] != key {
			t.Fatalf("%s: query %q, want q=%q k=%q", s, q, wantV, key)
		}
	})
}

// FuzzJSONMatch: on any response body, match path and response_body path,
// evaluation never panics, always yields one of the four verdicts in the
// shape Guard accepts, and a found outcome's body is a valid JSON object.
func FuzzJSONMatch(f *testing.F) {
	for _, s := range [][3]string{
		{`{"data":[{"id":"t-1","meta":{"at":"2025"}}]}`, "data", "meta.at"},
		{`{"data":[{"id":1},{"id":2}]}`, "data", ""},
		{`{"data":{"n":12345678901234567890.10}}`, "data", "n"},
		{`{"data":null}`, "data.x", "id"},
		{`[{"a":[{"b":1}]}]`, "0.a.0", "b"},
		{`{"data":"x"}`, "data", "id"},
		{`{"data":[{}]}`, "data", ""},
		{`{"a":"\ud800"}`, "", "a"},
		{`{"a":1e999999}`, "", "a"},
		{`not json`, "", ""},
		{`{"a":1} {"b":2}`, "a", ""},
		{`{"data":[{"id":1}]}`, "data.", "x..y"},
		{`{"items":[{"id":1}]}`, "data", "id"},
		{`{"data":[{"id":1}]}`, "data.1", "id"},
		{`{"data":{"id":1}}`, "$.data", "$.id"},
	} {
		f.Add([]byte(s[0]), s[1], s[2])
	}
	f.Fuzz(func(t *testing.T, body []byte, match, mapped string) {
		mp, errMatch := parsePath(match)
		mapping, errMap := parseMapping(map[string]string{"field": mapped})
		if doc, err := decodeJSON(body); err == nil {
			mp.lookup(doc) // must not panic, whatever the path
		}
		if errMatch != nil || errMap != nil {
			return
		}
		for _, m := range []map[string]jsonPath{nil, mapping} {
			p := &HTTPProbe{match: mp, mapping: m, code: 200}
			res := p.evaluate(body, httpEvidence{Method: "GET", URL: "/", HTTPStatus: 200}, "GET /")
			checkResult(t, res)
			if res.Verdict == NotFound {
				// Absence is explicit: the match path is present and
				// holds null, [] or {}.
				doc, _ := decodeJSON(body)
				if v, miss := mp.find(doc); miss != nil || !isEmpty(v) {
					t.Fatalf("not_found for match %q on %s, which does not hold null, [] or {} there", match, body)
				}
			}
			if res.Verdict == Found && m == nil {
				// The whole matched object: re-selecting it must agree.
				doc, _ := decodeJSON(body)
				sel := selectEffect(doc, mp)
				want, _ := json.Marshal(sel.object)
				if string(want) != string(res.Outcome.Body) {
					t.Fatalf("body %s, want %s", res.Outcome.Body, want)
				}
			}
		}
		// The sql probe's row mapping, on any object.
		if doc, err := decodeJSON(body); err == nil {
			if obj, ok := doc.(map[string]any); ok {
				if out, err := buildRowBody(obj, mapping); err == nil && !isJSONObject(out) {
					t.Fatalf("row body %s is not a JSON object", out)
				}
			}
		}
	})
}

func checkResult(t *testing.T, res Result) {
	t.Helper()
	if !res.Verdict.Valid() {
		t.Fatalf("verdict %q", res.Verdict)
	}
	if len(res.Evidence) > 0 && !json.Valid(res.Evidence) {
		t.Fatalf("evidence %s is not JSON", res.Evidence)
	}
	switch res.Verdict {
	case Found:
		if res.Outcome == nil || !isJSONObject(res.Outcome.Body) || res.Err != nil {
			t.Fatalf("found: %+v", res)
		}
		if doc, _ := decodeJSON(res.Outcome.Body); checkStorable(doc) != nil {
			t.Fatalf("found an outcome jsonb cannot store: %s", res.Outcome.Body)
		}
	case NotFound:
		if res.Outcome != nil || res.Err != nil {
			t.Fatalf("not_found: %+v", res)
		}
	case Unknown:
		if res.Err == nil || res.Outcome != nil {
			t.Fatalf("unknown: %+v", res)
		}
	}
	if s := sanitize(res); s.Verdict != res.Verdict {
		t.Fatalf("Guard would turn %+v into %+v", res, s)
	}
}

func isJSONObject(b []byte) bool {
	if !json.Valid(b) {
		return false
	}
	v, err := decodeJSON(b)
	_, ok := v.(map[string]any)
	return err == nil && ok
}

// FuzzCheckSelect: the sql probe's first-keyword check never panics, and
// what it accepts stays accepted behind leading comments, while the same
// text after a statement that is not a SELECT is refused.
func FuzzCheckSelect(f *testing.F) {
	for _, s := range []string{
		"SELECT id FROM charges WHERE idempotency_key = $1;",
		"/* a /* nested */ one */ WITH x AS (SELECT 1) SELECT * FROM x",
		"-- comment\nselect 1",
		"SELECT 1; DELETE FROM t",
		"DELETE FROM t",
		"/* unterminated",
		";",
		"",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, q string) {
		if CheckQuery(q) != nil {
			return
		}
		for _, prefix := range []string{"/* c */ ", "-- c\n", " \n\t"} {
			if err := CheckQuery(prefix + q); err != nil {
				t.Fatalf("%q accepted but %q refused: %v", q, prefix+q, err)
			}
		}
		if CheckQuery("DELETE FROM t; "+q) == nil {
			t.Fatalf("a DELETE before %q accepted", q)
		}
	})
}
