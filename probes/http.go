package probes

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"
	"unicode"

	"github.com/ledgerkeeper/ledgerkeeper/internal/safetext"
)

// Defaults of the built-in probes, applied where a config field is zero.
const (
	// DefaultTimeout bounds one probe when its config sets no timeout.
	DefaultTimeout = 5 * time.Second
	// DefaultResponseCode is the response_code a found outcome stores when
	// the config sets none.
	DefaultResponseCode = http.StatusOK
	// DefaultMaxBodyBytes bounds the response body an http probe reads: a
	// downstream returning a huge document must not exhaust memory.
	DefaultMaxBodyBytes int64 = 1 << 20
)

// HTTPConfig configures an http probe. Zero values mean the documented
// defaults.
type HTTPConfig struct {
	// URL is the template of the URL to request, e.g.
	// "https://tickets.internal/v1/tickets?idempotency_key={key}".
	// Placeholders: {key}, {tool} and {request.PATH} (a dotted path into
	// the key's request body, e.g. {request.customer.id} or
	// {request.items.0.sku}). Values are escaped for where they stand, so a
	// value never changes the URL's structure. The scheme, host and port
	// must be literal. Required.
	URL string
	// Method is GET (default), POST (sent with an empty body) or HEAD. With
	// HEAD a 2xx is found with an empty object as its body, so Match and
	// ResponseBody must be empty.
	Method string
	// Headers are sent with every request. Values may be secrets: they never
	// appear in errors, evidence or logs.
	Headers map[string]string
	// Timeout bounds one probe, response body included. Default
	// DefaultTimeout.
	Timeout time.Duration
	// Match is the JSON path that selects the effect in a 2xx response;
	// empty means the whole document.
	Match string
	// ResponseCode is the response_code a found outcome stores. Default
	// DefaultResponseCode.
	ResponseCode int
	// ResponseBody maps each field of the stored response_body to a JSON
	// path in the matched object. Empty: the whole matched object.
	ResponseBody map[string]string
	// MaxBodyBytes bounds the response body read. Default
	// DefaultMaxBodyBytes; a larger body is unknown.
	MaxBodyBytes int64
	// Client sends the requests; nil means a client of the probe's own
	// (released by Close). Redirects are never followed, whichever client.
	Client *http.Client
}

// HTTPProbe asks an HTTP API whether a key's effect exists. Create it with
// NewHTTP; it is safe for concurrent use.
type HTTPProbe struct {
	tmpl       *urlTemplate
	method     string
	headers    [][2]string
	host       string // Host header override, if configured
	secrets    []string
	timeout    time.Duration
	match      jsonPath
	code       int
	mapping    map[string]jsonPath
	maxBody    int64
	client     *http.Client
	ownsClient bool
}

// NewHTTP validates cfg and returns an http probe. Every mistake an operator
// can make in the config is reported here, not at probe time.
func NewHTTP(cfg HTTPConfig) (*HTTPProbe, error) {
	tmpl, err := parseURLTemplate(cfg.URL)
	if err != nil {
		return nil, fmt.Errorf("http probe: %w", err)
	}
	p := &HTTPProbe{
		tmpl:    tmpl,
		method:  cmp.Or(strings.ToUpper(cfg.Method), http.MethodGet),
		timeout: cmp.Or(cfg.Timeout, DefaultTimeout),
		code:    cmp.Or(cfg.ResponseCode, DefaultResponseCode),
		maxBody: cmp.Or(cfg.MaxBodyBytes, DefaultMaxBodyBytes),
	}
	switch p.method {
	case http.MethodGet, http.MethodPost:
	case http.MethodHead:
		if cfg.Match != "" || len(cfg.ResponseBody) > 0 {
			return nil, errors.New("http probe: a HEAD response has no body: match and response_body must be empty")
		}
	default:
		return nil, fmt.Errorf("http probe: method %q not supported (want GET, POST or HEAD)", cfg.Method)
	}
	if cfg.Timeout < 0 {
		return nil, fmt.Errorf("http probe: negative timeout %s", cfg.Timeout)
	}
	if cfg.MaxBodyBytes < 0 {
		return nil, fmt.Errorf("http probe: negative max_body_bytes %d", cfg.MaxBodyBytes)
	}
	if p.code < 100 || p.code > 599 {
		return nil, fmt.Errorf("http probe: response_code %d is not an HTTP status code", p.code)
	}
	if p.match, err = parseMatchPath(cfg.Match); err != nil {
		return nil, fmt.Errorf("http probe: match: %w", err)
	}
	if p.mapping, err = parseMapping(cfg.ResponseBody); err != nil {
		return nil, fmt.Errorf("http probe: %w", err)
	}
	for _, name := range sortedKeys(cfg.Headers) {
		val := cfg.Headers[name]
		// The value is never quoted: it may be a secret.
		if !validHeaderName(name) {
			return nil, fmt.Errorf("http probe: header name %q is not a valid HTTP token", name)
		}
		if strings.ContainsAny(val, "\r\n\x00") {
			return nil, fmt.Errorf("http probe: header %q: value contains a line break or NUL", name)
		}
		if http.CanonicalHeaderKey(name) == "Host" {
			p.host = val
		} else {
			p.headers = append(p.headers, [2]string{name, val})
		}
		p.secrets = append(p.secrets, secretParts(val)...)
	}
	// Longest first, so that a value is redacted before its parts are.
	slices.SortFunc(p.secrets, func(a, b string) int { return cmp.Compare(len(b), len(a)) })

	noRedirect := func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	if cfg.Client != nil {
		c := *cfg.Client
		c.CheckRedirect = noRedirect
		p.client = &c
	} else {
		p.client = &http.Client{
			Transport:     http.DefaultTransport.(*http.Transport).Clone(),
			CheckRedirect: noRedirect,
		}
		p.ownsClient = true
	}
	return p, nil
}

