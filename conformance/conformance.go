// Package conformance runs the idempotency contract's test battery against a
// live HTTP tool endpoint, whatever language the tool server is written in,
// and counts effects at the sink through the tool's own probe: after each
// scenario the effect for the scenario's key must be found exactly once
// (verdict found, never duplicate).
//
// Scenarios (each key is KeyPrefix + the scenario's name, so the keys can be
// found and cleaned afterwards):
//
//   - probe-control: a key never sent must be not_found (a probe that finds
//     everything would make every other check vacuous);
//   - same-key-twice: both answers 2xx, the second a replay
//     (idempotent_replay true and the Idempotency-Replayed header), the
//     bodies identical once the replay flag is set aside, one effect;
//   - other-arguments: the key reused with other arguments → 422, still one
//     effect;
//   - concurrent: N requests with one key released together through a gate
//     → exactly one effect, one first answer, every other answer a 409 or a
//     replay;
//   - missing-key: no Idempotency-Key → 400 (unless AllowMissingKey);
//   - client-deadline: a slow-path request whose client gives up before the
//     tool finishes; the immediate retry gets 409 (or a replay, never a
//     second execution), and once finished the effect exists once;
//   - no-cached-5xx: over the whole battery, no replayed answer is a 5xx
//     (a 5xx leaves the key processing for the reconciler; it is never
//     stored and replayed).
//
// MCP tool servers: with Config.MCPTool set, URL is a streamable HTTP MCP
// endpoint and every request is a tools/call of MCPTool with Body as its
// arguments and the key in _meta.idempotencyKey (package mcpkey's
// contract). The scenarios are the same, in MCP terms: the replay is a
// result with _meta["ledgerkeeper/idempotentReplay"] true and identical
// content; other arguments and a missing key get a JSON-RPC invalid-params
// error (-32602); a call with the key in flight gets a tool error (IsError);
// no-cached-5xx does not apply.
//
// The scenarios are written once (battery), against a transport; each
// transport (httpTransport, mcpTransport) makes calls, reads their answers
// into replies, and names them in its own words.
package conformance

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/probes"
)

// Defaults.
const (
	DefaultConcurrency  = 50
	DefaultSlowDeadline = 2 * time.Second
	DefaultTimeout      = 30 * time.Second
	// DefaultSettle bounds how long the client-deadline scenario waits for
	// the slow request to finish.
	DefaultSettle = 60 * time.Second
)

// Assertion statuses.
const (
	Pass = "PASS"
	Fail = "FAIL"
	Skip = "SKIP"
)

// Config is one run of the battery.
type Config struct {
	// URL is the tool endpoint; every request is a POST with a JSON body.
	URL string
	// MCPTool, when set, makes URL a streamable HTTP MCP endpoint and
	// every request a tools/call of this tool (Body its arguments).
	MCPTool string
	// Tool is the tool's name, passed to the probe.
	Tool string
	// Probe counts effects: the tool's configured probe.
	Probe probes.Probe
	// KeyPrefix starts every key the battery sends.
	KeyPrefix string
	// Body is a valid request (the tool's arguments). Required.
	Body json.RawMessage
	// OtherBody is the same request with other arguments; default Body
	// with one extra member "_conformance_variant" (Body must then be an
	// object).
	OtherBody json.RawMessage
	// SlowBody is a request that takes longer than SlowDeadline to
	// process; without it client-deadline is skipped.
	SlowBody json.RawMessage
	// SlowDeadline is the client deadline of the slow request.
	SlowDeadline time.Duration
	// AllowMissingKey: the tool accepts requests without a key.
	AllowMissingKey bool
	// Concurrency is the number of concurrent requests; default 50.
	Concurrency int
	// Timeout bounds each request (except the slow one) and each probe.
	Timeout time.Duration
	// Settle bounds the wait for the slow request to finish.
	Settle time.Duration
	// Client sends the requests; default one with its own transport.
	Client *http.Client
}

// Assertion is one checked statement about the tool.
type Assertion struct {
	Status string `json:"status"`
	Name   string `json:"name"`
	Seen   string `json:"seen"`
}

// Report is the battery's result.
type Report struct {
	URL        string      `json:"url"`
	Tool       string      `json:"tool"`
	KeyPrefix  string      `json:"key_prefix"`
	Assertions []Assertion `json:"assertions"`
	Passed     int         `json:"passed"`
	Failed     int         `json:"failed"`
	Skipped    int         `json:"skipped"`
}

