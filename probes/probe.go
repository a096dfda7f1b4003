package probes

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"
)

// Verdict is a probe's answer about one key. The engine decides on the
// verdict alone, so the set is closed: Guard turns any other string into
// Unknown.
type Verdict string

// The verdicts; see the package documentation for what each one makes the
// engine do and why anything unexpected is Unknown.
const (
	// Found means the effect exists; Result.Outcome holds what to store.
	Found Verdict = "found"
	// NotFound is trustworthy evidence of absence: the key may be retried.
	NotFound Verdict = "not_found"
	// Duplicate means more than one matching effect exists downstream.
	Duplicate Verdict = "duplicate"
	// Unknown covers errors, timeouts and garbage; Result.Err says why.
	Unknown Verdict = "unknown"
)

// Valid reports whether v is one of the four verdicts, so callers that
// persist or compare verdicts can refuse anything else.
func (v Verdict) Valid() bool {
	switch v {
	case Found, NotFound, Duplicate, Unknown:
		return true
	}
	return false
}

// Key is what a probe may know about a key, and never more: probes see the
// approved request but not the ledger's bookkeeping, so they cannot depend
// on it.
type Key struct {
	// Key is the Idempotency-Key.
	Key string
	// Tool is the tool name that selected this probe.
	Tool string
	// RequestBody is the approved arguments (request_body); may be nil.
	RequestBody json.RawMessage
	// CreatedAt is the key's first claim.
	CreatedAt time.Time
	// ClaimedAt is the start of the current attempt.
	ClaimedAt time.Time
}

// Outcome is the stored response a Found verdict fills in: what retries of
// the key will be replayed from then on.
type Outcome struct {
	// Code is the response_code to store (an HTTP status code, 100-599).
	Code int
	// Body is the response_body to store; must be valid JSON.
	Body json.RawMessage
}

// Result is one probe's answer, with what the audit trail needs to explain
// it later.
type Result struct {
	// Verdict is the answer.
	Verdict Verdict
	// Outcome is set for Found only.
	Outcome *Outcome
	// Evidence is a small JSON document for the audit trail, e.g.
	// {"http_status":200,"matches":1} or {"rows":0}. It never holds secrets.
	Evidence json.RawMessage
	// Err is set for Unknown (why), and may describe a Duplicate.
	Err error
}

// Probe is implemented by the built-in http and sql probes and by probes
// written in Go: the one seam between the engine and the downstreams. A
// Probe must be safe for concurrent use and should return when ctx is done.
type Probe interface {
	Probe(ctx context.Context, k Key) Result
}

// ProbeFunc lets a plain function be a Probe, for small Go probes and test
// fakes.
type ProbeFunc func(ctx context.Context, k Key) Result

// Probe calls f.
func (f ProbeFunc) Probe(ctx context.Context, k Key) Result { return f(ctx, k) }

// unknown builds an Unknown result.
func unknown(evidence json.RawMessage, format string, args ...any) Result {
	return Result{Verdict: Unknown, Evidence: evidence, Err: fmt.Errorf(format, args...)}
}

// ErrAlreadyRegistered is returned by Registry.Register for a tool that has
// a probe already: silently replacing one would change which downstream
// decides a key's fate.
var ErrAlreadyRegistered = errors.New("probe already registered")

// Registry maps tool names to probes. It exists so that probes written in Go
// are wired explicitly by the daemon (no globals, no init registration) and
// so that the engine finds every tool's probe in one place. It is safe for
// concurrent use.
type Registry struct {
	mu     sync.RWMutex
	probes map[string]Probe
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	return &Registry{probes: make(map[string]Probe)}
}