// Close releases the idle connections of the probe's own client. It does
// not touch a client passed in HTTPConfig.Client.
func (p *HTTPProbe) Close() error {
	if p.ownsClient {
		p.client.CloseIdleConnections()
	}
	return nil
}

// httpEvidence is what the audit trail records of one http probe: the
// request line as rendered (never the scheme, host or headers), the status
// and how many effects matched.
type httpEvidence struct {
	Method     string `json:"method"`
	URL        string `json:"url"`
	HTTPStatus int    `json:"http_status,omitempty"`
	Matches    *int   `json:"matches,omitempty"`
	// RetryAfter is the pause a 429 or 503 asked for, in seconds.
	RetryAfter float64 `json:"retry_after_seconds,omitempty"`
}

func (e httpEvidence) raw() json.RawMessage {
	b, _ := json.Marshal(e) // strings and ints only: cannot fail
	return b
}

// Probe requests the rendered URL and maps the answer to a verdict; see the
// package documentation for the rules.
func (p *HTTPProbe) Probe(ctx context.Context, k Key) Result {
	u, err := p.tmpl.render(k)
	if err != nil {
		return unknown(nil, "http probe: %w", err)
	}
	ev := httpEvidence{Method: p.method, URL: requestURI(u)}
	what := p.method + " " + ev.URL

	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, p.method, u.String(), nil)
	if err != nil {
		return unknown(ev.raw(), "http probe %s: build request: %w", what, err)
	}
	for _, h := range p.headers {
		req.Header.Set(h[0], h[1])
	}
	if req.Header.Get("Accept") == "" {
		req.Header.Set("Accept", "application/json")
	}
	if p.host != "" {
		req.Host = p.host
	}

	answered := traceRequest(ctx, req, p.secrets) // for `probe run`; a no-op otherwise
	resp, err := p.client.Do(req)
	if err != nil {
		return unknown(ev.raw(), "http probe %s: %w", what, p.transportError(ctx, err))
	}
	defer resp.Body.Close()
	ev.HTTPStatus = resp.StatusCode

	body, readErr := io.ReadAll(io.LimitReader(resp.Body, p.maxBody+1))
	answered(resp.StatusCode, body)
	if resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable {
		// The downstream said when to come back: the engine pauses the
		// tool instead of counting an attempt. Without a readable
		// Retry-After it is an unknown like any other status.
		if after, ok := parseRetryAfter(resp.Header.Get("Retry-After"), time.Now()); ok {
			ev.RetryAfter = after.Seconds()
			return Result{Verdict: Unknown, Evidence: ev.raw(),
				Err: fmt.Errorf("http probe %s: %w", what, &ThrottledError{Status: resp.StatusCode, RetryAfter: after})}
		}
	}
	if resp.StatusCode == http.StatusNotFound {
		// The status line is the evidence; the body does not matter.
		return Result{Verdict: NotFound, Evidence: ev.raw()}
	}
	if readErr != nil {
		return unknown(ev.raw(), "http probe %s: status %d: read body: %w", what, resp.StatusCode, p.transportError(ctx, readErr))
	}
	if int64(len(body)) > p.maxBody {
		return unknown(ev.raw(), "http probe %s: status %d: body larger than %d bytes (raise max_body_bytes or narrow the query)", what, resp.StatusCode, p.maxBody)
	}
	switch {
	case resp.StatusCode >= 300 && resp.StatusCode < 400:
		return unknown(ev.raw(), "http probe %s: status %s: redirects are not followed (point the url at the final location)", what, resp.Status)
	case resp.StatusCode < 200 || resp.StatusCode > 299:
		return unknown(ev.raw(), "http probe %s: unexpected status %s: body %s", what, resp.Status, p.snippet(body))
	}

	if p.method == http.MethodHead {
		one := 1
		ev.Matches = &one
		return Result{Verdict: Found, Outcome: &Outcome{Code: p.code, Body: json.RawMessage(`{}`)}, Evidence: ev.raw()}
	}
	return p.evaluate(body, ev, what)
}

