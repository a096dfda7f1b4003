// Package secret is ledgerkeeper's one redactor. Every value that came into
// the configuration from ${VAR} expansion or a *_file twin is registered as
// a secret when the config loads; Redactor.String removes every registered
// value (and URL credentials, DSN passwords, bearer tokens, Slack tokens and
// webhook paths) from any text before it reaches a log, an error, an audit
// row, Slack or a command's output.
//
// A registered value is also removed in the forms it takes when it travels:
// percent-encoded in a URL's query or path, escaped inside a JSON string or
// a Go-quoted string. Redactor.JSON redacts the strings of a JSON document
// after decoding them, so an escape the document's writer chose (\u0041 for
// "A") cannot hide a value either.
//
// Values shorter than four bytes are not registered: masking "1" or "pw"
// everywhere would destroy every message, and such a value is too short to
// be a credential. Such a password is still masked where it stands in a URL
// (scheme://user:pw@host) or a DSN (password=pw).
//
// The outputs are wired once: NewHandler wraps the process's slog.Handler,
// NewWriter wraps a command's stdout, Redactor.Error and Redactor.JSON serve
// errors and documents; the reconcile engine, the alert dispatcher and the
// Slack notifier take the configuration's Redactor in their Config.
package secret

import (
	"cmp"
	"encoding/json"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// Mask replaces a redacted value. `config check` prints Secret-typed
// settings with the same mask.
const Mask = "[redacted]"

// Redactor removes registered secret values from text. The zero value and
// nil redact nothing registered but still apply the built-in patterns (URL
// credentials, DSN passwords, bearer tokens, Slack tokens and webhooks). It
// is safe for concurrent use.
type Redactor struct {
	mu     sync.RWMutex
	values []string // every form of every value, longest first
	seen   map[string]bool
	// rep replaces every form in one pass: at each position the longest
	// form wins, and a mask already written is never matched again.
	rep *strings.Replacer
}

// New returns an empty Redactor.
func New() *Redactor { return &Redactor{} }

// minLen is the shortest value registered.
const minLen = 4

// Register adds values to redact, each with its encoded forms. Empty and
// very short values are ignored (redacting "1" would destroy every message).
// A value that is a URL with a password, or a DSN with password=, also
// registers that password alone, so that a library that prints the URL in
// its own way (re-encoded, host and user only) still cannot show it.
func (r *Redactor) Register(values ...string) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, v := range values {
		r.add(v)
		for _, p := range embeddedPasswords(v) {
			r.add(p)
		}
	}
	slices.SortFunc(r.values, func(a, b string) int {
		return cmp.Or(cmp.Compare(len(b), len(a)), strings.Compare(a, b))
	})
	pairs := make([]string, 0, 2*len(r.values))
	for _, v := range r.values {
		pairs = append(pairs, v, Mask)
	}
	r.rep = strings.NewReplacer(pairs...)
}

// add registers v and its encodings; r.mu is held.
func (r *Redactor) add(v string) {
	if len(strings.TrimSpace(v)) < minLen {
		return
	}
	if r.seen == nil {
		r.seen = map[string]bool{}
	}
	for _, form := range forms(v) {
		if len(form) < minLen || r.seen[form] {
			continue
		}
		r.seen[form] = true
		r.values = append(r.values, form)
	}
}

// forms are the spellings of v that text may carry.
func forms(v string) []string {
	out := []string{v, url.QueryEscape(v), url.PathEscape(v)}
	// Inside a JSON string, as encoding/json writes it (with and without
	// HTML escaping), and inside a Go-quoted string (%q).
	if b, err := json.Marshal(v); err == nil {
		out = append(out, string(b[1:len(b)-1]))
	}
	var sb strings.Builder
	enc := json.NewEncoder(&sb)
	enc.SetEscapeHTML(false)
	if enc.Encode(v) == nil {
		s := strings.TrimSuffix(sb.String(), "\n")
		out = append(out, s[1:len(s)-1])
	}
	q := strconv.Quote(v)
	out = append(out, q[1:len(q)-1])
	q = strconv.QuoteToASCII(v)
	out = append(out, q[1:len(q)-1])
	// What a server reads when the value stood unencoded in a URL ("+"
	// is a space in a query) and quotes back.
	if u, err := url.QueryUnescape(v); err == nil && u != v {
		out = append(out, u)
	}
	if u, err := url.PathUnescape(v); err == nil && u != v {
		out = append(out, u)
	}
	return out
}

