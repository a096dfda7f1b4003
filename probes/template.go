package probes

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strings"
)

// ErrNotRendered means that the probe could not even be built for this key:
// a placeholder such as {request.ref} that the key's request body lacks, a
// request body that is not JSON, an empty value, a value that would be a
// dot-segment. The downstream was never asked, so the Unknown it comes with
// says nothing about the downstream or about the probe's reading of its
// answers, only about this key. Every error from rendering an http probe's
// URL or an sql probe's args for a key wraps it (errors.Is), with its own
// message unchanged; the self-check tells "the made-up key cannot be
// rendered" (inconclusive) from "the probe misreads its downstream"
// (untrusted) by it.
var ErrNotRendered = errors.New("the probe could not be built for this key; the downstream was not asked")

// renderError is an error from rendering a probe for a key: its message is
// the cause's alone, and it is both the cause and ErrNotRendered.
type renderError struct{ err error }

func (e *renderError) Error() string   { return e.err.Error() }
func (e *renderError) Unwrap() []error { return []error{e.err, ErrNotRendered} }

func notRendered(err error) error { return &renderError{err: err} }

// urlTemplate is a parsed http probe URL: literal text and placeholders.
// Values are escaped for the part of the URL they stand in, so a value can
// never change the URL's structure: the origin (scheme, host, port) is
// literal, a value in the path stays inside one path segment, a value in the
// query stays inside one query component.
//
// In the path, a placeholder is RFC 6570's simple string expansion ({var},
// level 1); in the query, form encoding (the same but '+' for a space). It
// is not delegated to an RFC 6570 library: the escaping is the dozen lines
// of escapePathValue, and everything else here (our names, which allow what
// RFC 6570 varnames do not; the refusals; the origin and prefix checks
// after rendering) a library does not do. TestRenderURLIsRFC6570SimpleExpansion
// pins the RFC's own examples.
type urlTemplate struct {
	raw    string
	scheme string
	host   string // host[:port], as written
	parts  []tmplPart
	// prefix is the literal path (and query) before the first placeholder,
	// which every rendered URL must keep.
	prefix string
}

type tmplPart struct {
	literal string
	ph      *placeholder
	inQuery bool // the placeholder stands after the '?'
}

// placeholder is {key}, {tool} or {request.PATH}; sql args use the same
// names without braces.
type placeholder struct {
	name string // as written, without braces
	kind phKind
	path jsonPath // for phRequest
}

type phKind int

const (
	phKey phKind = iota
	phTool
	phRequest
)

func parsePlaceholder(name string) (*placeholder, error) {
	switch {
	case name == "key":
		return &placeholder{name: name, kind: phKey}, nil
	case name == "tool":
		return &placeholder{name: name, kind: phTool}, nil
	case strings.HasPrefix(name, "request."):
		p, err := parsePath(strings.TrimPrefix(name, "request."))
		if err != nil {
			return nil, err
		}
		if len(p.segs) == 0 {
			return nil, fmt.Errorf("%q needs a path after request.", name) //nolint:staticcheck // ST1005: "request." is the placeholder's prefix, not punctuation
		}
		return &placeholder{name: name, kind: phRequest, path: p}, nil
	}
	return nil, fmt.Errorf("unknown placeholder %q (want key, tool or request.PATH)", name)
}

// requestDoc lazily decodes a key's request body once per probe.
type requestDoc struct {
	raw     json.RawMessage
	decoded bool
	doc     any
	err     error
}

func (d *requestDoc) get() (any, error) {
	if !d.decoded {
		d.decoded = true
		if len(d.raw) == 0 {
			d.err = errors.New("the key has no request body")
		} else if d.doc, d.err = decodeJSON(d.raw); d.err != nil {
			d.err = fmt.Errorf("the key's request body is not valid JSON: %w", d.err)
		}
	}
	return d.doc, d.err
}

// value returns the placeholder's value for k; its errors wrap
// ErrNotRendered. It refuses a value that is missing, null, empty or not a
// scalar: probing with an empty value could match every effect and turn
// into a wrong found or duplicate, and a stringified object is never what a
// downstream stores.
func (ph *placeholder) value(k Key, req *requestDoc) (string, error) {
	s, err := ph.lookup(k, req)
	if err != nil {
		return "", notRendered(err)
	}
	return s, nil
}

func (ph *placeholder) lookup(k Key, req *requestDoc) (string, error) {
	var s string
	switch ph.kind {
	case phKey:
		s = k.Key
	case phTool:
		s = k.Tool
	case phRequest:
		doc, err := req.get()
		if err != nil {
			return "", fmt.Errorf("{%s}: %w", ph.name, err)
		}
		v, st := ph.path.lookup(doc)
		if st != present {
			return "", fmt.Errorf("{%s}: not in the key's request body", ph.name)
		}
		switch x := v.(type) {
		case string:
			s = x
		case json.Number:
			s = x.String()
		case bool:
			s = fmt.Sprint(x)
		default:
			return "", fmt.Errorf("{%s}: is %s in the key's request body, want a string, number or boolean", ph.name, describe(v))
		}
	}
	if s == "" {
		return "", fmt.Errorf("{%s}: empty value; refusing to probe with it", ph.name)
	}
	return s, nil
}

