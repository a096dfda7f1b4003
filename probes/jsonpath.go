package probes

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// jsonPath is a parsed dotted path into a JSON document: "data",
// "data.items", "result.0.id". A segment selects an object's member by
// name, or an array's element by a decimal index. The empty path selects the
// whole document. Member names containing "." cannot be expressed.
type jsonPath struct {
	raw  string
	segs []string
}

func parsePath(s string) (jsonPath, error) {
	if s == "" {
		return jsonPath{}, nil
	}
	segs := strings.Split(s, ".")
	for i, seg := range segs {
		if seg == "" {
			return jsonPath{}, fmt.Errorf("JSON path %q: empty segment %d (paths look like data.items.0.id)", s, i+1)
		}
	}
	return jsonPath{raw: s, segs: segs}, nil
}

func (p jsonPath) String() string { return p.raw }

// CheckPathSpelling refuses the JSONPath ("$.data[0].id") and JSON Pointer
// ("/data/0/id") spellings of a dotted path, with the dotted form as a hint.
// Read as dotted paths they would name members no answer has ("$", "data[0]"),
// so every probe would be unknown; refusing them at load says why at once.
// A '$', '[' or ']' anywhere, or a leading '/', is refused: no real member
// name needs them. config check calls it to name the file, line and key.
func CheckPathSpelling(path string) error {
	switch {
	case strings.HasPrefix(path, "/"):
		return fmt.Errorf("%q is a JSON Pointer; paths here are dotted: write %s", path, hintOf(pointerToDotted(path)))
	case strings.ContainsAny(path, "$[]"):
		hint := hintOf(jsonPathToDotted(path))
		if strings.Contains(path, "*") {
			hint += " (dotted paths have no wildcard: match the array itself)"
		}
		return fmt.Errorf("%q looks like JSONPath (it has a '$', '[' or ']'); paths here are dotted: write %s", path, hint)
	}
	return nil
}

// hintOf quotes a suggested dotted path, explaining the empty one.
func hintOf(dotted string) string {
	if dotted == "" {
		return `"" (empty: the whole answer)`
	}
	return fmt.Sprintf("%q", dotted)
}

// jsonPathToDotted rewrites "$.data[0].id" or "$['data'][0]" as "data.0.id"
// or "data.0", as a hint; it does not validate.
func jsonPathToDotted(s string) string {
	s = strings.TrimPrefix(s, "$")
	r := strings.NewReplacer("['", ".", "']", "", `["`, ".", `"]`, "", "[", ".", "]", "", "$", "")
	s = r.Replace(s)
	var segs []string
	for _, seg := range strings.Split(s, ".") {
		if seg != "" {
			segs = append(segs, seg)
		}
	}
	return strings.Join(segs, ".")
}

// pointerToDotted rewrites the RFC 6901 pointer "/data/items" as
// "data.items", as a hint.
func pointerToDotted(s string) string {
	var segs []string
	for _, seg := range strings.Split(strings.TrimPrefix(s, "/"), "/") {
		seg = strings.ReplaceAll(strings.ReplaceAll(seg, "~1", "/"), "~0", "~")
		if seg != "" {
			segs = append(segs, seg)
		}
	}
	return strings.Join(segs, ".")
}

// parseMatchPath parses a match or response_body path, refusing the
// JSONPath and JSON Pointer spellings.
func parseMatchPath(s string) (jsonPath, error) {
	if err := CheckPathSpelling(s); err != nil {
		return jsonPath{}, err
	}
	return parsePath(s)
}

// lookupStatus says how a lookup ended. absent and mismatch are told apart
// for error messages only: neither is evidence of absence, because an answer
// that lacks the path altogether usually means the path is wrong or the
// downstream's API changed, not that the effect does not exist.
type lookupStatus int

const (
	// present: the path selects a value (which may be null).
	present lookupStatus = iota
	// absent: an object lacks the member, or an array is too short.
	absent
	// mismatch: the document's shape differs from what the path expects:
	// a segment applied to a scalar or null, or a name applied to an array.
	mismatch
)

// pathMiss says where and why a path does not select a value in a document.
type pathMiss struct {
	path   jsonPath
	at     int          // index of the segment that could not be applied
	status lookupStatus // absent or mismatch
	parent any          // the value the segment was applied to
}