// OK reports whether no assertion failed.
func (r Report) OK() bool { return r.Failed == 0 }

// Validate says what is wrong with the configuration, if anything.
func (c *Config) Validate() error {
	var errs []error
	if c.URL == "" {
		errs = append(errs, errors.New("the tool endpoint URL is required"))
	}
	if c.Tool == "" || c.Probe == nil {
		errs = append(errs, errors.New("a tool with a probe is required"))
	}
	if !json.Valid(c.Body) {
		errs = append(errs, errors.New("body: a valid JSON request is required"))
	}
	if len(c.OtherBody) > 0 && !json.Valid(c.OtherBody) {
		errs = append(errs, errors.New("other body: not valid JSON"))
	}
	if len(c.SlowBody) > 0 && !json.Valid(c.SlowBody) {
		errs = append(errs, errors.New("slow body: not valid JSON"))
	}
	if len(c.OtherBody) == 0 && json.Valid(c.Body) {
		if _, err := variant(c.Body); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) == 0 && len(c.OtherBody) > 0 && same(c.Body, c.OtherBody) {
		errs = append(errs, errors.New("other body: must differ from body in its arguments"))
	}
	return errors.Join(errs...)
}

func same(a, b json.RawMessage) bool {
	ca, err1 := ledger.Canonical(a)
	cb, err2 := ledger.Canonical(b)
	return err1 == nil && err2 == nil && bytes.Equal(ca, cb)
}

func variant(body json.RawMessage) (json.RawMessage, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil || m == nil {
		return nil, errors.New("body is not a JSON object: pass the other arguments explicitly (--other-body)")
	}
	m["_conformance_variant"] = json.RawMessage(`"other"`)
	return json.Marshal(m)
}

// transport is one way of calling the tool under test. The battery's
// scenarios are written once against it; a transport adapts them to its
// protocol.
type transport interface {
	// call makes one call with key (none when "") and body, bounded by
	// timeout.
	call(ctx context.Context, key string, body json.RawMessage, timeout time.Duration) reply
	// terms are the transport's words in assertion names and evidence.
	terms() terms
	// finally are the findings over every call the battery made, checked
	// after the last scenario.
	finally() []finding
}

// reply is one answer to a call, as the battery judges it.
type reply struct {
	err error
	// ok: the tool's success (an HTTP 2xx, an MCP result without isError).
	ok bool
	// replay: the answer says it replays a stored outcome.
	replay bool
	// inFlight: the answer says the key is in flight (409, the in-flight
	// tool error).
	inFlight bool
	// code is the status a refusal is recognised by: the HTTP status, or
	// the JSON-RPC error code; 0 for none.
	code int64
	// content is what a first answer and its replay must share, "" when
	// there is nothing to compare; shown is it as evidence.
	content, shown string
	// text names the answer; detail adds an excerpt of its body.
	text, detail string
	// markers say whether the answer is marked as a replay, one finding a
	// marker, each named as a predicate of the answer ("answer says …").
	markers []finding
}

func (a reply) String() string { return a.text }

// replayed reports a success that says it is a replay.
func (a reply) replayed() bool { return a.ok && a.replay }

// finding is one checked statement a transport contributes.
type finding struct {
	name string
	ok   bool
	seen string
}

// terms are a transport's words, where the battery's assertions and
// evidence differ between transports.
type terms struct {
	unit         string // one call: "request"
	ok           string // a success, after "first ": "answer 2xx"
	firsts       string // executed calls, counted: "first answers"
	inFlight     string // an in-flight answer: "a 409"
	inFlights    string // in-flight answers, counted: "conflicts (409)"
	retry        string // the retry's in-flight answer: "gets 409"
	deadlineSkip string // the client-deadline skip: "gets 409, never a second effect"
	outcome      string // what is stored: "outcome"
	identical    string // the same-key-twice comparison: "identical bodies after normalisation"
	otherArgs    string // the refusal of other arguments: "gets 422"
	missingKey   string // the missing-key assertion: "a request without Idempotency-Key gets 400"
	// otherArgsCode and missingKeyCode are the refusals' reply codes.
	otherArgsCode, missingKeyCode int64
}

type runner struct {
	cfg Config
	rep Report
	t   transport
	w   terms
}

// battery is the contract's scenarios, in order, whatever the transport.
var battery = []func(*runner, context.Context){
	(*runner).probeControl, (*runner).sameKeyTwice, (*runner).otherArguments,
	(*runner).concurrent, (*runner).missingKey, (*runner).clientDeadline,
}