func parseURLTemplate(raw string) (*urlTemplate, error) {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok || (scheme != "http" && scheme != "https") {
		return nil, errors.New("url must start with http:// or https://")
	}
	end := strings.IndexAny(rest, "/?#")
	if end < 0 {
		end = len(rest)
	}
	host, rest := rest[:end], rest[end:]
	switch {
	case host == "":
		return nil, errors.New("url has no host")
	case strings.ContainsAny(host, "{}"):
		return nil, errors.New("url: placeholders are not allowed in the scheme, host or port")
	case strings.Contains(host, "@"):
		return nil, errors.New("url: credentials are not allowed in the URL (put them in headers)")
	}
	t := &urlTemplate{raw: raw, scheme: scheme, host: host}

	inQuery := false
	prefixDone := false
	for rest != "" {
		open := strings.IndexAny(rest, "{}")
		lit := rest
		if open >= 0 {
			lit = rest[:open]
		}
		if strings.Contains(lit, "#") {
			return nil, errors.New("url: a fragment (#) is never sent to the server; remove it")
		}
		if lit != "" {
			t.parts = append(t.parts, tmplPart{literal: lit})
			if !prefixDone {
				t.prefix += lit
			}
			if strings.Contains(lit, "?") {
				inQuery = true
			}
		}
		if open < 0 {
			break
		}
		if rest[open] == '}' {
			return nil, errors.New("url: '}' without '{' (write a literal brace as %7D)")
		}
		closeAt := strings.IndexByte(rest[open:], '}')
		if closeAt < 0 {
			return nil, errors.New("url: '{' without '}' (write a literal brace as %7B)")
		}
		ph, err := parsePlaceholder(rest[open+1 : open+closeAt])
		if err != nil {
			return nil, fmt.Errorf("url: %w", err)
		}
		t.parts = append(t.parts, tmplPart{ph: ph, inQuery: inQuery})
		prefixDone = true
		rest = rest[open+closeAt+1:]
	}

	// The literal parts must make a valid URL whatever the values are.
	probe, err := url.Parse(t.renderWith(func(*placeholder) string { return "x" }))
	if err != nil {
		return nil, fmt.Errorf("url: %w", err)
	}
	if probe.Host != host || probe.User != nil || probe.Opaque != "" {
		return nil, errors.New("url: cannot tell the host apart from the path")
	}
	if !strings.HasPrefix(requestURI(probe), t.prefix) {
		return nil, fmt.Errorf("url: the path %q must be written percent-encoded", t.prefix)
	}
	return t, nil
}

// renderWith joins the parts with already escaped values.
func (t *urlTemplate) renderWith(value func(*placeholder) string) string {
	var b strings.Builder
	b.WriteString(t.scheme)
	b.WriteString("://")
	b.WriteString(t.host)
	for _, p := range t.parts {
		if p.ph == nil {
			b.WriteString(p.literal)
		} else {
			b.WriteString(value(p.ph))
		}
	}
	return b.String()
}

// render fills the template for k; its errors wrap ErrNotRendered. It
// escapes each value for where it stands, then parses the result and
// re-checks that the origin and the literal prefix are the template's own,
// so that no value, however hostile, can send the probe elsewhere.
func (t *urlTemplate) render(k Key) (*url.URL, error) {
	u, err := t.renderKey(k)
	if err != nil {
		if !errors.Is(err, ErrNotRendered) {
			err = notRendered(err)
		}
		return nil, err
	}
	return u, nil
}

func (t *urlTemplate) renderKey(k Key) (*url.URL, error) {
	req := &requestDoc{raw: k.RequestBody}
	values := make(map[*placeholder]string, len(t.parts))
	for _, p := range t.parts {
		if p.ph == nil {
			continue
		}
		v, err := p.ph.value(k, req)
		if err != nil {
			return nil, err
		}
		if p.inQuery {
			v = url.QueryEscape(v)
		} else {
			// "." and ".." as a whole segment are dot-segments: clients,
			// proxies and servers remove them (RFC 3986 §5.2.4), escaped
			// (%2E) or not, which would move the request up the path.
			if v == "." || v == ".." {
				return nil, fmt.Errorf("{%s}: value %q would be a dot-segment in the URL path; refusing to probe with it", p.ph.name, v)
			}
			v = escapePathValue(v)
		}
		values[p.ph] = v
	}
	s := t.renderWith(func(ph *placeholder) string { return values[ph] })
	u, err := url.Parse(s)
	if err != nil {
		return nil, fmt.Errorf("rendered url does not parse: %w", err)
	}
	switch {
	case u.Scheme != t.scheme || u.Host != t.host || u.User != nil || u.Opaque != "":
		return nil, errors.New("rendered url does not keep the template's scheme, host and port")
	case u.Fragment != "" || u.RawFragment != "":
		return nil, errors.New("rendered url has a fragment")
	case !strings.HasPrefix(requestURI(u), t.prefix):
		return nil, errors.New("rendered url does not keep the template's path")
	}
	return u, nil
}

// escapePathValue escapes v to stay inside one path segment. It is stricter
// than url.PathEscape: every byte but RFC 3986's unreserved characters
// (ALPHA DIGIT - . _ ~) is percent-encoded, so '/', '?', '#', '%' and ';'
// cannot add a segment, start the query or fragment, or forge an escape, and
// no server can read a '+' or ':' in a way of its own.
func escapePathValue(v string) string {
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	b.Grow(len(v) * 3)
	for i := 0; i < len(v); i++ {
		c := v[i]
		if 'A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '.' || c == '_' || c == '~' {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hex[c>>4])
		b.WriteByte(hex[c&15])
	}
	return b.String()
}

// requestURI is the escaped path and query, as sent on the request line. It
// is what evidence and errors show: never the scheme, host or headers.
func requestURI(u *url.URL) string {
	s := u.EscapedPath()
	if u.RawQuery != "" || u.ForceQuery {
		s += "?" + u.RawQuery
	}
	return s
}
