package probes

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestParsePath(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"", "data", "data.items", "result.0.id", "a.b.c.d", "ünï.cødé", "with space", "0"} {
		if _, err := parsePath(ok); err != nil {
			t.Errorf("parsePath(%q): %v", ok, err)
		}
	}
	for _, bad := range []string{".", ".data", "data.", "a..b", ".."} {
		if _, err := parsePath(bad); err == nil {
			t.Errorf("parsePath(%q) accepted", bad)
		}
	}
}

func TestPathLookup(t *testing.T) {
	t.Parallel()
	doc, err := decodeJSON([]byte(`{
		"data": {"items": [{"id": "a"}, {"id": "b", "n": 12345678901234567890.10}], "none": null, "s": "str", "0": "zero-key"},
		"list": [[1, 2], []],
		"flag": false
	}`))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		path string
		want string // JSON of the value
		st   lookupStatus
	}{
		{"", "", present},
		{"data.items.0.id", `"a"`, present},
		{"data.items.1.n", `12345678901234567890.10`, present},
		{"data.none", `null`, present},
		{"data.0", `"zero-key"`, present}, // a name on an object, even if numeric
		{"list.0.1", `2`, present},
		{"flag", `false`, present},
		{"missing", "", absent},
		{"data.missing.deeper", "", absent},
		{"data.items.2", "", absent},
		{"list.1.0", "", absent},
		{"data.items.id", "", mismatch},  // a name on an array
		{"data.items.-1", "", mismatch},  // not an index
		{"data.items.01", "", mismatch},  // not canonical
		{"data.items.+1", "", mismatch},  // not canonical
		{"data.items.1e0", "", mismatch}, // not canonical
		{"data.s.x", "", mismatch},       // into a string
		{"data.none.x", "", mismatch},    // into null
		{"flag.x", "", mismatch},         // into a boolean
		{"data.items.0.id.x", "", mismatch},
		{"data.items.99999999999999999999", "", mismatch}, // too large to be an index
	}
	for _, tt := range tests {
		p, err := parsePath(tt.path)
		if err != nil {
			t.Fatal(err)
		}
		v, st := p.lookup(doc)
		if st != tt.st {
			t.Errorf("%q: status %d, want %d", tt.path, st, tt.st)
			continue
		}
		if st == present && tt.want != "" {
			got, _ := json.Marshal(v)
			if string(got) != tt.want {
				t.Errorf("%q = %s, want %s", tt.path, got, tt.want)
			}
		}
	}
}

func TestDecodeJSON(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{`{}`, ` [1] `, "null\n", `"s"`, `1e400`} {
		if _, err := decodeJSON([]byte(ok)); err != nil {
			t.Errorf("decodeJSON(%q): %v", ok, err)
		}
	}
	for _, bad := range []string{``, ` `, `{`, `{} {}`, `[] x`, `{"a":1}]`, `nul`, `{"a":01}`, "\xff"} {
		if _, err := decodeJSON([]byte(bad)); err == nil {
			t.Errorf("decodeJSON(%q) accepted", bad)
		}
	}
	v, _ := decodeJSON([]byte(`{"n":9007199254740993}`))
	if got, _ := json.Marshal(v); string(got) != `{"n":9007199254740993}` {
		t.Errorf("number not kept exactly: %s", got)
	}
}

func TestSelectEffect(t *testing.T) {
	t.Parallel()
	tests := []struct {
		doc, match string
		want       Verdict
		matches    int
	}{
		{`{"data":[]}`, "data", NotFound, 0},
		{`{"data":{}}`, "data", NotFound, 0},
		{`{"data":null}`, "data", NotFound, 0},
		{`{}`, "data", Unknown, 0}, // a missing member is not absence
		{`{"data":{"items":[]}}`, "data.items", NotFound, 0},
		{`{"data":[]}`, "data.0", Unknown, 0}, // an index past the end is not absence
		{`{"items":[{"id":1}]}`, "data", Unknown, 0},
		{`{}`, "", NotFound, 0},
		{`[]`, "", NotFound, 0},
		{`null`, "", NotFound, 0},
		{`{"data":{"id":1}}`, "data", Found, 1},
		{`{"data":[{"id":1}]}`, "data", Found, 1},
		{`{"data":[{"id":1},{"id":2},{"id":3}]}`, "data", Duplicate, 3},
		{`{"data":[{"id":1},[]]}`, "data", Unknown, 0},
		{`{"data":[{}, {}]}`, "data", Unknown, 0},
		{`{"data":[null]}`, "data", Unknown, 0},
		{`{"data":"x"}`, "data", Unknown, 0},
		{`{"data":1}`, "data", Unknown, 0},
		{`{"data":true}`, "data", Unknown, 0},
		{`"x"`, "", Unknown, 0},
		{`5`, "data", Unknown, 0},
		{`[1]`, "data", Unknown, 0},
	}
	for _, tt := range tests {
		doc, err := decodeJSON([]byte(tt.doc))
		if err != nil {
			t.Fatal(err)
		}
		p, _ := parsePath(tt.match)
		sel := selectEffect(doc, p)
		if sel.verdict != tt.want || sel.matches != tt.matches {
			t.Errorf("%s match %q: %+v, want %s with %d matches", tt.doc, tt.match, sel, tt.want, tt.matches)
		}
		if (sel.verdict == Unknown || sel.verdict == Duplicate) && sel.err == nil {
			t.Errorf("%s match %q: %s without an error", tt.doc, tt.match, sel.verdict)
		}
		if sel.verdict == Found && sel.object == nil {
			t.Errorf("%s match %q: found without an object", tt.doc, tt.match)
		}
	}
}

func TestBuildBody(t *testing.T) {
	t.Parallel()
	doc, _ := decodeJSON([]byte(`{"id":"t-1","n":1.50,"html":"<a&b>","meta":{"at":"2025"}}`))
	obj := doc.(map[string]any)
	body, err := buildBody(obj, nil)
	if err != nil || !strings.Contains(string(body), `"n":1.50`) || !json.Valid(body) {
		t.Errorf("whole object: %s, %v", body, err)
	}
	m, err := parseMapping(map[string]string{"ticket_id": "id", "at": "meta.at", "all": ""})
	if err != nil {
		t.Fatal(err)
	}
	body, err = buildBody(obj, m)
	if err != nil || !json.Valid(body) {
		t.Fatalf("mapped: %s, %v", body, err)
	}
	var got map[string]any
	_ = json.Unmarshal(body, &got)
	if got["ticket_id"] != "t-1" || got["at"] != "2025" || got["all"].(map[string]any)["html"] != "<a&b>" || len(got) != 3 {
		t.Errorf("mapped body %s", body)
	}
	m, _ = parseMapping(map[string]string{"x": "meta.missing"})
	if _, err := buildBody(obj, m); err == nil || !strings.Contains(err.Error(), `"x"`) {
		t.Errorf("missing mapped path: %v", err)
	}
}