// describe explains the miss in words an operator can act on; root names
// the document ("the answer", "the matched object"). Only configured path
// segments and JSON type names are quoted, never downstream data.
func (m *pathMiss) describe(root string) string {
	seg := m.path.segs[m.at]
	where := root
	if m.at > 0 {
		where = "`" + strings.Join(m.path.segs[:m.at], ".") + "` in " + root
	}
	switch x := m.parent.(type) {
	case map[string]any:
		if m.at == 0 {
			return fmt.Sprintf("%s has no member `%s`", root, seg)
		}
		return fmt.Sprintf("%s has no member `%s` in `%s`", root, seg, strings.Join(m.path.segs[:m.at], "."))
	case []any:
		if m.status == absent {
			return fmt.Sprintf("the shape differs: %s is an array of %d elements, with no element %s", where, len(x), seg)
		}
		return fmt.Sprintf("the shape differs: %s is an array, and `%s` is not an element index (0, 1, …)", where, seg)
	case nil:
		return fmt.Sprintf("the shape differs: %s is null, where the path goes on to `%s`", where, seg)
	default:
		return fmt.Sprintf("the shape differs: %s is %s, where the path goes on to `%s`", where, describe(x), seg)
	}
}

// lookup evaluates p over v, a document decoded by decodeJSON.
func (p jsonPath) lookup(v any) (any, lookupStatus) {
	v, miss := p.find(v)
	if miss != nil {
		return nil, miss.status
	}
	return v, present
}

// find evaluates p over v and, when the path does not select a value, says
// where it stopped.
func (p jsonPath) find(v any) (any, *pathMiss) {
	for i, seg := range p.segs {
		miss := &pathMiss{path: p, at: i, status: absent, parent: v}
		switch x := v.(type) {
		case map[string]any:
			next, ok := x[seg]
			if !ok {
				return nil, miss
			}
			v = next
		case []any:
			n, ok := arrayIndex(seg)
			if !ok {
				miss.status = mismatch
				return nil, miss
			}
			if n >= len(x) {
				return nil, miss
			}
			v = x[n]
		default:
			miss.status = mismatch
			return nil, miss
		}
	}
	return v, nil
}

// arrayIndex parses a canonical non-negative decimal index ("0", "12"; not
// "+1", "01" or "-1"), so that one element has exactly one spelling.
func arrayIndex(seg string) (int, bool) {
	if seg == "" || len(seg) > 9 || (len(seg) > 1 && seg[0] == '0') {
		return 0, false
	}
	for i := 0; i < len(seg); i++ {
		if seg[i] < '0' || seg[i] > '9' {
			return 0, false
		}
	}
	n, err := strconv.Atoi(seg)
	return n, err == nil
}

var errTrailingData = errors.New("unexpected data after the JSON value")

// decodeJSON decodes exactly one JSON value, keeping numbers exact
// (json.Number), so that an outcome built from it stores the digits the
// downstream sent.
func decodeJSON(data []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errTrailingData
	}
	return v, nil
}

// isEmpty reports whether v is null, [] or {}: what a downstream's "nothing
// here" looks like.
func isEmpty(v any) bool {
	switch x := v.(type) {
	case nil:
		return true
	case []any:
		return len(x) == 0
	case map[string]any:
		return len(x) == 0
	}
	return false
}

// kindOf names a decoded value's JSON type for error messages, which must
// not quote downstream data at length.
func kindOf(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "boolean"
	case json.Number, float64:
		return "number"
	case string:
		return "string"
	case []any:
		return "array"
	case map[string]any:
		return "object"
	}
	return fmt.Sprintf("%T", v)
}

// selection is what a match found in a document.
type selection struct {
	verdict Verdict
	object  map[string]any // the one matched object, for Found
	matches int            // how many effects matched
	err     error          // why, for Unknown and Duplicate
}