// evaluate maps a 2xx body to a verdict.
func (p *HTTPProbe) evaluate(body []byte, ev httpEvidence, what string) Result {
	doc, err := decodeJSON(body)
	if err != nil {
		return unknown(ev.raw(), "http probe %s: status %d: body is not JSON (%v): %s", what, ev.HTTPStatus, err, p.snippet(body))
	}
	sel := selectEffect(doc, p.match)
	if sel.verdict != Unknown {
		ev.Matches = &sel.matches
	}
	switch sel.verdict {
	case NotFound:
		return Result{Verdict: NotFound, Evidence: ev.raw()}
	case Duplicate:
		return Result{Verdict: Duplicate, Evidence: ev.raw(), Err: fmt.Errorf("http probe %s: %w", what, sel.err)}
	case Found:
		out, err := buildBody(sel.object, p.mapping)
		if err != nil {
			return unknown(ev.raw(), "http probe %s: %w", what, err)
		}
		return Result{Verdict: Found, Outcome: &Outcome{Code: p.code, Body: out}, Evidence: ev.raw()}
	default:
		return unknown(ev.raw(), "http probe %s: %w", what, sel.err)
	}
}

// transportError says what went wrong without repeating the URL (the caller
// names the request) and names a timeout as one.
func (p *HTTPProbe) transportError(ctx context.Context, err error) error {
	if ue, ok := errors.AsType[*url.Error](err); ok {
		err = ue.Err
	}
	if cerr := context.Cause(ctx); cerr != nil {
		if errors.Is(err, cerr) {
			return fmt.Errorf("no complete answer within %s: %w", p.timeout, err)
		}
		// Both: callers test for the context's error, operators read err.
		return fmt.Errorf("no complete answer within %s (%w): %w", p.timeout, cerr, err)
	}
	return err
}

// snippet is a short, printable excerpt of a response body for an error
// message, with every configured header value redacted: a downstream may
// echo the credentials it rejected.
func (p *HTTPProbe) snippet(body []byte) string {
	const max = 160
	s := strings.ToValidUTF8(string(body), "\uFFFD")
	for _, sec := range p.secrets {
		s = strings.ReplaceAll(s, sec, "[redacted]")
	}
	s = strings.Map(func(r rune) rune {
		if !unicode.IsPrint(r) {
			return ' '
		}
		return r
	}, s)
	// Cut between characters: the snippet ends up in an error that is
	// stored, logged and sent to Slack.
	s = safetext.ClipRunes(strings.Join(strings.Fields(s), " "), max+1)
	if s == "" {
		return "(empty)"
	}
	return fmt.Sprintf("%q", s)
}

// secretParts is what to redact of a header value: the value, and each of
// its words long enough to be a credential ("Bearer abc123…" → the token).
func secretParts(val string) []string {
	var out []string
	if strings.TrimSpace(val) != "" {
		out = append(out, val)
	}
	for _, w := range strings.FieldsFunc(val, func(r rune) bool { return unicode.IsSpace(r) || r == ',' || r == ';' || r == '=' }) {
		if len(w) >= 6 && w != val {
			out = append(out, w)
		}
	}
	return out
}

// validHeaderName reports whether name is an RFC 9110 token.
func validHeaderName(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}
