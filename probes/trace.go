package probes

import (
	"bytes"
	"context"
	"net/http"
	"slices"
	"sync"
)

// MaxTraceBodyBytes bounds the part of an answer a Trace keeps: far more
// than an operator reads (so that a secret the answer echoes lies whole in
// what is kept, where a redactor can find it), never a whole large
// document.
const MaxTraceBodyBytes = 64 << 10

// Trace records what a probe sent and what came back, for an operator
// probing by hand (`ledgerkeeper probe run`): a verdict alone does not say
// whether the probe asked the right URL or read the right answer. It is
// attached to a probe's context with WithTrace; the engine never attaches
// one, so a probe made by the reconciler records nothing.
//
// What a Trace holds is close to raw: the URL may carry a secret (an
// api_key in the query) and the body may echo a configured value other
// than a header's (header values, and their words long enough to be a
// credential, are replaced by "[redacted]" as the probe's own error
// snippets are). Whoever prints it redacts it first.
// A Trace is safe for concurrent use (a guarded probe that outlives its
// deadline may still record after Probe returned).
type Trace struct {
	mu        sync.Mutex
	exchanges []Exchange
}

// Exchange is one request a probe made, and its answer if one came.
type Exchange struct {
	// Method and URL are the request as sent (URL complete, scheme and
	// host included; it may hold secrets).
	Method string
	URL    string
	// Headers names the request headers sent, sorted; their values are
	// never recorded.
	Headers []string
	// Answered: a status line came back (false after a transport error).
	Answered bool
	// Status is the answer's HTTP status code.
	Status int
	// Body is the start of the answer's body, at most MaxTraceBodyBytes,
	// as received but for header values (it may be invalid UTF-8).
	Body []byte
	// BodyBytes is how many bytes of body the probe read.
	BodyBytes int
}

type traceKey struct{}

// WithTrace returns a context under which the built-in http probe records
// its requests and answers into t.
func WithTrace(ctx context.Context, t *Trace) context.Context {
	return context.WithValue(ctx, traceKey{}, t)
}

// Exchanges returns a copy of what was recorded, in the order the requests
// were made.
func (t *Trace) Exchanges() []Exchange {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]Exchange, len(t.exchanges))
	for i, x := range t.exchanges {
		x.Headers = slices.Clone(x.Headers)
		x.Body = slices.Clone(x.Body)
		out[i] = x
	}
	return out
}

// traceRequest records req if ctx carries a Trace, and returns what records
// its answer (a no-op without a Trace), with every one of secrets (longest
// first) replaced in the body.
func traceRequest(ctx context.Context, req *http.Request, secrets []string) func(status int, body []byte) {
	t, _ := ctx.Value(traceKey{}).(*Trace)
	if t == nil {
		return func(int, []byte) {}
	}
	names := make([]string, 0, len(req.Header))
	for name := range req.Header {
		names = append(names, name)
	}
	slices.Sort(names)
	t.mu.Lock()
	i := len(t.exchanges)
	t.exchanges = append(t.exchanges, Exchange{Method: req.Method, URL: req.URL.String(), Headers: names})
	t.mu.Unlock()
	return func(status int, body []byte) {
		t.mu.Lock()
		defer t.mu.Unlock()
		x := &t.exchanges[i]
		x.Answered, x.Status, x.BodyBytes = true, status, len(body)
		kept := slices.Clone(body[:min(len(body), MaxTraceBodyBytes)])
		for _, s := range secrets {
			kept = bytes.ReplaceAll(kept, []byte(s), []byte("[redacted]"))
		}
		x.Body = kept
	}
}