// embeddedPasswords returns the password of a URL with userinfo, or of a
// DSN in key=value form.
func embeddedPasswords(v string) []string {
	var out []string
	if u, err := url.Parse(v); err == nil && u.User != nil {
		if p, ok := u.User.Password(); ok {
			out = append(out, p)
		}
	}
	for _, m := range dsnPasswordRE.FindAllStringSubmatch(v, -1) {
		p := m[2]
		if len(p) >= 2 && p[0] == '\'' && p[len(p)-1] == '\'' {
			p = strings.ReplaceAll(strings.ReplaceAll(p[1:len(p)-1], `\'`, `'`), `\\`, `\`)
		}
		out = append(out, p)
	}
	return out
}

// Built-in patterns: what a credential looks like even when nobody
// registered it (a URL a downstream echoes, a library's error).
var (
	// scheme://user:password@host: the password goes, the user stays.
	// Stops at a space, a quote, a slash or a query, so the @ found is the
	// one that ends the authority.
	userinfoRE = regexp.MustCompile(`([A-Za-z][A-Za-z0-9+.-]*://[^\s/?#@:"'<>]*):[^\s/?#"'<>]*@`)
	// key=value passwords of a libpq DSN or a query string; a quoted DSN
	// value may hold spaces.
	dsnPasswordRE = regexp.MustCompile(`(?i)\b(password|passwd|pwd|sslpassword|client_secret|api_key|apikey|access_token|secret)\s*=\s*('(?:[^'\\]|\\.)*'|[^\s&;"'<>]+)`)
	// An Authorization value: "Bearer authentication" is prose, so the
	// credential must hold a digit or be long.
	bearerRE     = regexp.MustCompile(`\b(Bearer|bearer|BEARER|Basic|basic|Token)\s+([A-Za-z0-9._~+/-]{8,}=*)`)
	slackTokenRE = regexp.MustCompile(`xox[a-z]-[0-9A-Za-z-]+`)
	webhookRE    = regexp.MustCompile(`hooks\.slack(-gov)?\.com/[^\s"'<>:]+`)
)

// String returns s with every registered value replaced by Mask, and with
// the built-in patterns masked.
func (r *Redactor) String(s string) string {
	if s == "" {
		return s
	}
	if r != nil {
		r.mu.RLock()
		rep := r.rep
		r.mu.RUnlock()
		if rep != nil {
			s = rep.Replace(s)
		}
	}
	return patterns(s)
}

// Patterns masks what looks like a credential in s (URL passwords, DSN
// password=, bearer tokens, Slack tokens and webhook paths) without any
// registered value: for a database URL shown to name a host, before any
// configuration is loaded.
func Patterns(s string) string { return patterns(s) }

// patterns applies the built-in patterns.
func patterns(s string) string {
	if strings.Contains(s, "://") {
		s = userinfoRE.ReplaceAllString(s, "$1:"+Mask+"@")
	}
	if strings.Contains(s, "=") {
		s = dsnPasswordRE.ReplaceAllStringFunc(s, func(m string) string {
			i := strings.IndexByte(m, '=')
			return strings.TrimRight(m[:i+1], " ") + Mask
		})
	}
	// Every scheme bearerRE knows holds one of these: the regexp, the
	// costliest step, runs only on text that can match it.
	if strings.Contains(s, "earer") || strings.Contains(s, "EARER") || strings.Contains(s, "asic") || strings.Contains(s, "Token") {
		s = bearerRE.ReplaceAllStringFunc(s, func(m string) string {
			sub := bearerRE.FindStringSubmatch(m)
			if len(sub[2]) < 16 && !strings.ContainsAny(sub[2], "0123456789") {
				return m
			}
			return sub[1] + " " + Mask
		})
	}
	if strings.Contains(s, "xox") {
		s = slackTokenRE.ReplaceAllString(s, "xox?-"+Mask)
	}
	if strings.Contains(s, "hooks.slack") {
		s = webhookRE.ReplaceAllString(s, "hooks.slack.com/"+Mask)
	}
	return s
}

// Strings redacts each element of ss in place and returns ss.
func (r *Redactor) Strings(ss []string) []string {
	for i := range ss {
		ss[i] = r.String(ss[i])
	}
	return ss
}

// JSON redacts every string (member names included) of a JSON document
// and returns the document unchanged, byte for byte, when nothing needed
// redacting. Numbers keep their exact text. A document that is not valid
// JSON comes back as a JSON string of its redacted text, so that neither a
// secret nor a broken document goes further.
func (r *Redactor) JSON(doc json.RawMessage) json.RawMessage {
	if len(doc) == 0 {
		return doc
	}
	dec := json.NewDecoder(strings.NewReader(string(doc)))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil || dec.More() {
		b, _ := json.Marshal(r.String(string(doc)))
		return b
	}
	changed := false
	v = r.walk(v, &changed)
	if !changed {
		return doc
	}
	var sb strings.Builder
	enc := json.NewEncoder(&sb)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		b, _ := json.Marshal(Mask)
		return b
	}
	return json.RawMessage(strings.TrimSuffix(sb.String(), "\n"))
}

func (r *Redactor) walk(v any, changed *bool) any {
	switch x := v.(type) {
	case string:
		s := r.String(x)
		if s != x {
			*changed = true
		}
		return s
	case []any:
		for i := range x {
			x[i] = r.walk(x[i], changed)
		}
	case map[string]any:
		for k, el := range x {
			nk := r.String(k)
			if nk != k {
				*changed = true
				delete(x, k)
			}
			x[nk] = r.walk(el, changed)
		}
	}
	return v
}

// Error returns err with its message redacted. errors.Is and errors.As
// still see err's chain (whose own messages are not redacted: print the
// returned error, never an unwrapped one). Nil stays nil.
func (r *Redactor) Error(err error) error {
	if err == nil {
		return nil
	}
	if re, ok := err.(*redactedError); ok && re.r == r { //nolint:errorlint // already redacted by r only if err itself is: a wrapper may add unredacted text
		return err
	}
	return &redactedError{msg: r.String(err.Error()), err: err, r: r}
}

type redactedError struct {
	msg string
	err error
	r   *Redactor
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.err }