// Run runs the battery. It returns an error only for a bad configuration;
// everything the tool does wrong is a failed assertion in the report.
func Run(ctx context.Context, cfg Config) (Report, error) {
	if err := cfg.Validate(); err != nil {
		return Report{}, err
	}
	if len(cfg.OtherBody) == 0 {
		cfg.OtherBody, _ = variant(cfg.Body)
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = DefaultConcurrency
	}
	if cfg.SlowDeadline <= 0 {
		cfg.SlowDeadline = DefaultSlowDeadline
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.Settle <= 0 {
		cfg.Settle = DefaultSettle
	}
	if cfg.Client == nil {
		cfg.Client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: cfg.Concurrency}}
	}
	r := &runner{cfg: cfg, rep: Report{URL: cfg.URL, Tool: cfg.Tool, KeyPrefix: cfg.KeyPrefix}}
	if cfg.MCPTool == "" {
		r.t = &httpTransport{cfg: cfg}
	} else {
		m, err := dialMCP(ctx, cfg)
		if err != nil {
			r.record(Fail, "mcp/connect over streamable HTTP", "%v", err)
			return r.rep, nil
		}
		defer m.close()
		r.t = m
	}
	r.w = r.t.terms()
	for _, s := range battery {
		if ctx.Err() != nil {
			return r.rep, fmt.Errorf("conformance interrupted: %w", ctx.Err())
		}
		s(r, ctx)
	}
	for _, f := range r.t.finally() {
		r.check(f.ok, f.name, "%s", f.seen)
	}
	return r.rep, nil
}

func (r *runner) record(status, name, format string, args ...any) {
	r.rep.Assertions = append(r.rep.Assertions, Assertion{Status: status, Name: name, Seen: fmt.Sprintf(format, args...)})
	switch status {
	case Pass:
		r.rep.Passed++
	case Fail:
		r.rep.Failed++
	default:
		r.rep.Skipped++
	}
}

func (r *runner) check(ok bool, name, format string, args ...any) bool {
	st := Fail
	if ok {
		st = Pass
	}
	r.record(st, name, format, args...)
	return ok
}

func (r *runner) key(scenario string) string { return r.cfg.KeyPrefix + scenario }

// call makes one call with key and body through the transport.
func (r *runner) call(ctx context.Context, key string, body json.RawMessage, timeout time.Duration) reply {
	return r.t.call(ctx, key, body, timeout)
}

// effect asks the probe about key and asserts want (found or not_found).
func (r *runner) effect(ctx context.Context, name, key string, body json.RawMessage, want probes.Verdict) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()
	canon, _ := ledger.Canonical(body)
	now := time.Now()
	res := r.cfg.Probe.Probe(ctx, probes.Key{Key: key, Tool: r.cfg.Tool, RequestBody: canon, CreatedAt: now, ClaimedAt: now})
	seen := "verdict " + string(res.Verdict)
	if res.Err != nil {
		seen += " (" + res.Err.Error() + ")"
	}
	if want == probes.Found {
		seen += ", want found (exactly one effect)"
	} else {
		seen += ", want not_found (no effect)"
	}
	r.check(res.Verdict == want, name, "%s", seen)
}

func (r *runner) probeControl(ctx context.Context) {
	r.effect(ctx, "probe-control/a key never sent is not found", r.key("probe-control"), r.cfg.Body, probes.NotFound)
}

func (r *runner) sameKeyTwice(ctx context.Context) {
	const prefix = "same-key-twice/"
	key := r.key("same-key-twice")
	first := r.call(ctx, key, r.cfg.Body, r.cfg.Timeout)
	second := r.call(ctx, key, r.cfg.Body, r.cfg.Timeout)
	r.check(first.ok && !first.replay, prefix+"first "+r.w.ok+", not a replay", "%s", first)
	r.check(second.ok, prefix+"second "+r.w.ok, "%s", second)
	for _, m := range second.markers {
		r.check(m.ok, prefix+"second "+m.name, "%s", m.seen)
	}
	r.check(first.content != "" && first.content == second.content, prefix+r.w.identical,
		"first %s, second %s", first.shown, second.shown)
	r.effect(ctx, prefix+"one effect", key, r.cfg.Body, probes.Found)
}