// Register makes p the probe of tool. A tool can have one probe only: a
// second registration is an error wrapping ErrAlreadyRegistered.
func (r *Registry) Register(tool string, p Probe) error {
	if tool == "" {
		return errors.New("register probe: empty tool name")
	}
	if p == nil {
		return fmt.Errorf("register probe for tool %q: nil probe", tool)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.probes[tool]; ok {
		return fmt.Errorf("register probe for tool %q: %w", tool, ErrAlreadyRegistered)
	}
	r.probes[tool] = p
	return nil
}

// Lookup returns the probe of tool. A tool without a probe is not guessed
// at: the engine keeps its keys processing and alerts.
func (r *Registry) Lookup(tool string) (Probe, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	p, ok := r.probes[tool]
	return p, ok
}

// Tools returns the registered tool names, sorted, so that config checks can
// report tools declared as "go" probes that nothing registered.
func (r *Registry) Tools() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	names := make([]string, 0, len(r.probes))
	for n := range r.probes {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// Close closes every registered probe that implements io.Closer (the
// built-in sql probe holds a connection pool), so that the daemon can hand
// the registry the probes it built and release them in one call at
// shutdown. It returns all close errors joined.
func (r *Registry) Close() error {
	r.mu.RLock()
	defer r.mu.RUnlock()
	var errs []error
	for _, tool := range sortedKeys(r.probes) {
		if c, ok := r.probes[tool].(io.Closer); ok {
			if err := c.Close(); err != nil {
				errs = append(errs, fmt.Errorf("close probe for tool %q: %w", tool, err))
			}
		}
	}
	return errors.Join(errs...)
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// MaxEvidenceBytes bounds the Evidence that Guard passes on: evidence goes
// into every audit row, so a verbose probe must not bloat the audit table.
const MaxEvidenceBytes = 4 << 10

// Guard wraps p so that the engine can trust whatever comes out of it,
// whoever wrote p. The wrapped probe:
//
//   - runs p under a deadline of timeout (none if timeout <= 0, beyond the
//     caller's context) and returns Unknown when the deadline or the
//     caller's context ends first, even if p ignores its context (p's
//     goroutine then finishes on its own; its late result is dropped);
//   - treats any verdict reached after its context ended as Unknown (a
//     probe that maps "cancelled" to not_found must not cause a write);
//   - turns a panic in p into Unknown;
//   - turns a malformed result into Unknown: a verdict outside the four, a
//     Found without an outcome or with a code outside 100-599 or a body that
//     is not valid JSON, a Found or NotFound that also carries an error, a
//     NotFound that carries an outcome, and evidence that is not JSON;
//   - gives an Unknown without an error a generic one, drops the Outcome of
//     anything but Found, and replaces evidence larger than
//     MaxEvidenceBytes with a short note.
//
// The error of an Unknown caused by the context wraps the context's cause,
// so callers can tell a shutdown (context.Canceled) from a slow downstream
// (context.DeadlineExceeded).
func Guard(p Probe, timeout time.Duration) Probe {
	if p == nil {
		panic("probes: Guard of a nil Probe")
	}
	return &guarded{p: p, timeout: timeout}
}

type guarded struct {
	p       Probe
	timeout time.Duration
}

func (g *guarded) Probe(ctx context.Context, k Key) Result {
	if err := context.Cause(ctx); err != nil {
		return unknown(nil, "probe not started: %w", err)
	}
	cancel := context.CancelFunc(func() {})
	if g.timeout > 0 {
		ctx, cancel = context.WithTimeoutCause(ctx, g.timeout,
			fmt.Errorf("probe deadline of %s exceeded: %w", g.timeout, context.DeadlineExceeded))
	}
	defer cancel()

	// Buffered: a probe that outlives its deadline can still deliver and
	// exit instead of blocking forever.
	done := make(chan Result, 1)
	go func() {
		done <- g.run(ctx, k)
	}()
	select {
	case res := <-done:
		return sanitize(res)
	case <-ctx.Done():
		return unknown(nil, "probe did not return in time: %w", context.Cause(ctx))
	}
}

// run calls the probe, recovering a panic, and distrusts a verdict reached
// after the context ended.
func (g *guarded) run(ctx context.Context, k Key) (res Result) {
	defer func() {
		if r := recover(); r != nil {
			if err, ok := r.(error); ok {
				res = unknown(nil, "probe panicked: %w", err)
			} else {
				res = unknown(nil, "probe panicked: %v", r)
			}
		}
	}()
	res = g.p.Probe(ctx, k)
	if err := context.Cause(ctx); err != nil && res.Verdict != Unknown {
		return unknown(res.Evidence, "probe answered %q after its context ended; not trusted: %w", res.Verdict, err)
	}
	return res
}

// sanitize enforces the shape of a Result; see Guard.
func sanitize(res Result) Result {
	if len(res.Evidence) > 0 && !json.Valid(res.Evidence) {
		return unknown(nil, "probe returned %q with evidence that is not valid JSON", res.Verdict)
	}
	if len(res.Evidence) > MaxEvidenceBytes {
		res.Evidence = json.RawMessage(fmt.Sprintf(`{"evidence_truncated":true,"bytes":%d}`, len(res.Evidence)))
	}
	switch res.Verdict {
	case Found:
		switch {
		case res.Err != nil:
			return unknown(res.Evidence, "probe returned found with an error: %w", res.Err)
		case res.Outcome == nil:
			return unknown(res.Evidence, "probe returned found without an outcome")
		case res.Outcome.Code < 100 || res.Outcome.Code > 599:
			return unknown(res.Evidence, "probe returned found with response code %d, not an HTTP status code", res.Outcome.Code)
		case len(res.Outcome.Body) == 0 || !json.Valid(res.Outcome.Body):
			return unknown(res.Evidence, "probe returned found with a response body that is not valid JSON")
		}
		// Copy: the engine stores what was checked, whatever the probe
		// does with its buffers later.
		out := *res.Outcome
		out.Body = slices.Clone(out.Body)
		res.Outcome = &out
		return res
	case NotFound:
		switch {
		case res.Err != nil:
			return unknown(res.Evidence, "probe returned not_found with an error: %w", res.Err)
		case res.Outcome != nil:
			return unknown(res.Evidence, "probe returned not_found with an outcome")
		}
		return res
	case Duplicate:
		res.Outcome = nil
		return res
	case Unknown:
		res.Outcome = nil
		if res.Err == nil {
			res.Err = errors.New("probe returned unknown without a reason")
		}
		return res
	default:
		return unknown(res.Evidence, "probe returned verdict %q, which is not one of found, not_found, duplicate, unknown", res.Verdict)
	}
}
