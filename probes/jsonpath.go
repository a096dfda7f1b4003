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

// lookupStatus says how a lookup ended; absent and mismatch differ because
// only a plainly missing member is evidence of absence.
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

// lookup evaluates p over v, a document decoded by decodeJSON.
func (p jsonPath) lookup(v any) (any, lookupStatus) {
	for _, seg := range p.segs {
		switch x := v.(type) {
		case map[string]any:
			next, ok := x[seg]
			if !ok {
				return nil, absent
			}
			v = next
		case []any:
			i, ok := arrayIndex(seg)
			if !ok {
				return nil, mismatch
			}
			if i >= len(x) {
				return nil, absent
			}
			v = x[i]
		default:
			return nil, mismatch
		}
	}
	return v, present
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

// selectEffect applies the match rules to a decoded document: absent, null,
// [] or {} → NotFound; one non-empty object, or an array of exactly one →
// Found; an array of several non-empty objects → Duplicate; anything else
// (a scalar, an array holding anything but non-empty objects, a shape the
// path does not fit) → Unknown.
func selectEffect(doc any, match jsonPath) selection {
	v, st := match.lookup(doc)
	switch st {
	case absent:
		return selection{verdict: NotFound}
	case mismatch:
		return selection{verdict: Unknown, err: fmt.Errorf("match %q does not fit the document's shape", match.raw)}
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
			v, st := p.lookup(obj)
			if st != present {
				return nil, fmt.Errorf("response_body field %q: path %q not found in the matched object", field, p.raw)
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
		p, err := parsePath(m[field])
		if err != nil {
			return nil, fmt.Errorf("response_body field %q: %w", field, err)
		}
		out[field] = p
	}
	return out, nil
}
