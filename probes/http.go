package probes

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"strconv"
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
	// NotFoundOn404 says which 404s are evidence of absence:
	// NotFoundOn404JSON ("json", the default when empty) counts only a 404
	// whose body is JSON (and matches NotFoundBody when set), because a
	// router's or an ingress's own 404 for a path it does not know (a
	// typo'd url, an API moved) is HTML, text or empty, and reading it as
	// absence would mark keys retryable whose effect happened;
	// NotFoundOn404Any ("any") counts every 404 whatever its body, for an
	// API whose 404s have no body. Anything else is refused.
	NotFoundOn404 string
	// NotFoundBody, when set, is what a 404's JSON body must say for the
	// 404 to be absence, e.g. {Path: "error.code", Equals:
	// "ticket_not_found"}: an ingress that answers JSON 404s of its own is
	// then told apart from the API. Refused with NotFoundOn404Any (which
	// ignores bodies) and with HEAD (which has none).
	NotFoundBody *NotFoundBody
	// Client sends the requests; nil means a client of the probe's own
	// (released by Close). Redirects are never followed, whichever client.
	Client *http.Client
}

// The values of HTTPConfig.NotFoundOn404.
const (
	// NotFoundOn404JSON: a 404 is absence only with a JSON body (the
	// default).
	NotFoundOn404JSON = "json"
	// NotFoundOn404Any: every 404 is absence, whatever its body.
	NotFoundOn404Any = "any"
)

// NotFoundBody is the member of a 404's JSON body that says the effect is
// absent (tools.T.probe.not_found_body).
type NotFoundBody struct {
	// Path is a dotted path into the 404's body, e.g. "error.code".
	// Required.
	Path string
	// Equals is what the member at Path must hold: a JSON string equal to
	// it, or a number or boolean whose JSON text equals it ("404",
	// "true"). Required.
	Equals string
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
	any404     bool      // every 404 is absence (NotFoundOn404Any)
	nfPath     *jsonPath // NotFoundBody.Path, when set
	nfEquals   string    // NotFoundBody.Equals
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
	switch cfg.NotFoundOn404 {
	case "", NotFoundOn404JSON:
	case NotFoundOn404Any:
		p.any404 = true
	default:
		return nil, fmt.Errorf("http probe: not_found_on_404 %q not supported (want json or any)", cfg.NotFoundOn404)
	}
	if nb := cfg.NotFoundBody; nb != nil {
		switch {
		case p.any404:
			return nil, errors.New("http probe: not_found_body contradicts not_found_on_404: any, which counts every 404 whatever its body: remove one")
		case p.method == http.MethodHead:
			return nil, errors.New("http probe: a HEAD response has no body: not_found_body must be empty")
		case nb.Path == "" || nb.Equals == "":
			return nil, errors.New("http probe: not_found_body needs both path and equals")
		}
		path, err := parseMatchPath(nb.Path)
		if err != nil {
			return nil, fmt.Errorf("http probe: not_found_body.path: %w", err)
		}
		p.nfPath, p.nfEquals = &path, nb.Equals
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
	if resp.StatusCode == http.StatusNotFound && p.any404 {
		// Configured so: the status line is the evidence; the body does
		// not matter.
		return Result{Verdict: NotFound, Evidence: ev.raw()}
	}
	if readErr != nil {
		return unknown(ev.raw(), "http probe %s: status %d: read body: %w", what, resp.StatusCode, p.transportError(ctx, readErr))
	}
	if int64(len(body)) > p.maxBody {
		return unknown(ev.raw(), "http probe %s: status %d: body larger than %d bytes (raise max_body_bytes or narrow the query)", what, resp.StatusCode, p.maxBody)
	}
	switch {
	case resp.StatusCode == http.StatusNotFound:
		return p.judge404(resp.Header.Get("Content-Type"), body, ev, what)
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

// routerNotFound is the error of a 404 that is not evidence of absence
// because nothing says the API sent it.
const routerNotFound = "a 404 without a JSON body may come from a router, not the API"

// judge404 decides whether a 404 says that the effect is absent: only with
// a JSON body (Content-Type application/json or *+json, and a body that
// parses), matching not_found_body when it is set. A router's or an
// ingress's 404 (HTML, text, empty) is what a typo'd path gets for every
// key, so it is unknown. A HEAD answer has no body: its Content-Type, the
// body a GET would get, is all there is to judge.
func (p *HTTPProbe) judge404(contentType string, body []byte, ev httpEvidence, what string) Result {
	if !jsonMediaType(contentType) {
		return unknown(ev.raw(), "http probe %s: status 404: %s (%s, body %s)", what, routerNotFound, describeContentType(contentType), p.snippet(body))
	}
	if p.method == http.MethodHead {
		return Result{Verdict: NotFound, Evidence: ev.raw()}
	}
	doc, err := decodeJSON(body)
	if err != nil {
		return unknown(ev.raw(), "http probe %s: status 404: %s (%s, but the body is not JSON (%v): %s)", what, routerNotFound, describeContentType(contentType), err, p.snippet(body))
	}
	if p.nfPath == nil {
		return Result{Verdict: NotFound, Evidence: ev.raw()}
	}
	const notAbsent = "the 404's body does not say the effect is absent"
	v, miss := p.nfPath.find(doc)
	if miss != nil {
		return unknown(ev.raw(), "http probe %s: status 404: %s: %s (not_found_body.path %q)", what, notAbsent, miss.describe("the body"), p.nfPath.raw)
	}
	if got, ok := jsonScalarText(v); !ok || got != p.nfEquals {
		return unknown(ev.raw(), "http probe %s: status 404: %s: %s is %s, want %q", what, notAbsent, p.nfPath.raw, p.quoteValue(v), p.nfEquals)
	}
	return Result{Verdict: NotFound, Evidence: ev.raw()}
}

// jsonMediaType reports whether a Content-Type names JSON:
// application/json, or a structured syntax suffix +json (RFC 6839), such as
// application/problem+json.
func jsonMediaType(contentType string) bool {
	mt, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		return false
	}
	return mt == "application/json" || strings.HasSuffix(mt, "+json")
}

// describeContentType names a response's Content-Type for an error,
// clipped: it is the downstream's text.
func describeContentType(ct string) string {
	if ct == "" {
		return "no Content-Type"
	}
	return fmt.Sprintf("Content-Type %q", safetext.ClipRunes(ct, 64))
}

// jsonScalarText is the text a not_found_body's equals compares with: a
// string's value, a number's or a boolean's JSON text. Other values (null,
// objects, arrays) never match.
func jsonScalarText(v any) (string, bool) {
	switch x := v.(type) {
	case string:
		return x, true
	case json.Number:
		return x.String(), true
	case bool:
		return strconv.FormatBool(x), true
	}
	return "", false
}

// quoteValue shows a value from a downstream's body in an error: a scalar
// as JSON text, short and redacted; anything else by its kind.
func (p *HTTPProbe) quoteValue(v any) string {
	switch x := v.(type) {
	case string:
		if x == "" {
			return `""`
		}
		return p.snippet([]byte(x))
	case json.Number, bool:
		s, _ := jsonScalarText(x)
		return safetext.ClipRunes(s, 64)
	case nil:
		return "null"
	}
	return describe(v)
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