// selectEffect applies the match rules to a decoded document: a present
// null, [] or {} → NotFound; one non-empty object, or an array of exactly
// one → Found; an array of several non-empty objects → Duplicate; anything
// else → Unknown: a scalar, an array holding anything but non-empty objects,
// and an answer the path does not fit (a missing member, an index past the
// end of an array, a segment applied to a scalar). A missing member is not
// absence: it is what a misspelt match path or a renamed field looks like,
// and reading it as absence would let a retry redo an effect that exists.
func selectEffect(doc any, match jsonPath) selection {
	v, miss := match.find(doc)
	if miss != nil {
		return selection{verdict: Unknown, err: fmt.Errorf("match `%s`: %s: did the downstream's API change? (only a present null, [] or {} at the match path is read as absence)", match.raw, miss.describe("the answer"))}
	}
	if isEmpty(v) {
		return selection{verdict: NotFound}
	}
	switch x := v.(type) {
	case map[string]any:
		return selection{verdict: Found, object: x, matches: 1}
	case []any:
		for i, el := range x {
			// An empty object inside an array is not evidence of
			// anything; neither is a scalar.
			obj, ok := el.(map[string]any)
			if !ok || len(obj) == 0 {
				return selection{verdict: Unknown, err: fmt.Errorf("match %q: element %d of the array is %s, want a non-empty object", match.raw, i, describe(el))}
			}
		}
		if len(x) == 1 {
			return selection{verdict: Found, object: x[0].(map[string]any), matches: 1}
		}
		return selection{verdict: Duplicate, matches: len(x), err: fmt.Errorf("match %q selects %d effects, want at most one", match.raw, len(x))}
	default:
		return selection{verdict: Unknown, err: fmt.Errorf("match %q selects a %s, want an object or an array of objects", match.raw, kindOf(v))}
	}
}

func describe(v any) string {
	if m, ok := v.(map[string]any); ok && len(m) == 0 {
		return "an empty object"
	}
	k := kindOf(v)
	if k == "array" || k == "object" {
		return "an " + k
	}
	return "a " + k
}

// buildBody renders the outcome body: the matched object itself, or a new
// object whose fields are taken from it by the mapping (output field → path).
// A mapped path that is absent or does not fit is an error: a partial
// outcome would be replayed to every retry forever.
func buildBody(obj map[string]any, mapping map[string]jsonPath) (json.RawMessage, error) {
	var out any = obj
	if len(mapping) > 0 {
		m := make(map[string]any, len(mapping))
		for _, field := range sortedKeys(mapping) {
			p := mapping[field]
			v, miss := p.find(obj)
			if miss != nil {
				return nil, fmt.Errorf("response_body field %q: path `%s`: %s: did the downstream's API change?", field, p.raw, miss.describe("the matched object"))
			}
			m[field] = v
		}
		out = m
	}
	if err := checkStorable(out); err != nil {
		return nil, fmt.Errorf("response body cannot be stored: %w", err)
	}
	body, err := json.Marshal(out)
	if err != nil {
		return nil, fmt.Errorf("encode response body: %w", err)
	}
	return body, nil
}

// maxExponent bounds a number's decimal exponent in a stored outcome. Real
// amounts and ids are nowhere near it; PostgreSQL's jsonb rejects numbers
// far beyond it, and a found whose outcome cannot be stored would fail its
// write on every attempt.
const maxExponent = 1000

// checkStorable rejects what valid JSON allows but a jsonb response_body
// column does not: NUL characters (\u0000) and numbers of absurd magnitude.
func checkStorable(v any) error {
	switch x := v.(type) {
	case string:
		if strings.IndexByte(x, 0) >= 0 {
			return errors.New("a string contains a NUL character")
		}
	case json.Number:
		s := string(x)
		if i := strings.IndexAny(s, "eE"); i >= 0 {
			exp, err := strconv.Atoi(strings.TrimPrefix(s[i+1:], "+"))
			if err != nil || exp > maxExponent || exp < -maxExponent {
				return fmt.Errorf("number %.20s… is out of range", s)
			}
		}
		if len(s) > maxExponent {
			return fmt.Errorf("number %.20s… has too many digits", s)
		}
	case []any:
		for _, el := range x {
			if err := checkStorable(el); err != nil {
				return err
			}
		}
	case map[string]any:
		for k, el := range x {
			if err := checkStorable(k); err != nil {
				return err
			}
			if err := checkStorable(el); err != nil {
				return err
			}
		}
	}
	return nil
}

// parseMapping parses a response_body mapping (output field → JSON path).
func parseMapping(m map[string]string) (map[string]jsonPath, error) {
	if len(m) == 0 {
		return nil, nil
	}
	out := make(map[string]jsonPath, len(m))
	for _, field := range sortedKeys(m) {
		if field == "" {
			return nil, errors.New("response_body: empty output field name")
		}
		p, err := parseMatchPath(m[field])
		if err != nil {
			return nil, fmt.Errorf("response_body field %q: %w", field, err)
		}
		out[field] = p
	}
	return out, nil
}