func (r *runner) otherArguments(ctx context.Context) {
	key := r.key("other-arguments")
	first := r.call(ctx, key, r.cfg.Body, r.cfg.Timeout)
	other := r.call(ctx, key, r.cfg.OtherBody, r.cfg.Timeout)
	r.check(first.ok, "other-arguments/first "+r.w.ok, "%s", first)
	r.check(other.code == r.w.otherArgsCode, "other-arguments/the key with other arguments "+r.w.otherArgs, "%s", other.detail)
	r.effect(ctx, "other-arguments/still one effect", key, r.cfg.Body, probes.Found)
}

func (r *runner) concurrent(ctx context.Context) {
	key := r.key("concurrent")
	n := r.cfg.Concurrency
	answers := together(n, func() reply { return r.call(ctx, key, r.cfg.Body, r.cfg.Timeout) })
	firsts, inFlight, replays := 0, 0, 0
	var others []string
	for _, a := range answers {
		switch {
		case a.replayed():
			replays++
		case a.ok:
			firsts++
		case a.inFlight:
			inFlight++
		default:
			others = append(others, a.String())
		}
	}
	seen := fmt.Sprintf("%d %ss: %d %s, %d replays, %d %s", n, r.w.unit, firsts, r.w.firsts, replays, inFlight, r.w.inFlights)
	if len(others) > 0 {
		seen += ", other answers: " + strings.Join(others[:min(len(others), 5)], "; ")
	}
	r.check(firsts == 1, "concurrent/exactly one "+r.w.unit+" executed", "%s", seen)
	r.check(len(others) == 0, "concurrent/every other answer "+r.w.inFlight+" or a replay", "%s", seen)
	r.effect(ctx, "concurrent/exactly one effect", key, r.cfg.Body, probes.Found)
}

func (r *runner) missingKey(ctx context.Context) {
	name := "missing-key/" + r.w.missingKey
	if r.cfg.AllowMissingKey {
		r.record(Skip, name, "the tool accepts %ss without a key (--allow-missing-key)", r.w.unit)
		return
	}
	a := r.call(ctx, "", r.cfg.Body, r.cfg.Timeout)
	r.check(a.code == r.w.missingKeyCode, name, "%s", a.detail)
}

func (r *runner) clientDeadline(ctx context.Context) {
	const prefix = "client-deadline/"
	if len(r.cfg.SlowBody) == 0 {
		r.record(Skip, prefix+"the retry after a client deadline "+r.w.deadlineSkip,
			"needs a slow-path %s (--slow-body) that takes longer than the client deadline", r.w.unit)
		return
	}
	key := r.key("client-deadline")
	first := r.call(ctx, key, r.cfg.SlowBody, r.cfg.SlowDeadline)
	if !r.check(errors.Is(first.err, context.DeadlineExceeded), prefix+"the slow "+r.w.unit+" outlives the client deadline",
		"%s within %s", first, r.cfg.SlowDeadline) {
		return
	}
	retry := r.call(ctx, key, r.cfg.SlowBody, r.cfg.Timeout)
	r.check(retry.inFlight || retry.replayed(), prefix+"the immediate retry "+r.w.retry+" (or a replay), not a second execution", "%s", retry.detail)
	// Wait for the slow call to finish: retry until it is no longer in
	// flight.
	deadline := time.Now().Add(r.cfg.Settle)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	last := retry
	for last.inFlight && time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		last = r.call(ctx, key, r.cfg.SlowBody, r.cfg.Timeout)
	}
	r.check(last.replayed(), prefix+"once finished, a retry gets the stored "+r.w.outcome+" replayed", "%s", last.detail)
	r.effect(ctx, prefix+"one effect", key, r.cfg.SlowBody, probes.Found)
}

func excerpt(b []byte) string {
	s := strings.TrimSpace(string(b))
	if len(s) > 200 {
		s = strings.ToValidUTF8(s[:200], "") + "…"
	}
	return s
}

// Print writes one line per assertion: STATUS name: seen.
func Print(w io.Writer, rep Report) error {
	var b strings.Builder
	for _, a := range rep.Assertions {
		fmt.Fprintf(&b, "%s %s: %s\n", a.Status, a.Name, a.Seen)
	}
	fmt.Fprintf(&b, "%d passed, %d failed, %d skipped (keys %s*)\n", rep.Passed, rep.Failed, rep.Skipped, rep.KeyPrefix)
	_, err := io.WriteString(w, b.String())
	return err
}

// together makes n calls released at once through a gate, so that they
// race for one key, and returns their answers in order.
func together[T any](n int, call func() T) []T {
	gate := make(chan struct{})
	out := make([]T, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-gate
			out[i] = call()
		})
	}
	close(gate)
	wg.Wait()
	return out
}
