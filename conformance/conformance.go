// Package conformance runs the idempotency contract's test battery against a
// live tool endpoint, whatever language or library the tool server is built
// with, and counts effects at the sink through the tool's own probe: after
// each scenario the effect for the scenario's key must be found exactly
// once (verdict found, never duplicate).
//
// The battery judges the contract, not ledgerkeeper's envelope: a replay is
// recognised by being the first answer again (same status and body) with
// the effect counted once at the sink, never by a marker. The markers of
// ledger.Middleware and package mcpkey (idempotent_replay,
// Idempotency-Replayed, _meta["ledgerkeeper/idempotentReplay"], refusals as
// JSON-RPC -32602) are a separate set of assertions, named ledgerkeeper/…,
// run only under ProfileLedgerkeeper.
//
// Scenarios (each key is KeyPrefix + the scenario's name, so the keys can be
// found and cleaned afterwards):
//
//   - probe-control: a key never sent must be not_found (a probe that finds
//     everything would make every other check vacuous); a probe that cannot
//     answer stops the run (Run returns an error wrapping ErrNotReached);
//   - same-key-twice: the first answer a success, the second the first
//     again, one effect. Its first request also tells whether the endpoint
//     is reached at all: no answer (a dead URL) or a 404/405 (a wrong URL)
//     stops the run before any assertion. Over HTTP with keys sent as
//     Structured Field Strings, key-format checks that the server reads the
//     string's value as the key (the effect is found under it, not under
//     the quoted form);
//   - other-arguments: the key reused with other arguments is refused (HTTP
//     422), still one effect;
//   - concurrent: N requests with one key released together through a gate:
//     exactly one executed (judged at the sink: one effect), the successes
//     all one answer (the first and its replays), every other answer in
//     flight (HTTP 409);
//   - missing-key: no key → refused (HTTP 400), unless AllowMissingKey;
//   - client-deadline: a slow request whose client gives up before the tool
//     finishes; the immediate retry is in flight (or the stored answer),
//     once finished retries get one stored answer, and the effect exists
//     once;
//   - no-cached-5xx: a request the tool fails (FailBody) is retried with its
//     key: the retry must not be the failure replayed (a 5xx is never
//     stored; the key stays processing for the reconciler, or the request
//     runs again). A failure that is the same for every key (no request id
//     in it) cannot be told from its replay: skipped, with that reason.
//
// MCP tool servers: with Config.MCPTool set, URL is a streamable HTTP MCP
// endpoint and every request is a tools/call of MCPTool with Body as its
// arguments and the key in _meta.idempotencyKey. The probe is given the
// request as package mcpkey stores it ({"tool": MCPTool, "arguments":
// Body}). The scenarios in MCP terms: a replay is the same result; a
// refusal is either MCP error style (a JSON-RPC error, or a result with
// isError, as the TypeScript SDK's McpServer turns every thrown error into);
// an in-flight answer is an error carrying a retry-after (a _meta or error
// data member named retryAfter or retryAfterSeconds, with or without a
// "vendor/" prefix), not any isError; no-cached-5xx becomes
// no-cached-tool-error.
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
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

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

// Profiles: which assertions run.
const (
	// ProfileDraft07 (the default) judges the contract only: over HTTP,
	// draft-ietf-httpapi-idempotency-key-header-07's MUSTs and SHOULDs
	// (keys as Structured Field Strings, a replay is the first answer
	// again, 409 in flight, 422 for another payload, 400 without a key),
	// and ledgerkeeper's rule that a 5xx is never replayed.
	ProfileDraft07 = "draft-07"
	// ProfileLedgerkeeper adds the markers of ledger.Middleware and
	// package mcpkey, each assertion named ledgerkeeper/….
	ProfileLedgerkeeper = "ledgerkeeper"
)

// Key formats: how a key is written in the Idempotency-Key header.
const (
	// KeyFormatSFString sends the key as a Structured Field String
	// (RFC 8941 §3.3.3: in double quotes, `"` and `\` escaped), as
	// draft-07's Syntax section requires. The default under ProfileDraft07.
	KeyFormatSFString = "sf-string"
	// KeyFormatRaw sends the key's bytes bare, for servers that take the
	// header's value as the key (ledger.Middleware does). The default under
	// ProfileLedgerkeeper.
	KeyFormatRaw = "raw"
)

// Assertion statuses.
const (
	Pass = "PASS"
	Fail = "FAIL"
	Skip = "SKIP"
)

// ErrNotReached is wrapped by the error Run returns when the battery cannot
// judge anything: the endpoint does not answer, answers 404 or 405, the MCP
// server lacks the tool, or the probe cannot answer for a key never sent.
var ErrNotReached = errors.New("nothing was judged")

func notReached(format string, args ...any) error {
	return fmt.Errorf("%s: %w", fmt.Sprintf(format, args...), ErrNotReached)
}

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
	// Profile selects the assertions: ProfileDraft07 (default) or
	// ProfileLedgerkeeper.
	Profile string
	// KeyFormat is how keys are written in the Idempotency-Key header:
	// KeyFormatSFString or KeyFormatRaw. Default: sf-string under
	// ProfileDraft07, raw under ProfileLedgerkeeper. MCP keys are JSON
	// strings in _meta; the format does not apply.
	KeyFormat string
	// KeyPrefix starts every key the battery sends: printable ASCII.
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
	// FailBody is a request the tool answers with a failure (HTTP 5xx, an
	// MCP tool error); without it no-cached-5xx is skipped.
	FailBody json.RawMessage
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
	Profile    string      `json:"profile"`
	KeyFormat  string      `json:"key_format,omitempty"`
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
	switch c.Profile {
	case "", ProfileDraft07, ProfileLedgerkeeper:
	default:
		errs = append(errs, fmt.Errorf("profile %q: want %s or %s", c.Profile, ProfileDraft07, ProfileLedgerkeeper))
	}
	switch c.KeyFormat {
	case "", KeyFormatSFString, KeyFormatRaw:
	default:
		errs = append(errs, fmt.Errorf("key format %q: want %s or %s", c.KeyFormat, KeyFormatSFString, KeyFormatRaw))
	}
	for i := range len(c.KeyPrefix) {
		if b := c.KeyPrefix[i]; b < 0x20 || b > 0x7e {
			errs = append(errs, fmt.Errorf("key prefix: byte %d (%q) is not printable ASCII, which a header value and a Structured Field String need", i, b))
			break
		}
	}
	if !json.Valid(c.Body) {
		errs = append(errs, errors.New("body: a valid JSON request is required"))
	}
	for _, b := range []struct {
		name string
		v    json.RawMessage
	}{{"other body", c.OtherBody}, {"slow body", c.SlowBody}, {"fail body", c.FailBody}} {
		if len(b.v) > 0 && !json.Valid(b.v) {
			errs = append(errs, fmt.Errorf("%s: not valid JSON", b.name))
		}
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
	// reached judges the battery's first answer: an error wrapping
	// ErrNotReached when the endpoint was not reached at all.
	reached(first reply) error
	// refused judges an answer to a request the contract refuses (other
	// arguments, no key), and returns the ledgerkeeper profile's finding
	// about the refusal's form, if the transport has one.
	refused(a reply, why refusal) (ok bool, marker *finding)
	// stored is the request as the tool side stores it (request_body), as
	// the probe is given it.
	stored(body json.RawMessage) json.RawMessage
	// headerKeys reports whether keys travel in the Idempotency-Key
	// header (so KeyFormat applies).
	headerKeys() bool
	// terms are the transport's words in assertion names and evidence.
	terms() terms
	// finally are the ledgerkeeper profile's findings over every call the
	// battery made, checked after the last scenario.
	finally() []finding
}

// refusal names why the contract refuses a request.
type refusal int

const (
	refuseOtherArguments refusal = iota
	refuseMissingKey
)

// reply is one answer to a call, as the battery judges it.
type reply struct {
	err error
	// status is the HTTP status (0 over MCP).
	status int
	// ok: the tool's success (an HTTP 2xx, an MCP result without isError).
	ok bool
	// inFlight: the answer says the key is in flight (an HTTP 409, an MCP
	// error carrying a retry-after).
	inFlight bool
	// failed: the tool failed (an HTTP 5xx, an MCP error that is not in
	// flight).
	failed bool
	// toolError: an MCP result with isError (MCP's second error style).
	toolError bool
	// content is what a replay of this answer must reproduce (status and
	// body), "" when there is no answer; shown is its evidence.
	content, shown string
	// text names the answer; detail adds a quoted excerpt of its body.
	text, detail string
	// marked: ledgerkeeper's markers say this answer is a replay; markers
	// are those markers, one finding each, named as a predicate of the
	// answer ("says …").
	marked  bool
	markers []finding
}

func (a reply) String() string { return a.text }

// replays reports whether a is b again: the same status and body.
func (a reply) replays(b reply) bool { return a.content != "" && a.content == b.content }

// finding is one checked statement a transport contributes.
type finding struct {
	name string
	ok   bool
	seen string
}

// terms are a transport's words, where the battery's assertions and
// evidence differ between transports.
type terms struct {
	unit        string // one call: "request"
	ok          string // a success, after "first ": "answer 2xx"
	oks         string // successes, counted: "answers 2xx"
	inFlight    string // an in-flight answer: "a 409"
	inFlights   string // in-flight answers, counted: "conflicts (409)"
	retry       string // the retry's in-flight answer: "gets 409"
	outcome     string // what is stored: "answer"
	replay      string // the same-key-twice judgement: "second answer is the first replayed (same status and body)"
	otherArgs   string // the refusal of other arguments: "gets 422"
	missingKey  string // the missing-key assertion: "a request without Idempotency-Key gets 400"
	failure     string // a failure: "a 5xx"
	failureNoun string // the same after "that": "5xx"
	noCached    string // the scenario's name: "no-cached-5xx"
	failureHint string // how to make failures tell apart: "a request id in the 5xx body"
}

type runner struct {
	cfg Config
	rep Report
	t   transport
	w   terms
	// first is same-key-twice's first answer, which also tells whether the
	// endpoint is reached.
	first reply
	// quoted: the server took the sf-string's quotes as part of the key,
	// so the probe is asked about the quoted form (key-format failed once;
	// the rest of the battery still judges the contract).
	quoted bool
}

// battery is the contract's scenarios, in order, whatever the transport.
var battery = []func(*runner, context.Context){
	(*runner).sameKeyTwice, (*runner).otherArguments, (*runner).concurrent,
	(*runner).missingKey, (*runner).clientDeadline, (*runner).noCachedFailure,
}

// Run runs the battery. It returns an error for a bad configuration, and
// one wrapping ErrNotReached when nothing could be judged (a dead or wrong
// URL, a probe that cannot answer); everything the tool does wrong is a
// failed assertion in the report.
func Run(ctx context.Context, cfg Config) (Report, error) {
	if err := cfg.Validate(); err != nil {
		return Report{}, err
	}
	if len(cfg.OtherBody) == 0 {
		cfg.OtherBody, _ = variant(cfg.Body)
	}
	if cfg.Profile == "" {
		cfg.Profile = ProfileDraft07
	}
	if cfg.KeyFormat == "" {
		cfg.KeyFormat = KeyFormatSFString
		if cfg.Profile == ProfileLedgerkeeper {
			cfg.KeyFormat = KeyFormatRaw
		}
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
	r := &runner{cfg: cfg, rep: Report{URL: redact(cfg.URL), Tool: cfg.Tool, Profile: cfg.Profile, KeyPrefix: cfg.KeyPrefix}}
	if cfg.MCPTool == "" {
		r.t = &httpTransport{cfg: cfg}
		r.rep.KeyFormat = cfg.KeyFormat
	} else {
		m, err := dialMCP(ctx, cfg)
		if err != nil {
			return Report{}, err
		}
		defer m.close()
		r.t = m
	}
	r.w = r.t.terms()
	r.first = r.call(ctx, r.key("same-key-twice"), cfg.Body, cfg.Timeout)
	if err := r.t.reached(r.first); err != nil {
		return Report{}, err
	}
	if err := r.probeControl(ctx); err != nil {
		return Report{}, err
	}
	for _, s := range battery {
		if ctx.Err() != nil {
			return r.rep, fmt.Errorf("conformance interrupted: %w", ctx.Err())
		}
		s(r, ctx)
	}
	if r.lk() {
		for _, f := range r.t.finally() {
			r.check(f.ok, f.name, "%s", f.seen)
		}
	}
	return r.rep, nil
}

// redact hides a URL's password, should one be given.
func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return raw
	}
	return u.Redacted()
}

// lk reports whether the ledgerkeeper profile's assertions run.
func (r *runner) lk() bool { return r.cfg.Profile == ProfileLedgerkeeper }

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

// marker records a ledgerkeeper profile finding about scenario, if the
// profile runs.
func (r *runner) marker(scenario string, f finding) {
	if r.lk() {
		r.check(f.ok, "ledgerkeeper/"+scenario+"/"+f.name, "%s", f.seen)
	}
}

func (r *runner) key(scenario string) string { return r.cfg.KeyPrefix + scenario }

// call makes one call with key and body through the transport.
func (r *runner) call(ctx context.Context, key string, body json.RawMessage, timeout time.Duration) reply {
	return r.t.call(ctx, key, body, timeout)
}

// probe asks the probe about key, given as the server reads it.
func (r *runner) probe(ctx context.Context, key string, body json.RawMessage) probes.Result {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()
	now := time.Now()
	return r.cfg.Probe.Probe(ctx, probes.Key{Key: key, Tool: r.cfg.Tool, RequestBody: r.t.stored(body), CreatedAt: now, ClaimedAt: now})
}

// probeKey is key as the server under test reads it.
func (r *runner) probeKey(key string) string {
	if r.quoted {
		return sfString(key)
	}
	return key
}

// effect asks the probe about key and asserts that the effect exists
// exactly once.
func (r *runner) effect(ctx context.Context, name, key string, body json.RawMessage) {
	r.judgeEffect(name, r.probe(ctx, r.probeKey(key), body), "")
}

func (r *runner) judgeEffect(name string, res probes.Result, extra string) {
	seen := "verdict " + string(res.Verdict)
	if res.Err != nil {
		seen += " (" + res.Err.Error() + ")"
	}
	seen += ", want found (exactly one effect)" + extra
	r.check(res.Verdict == probes.Found, name, "%s", seen)
}

// probeControl asks the probe about a key never sent: not_found, or the
// probe finds everything. A probe that cannot answer stops the run: every
// effect check would be vacuous.
func (r *runner) probeControl(ctx context.Context) error {
	res := r.probe(ctx, r.key("probe-control"), r.cfg.Body)
	seen := "verdict " + string(res.Verdict)
	if res.Err != nil {
		seen += " (" + res.Err.Error() + ")"
	}
	if res.Verdict == probes.Unknown {
		return notReached("the probe of tool %q cannot answer for a key never sent (%s): every effect check would be vacuous; fix the probe (ledgerkeeper probe run) first", r.cfg.Tool, seen)
	}
	r.check(res.Verdict == probes.NotFound, "probe-control/a key never sent is not found", "%s, want not_found (no effect)", seen)
	return nil
}

func (r *runner) sameKeyTwice(ctx context.Context) {
	const scenario = "same-key-twice"
	key := r.key(scenario)
	first := r.first
	second := r.call(ctx, key, r.cfg.Body, r.cfg.Timeout)
	r.check(first.ok, scenario+"/first "+r.w.ok, "%s", first.detail)
	r.check(first.ok && second.replays(first), scenario+"/"+r.w.replay, "first %s, second %s", first.shown, second.shown)
	r.keyFormat(ctx, key)
	r.marker(scenario, finding{name: "first " + r.w.unit + " not marked as a replay", ok: first.ok && !first.marked, seen: first.detail})
	for _, m := range second.markers {
		r.marker(scenario, finding{name: "second " + m.name, ok: m.ok, seen: m.seen})
	}
}

// keyFormat asks the probe about same-key-twice's effect. Keys sent as
// Structured Field Strings must be read as the string's value: an effect
// found only under the quoted form fails key-format once, and the rest of
// the battery asks the probe about the quoted form, so that the one
// mistake does not fail every effect check.
func (r *runner) keyFormat(ctx context.Context, key string) {
	const name = "same-key-twice/one effect"
	res := r.probe(ctx, key, r.cfg.Body)
	if !r.t.headerKeys() || r.cfg.KeyFormat != KeyFormatSFString {
		r.judgeEffect(name, res, "")
		return
	}
	const kf = "key-format/the key is read as the Structured Field String's value, without its quotes"
	if res.Verdict == probes.NotFound {
		if alt := r.probe(ctx, sfString(key), r.cfg.Body); alt.Verdict == probes.Found || alt.Verdict == probes.Duplicate {
			r.quoted = true
			r.check(false, kf, "the effect is under the key %s, quotes included: the server takes the header's bytes as the key (send bare keys with --key-format raw)", strconv.Quote(sfString(key)))
			r.judgeEffect(name, alt, " (under the quoted key)")
			return
		}
	}
	if res.Verdict == probes.Found || res.Verdict == probes.Duplicate {
		r.check(true, kf, "the effect is under the key %s", strconv.Quote(key))
	} else {
		r.record(Skip, kf, "no effect found under %s nor under its quoted form: see same-key-twice/one effect", strconv.Quote(key))
	}
	r.judgeEffect(name, res, "")
}

func (r *runner) otherArguments(ctx context.Context) {
	const scenario = "other-arguments"
	key := r.key(scenario)
	first := r.call(ctx, key, r.cfg.Body, r.cfg.Timeout)
	other := r.call(ctx, key, r.cfg.OtherBody, r.cfg.Timeout)
	r.check(first.ok, scenario+"/first "+r.w.ok, "%s", first.detail)
	ok, m := r.t.refused(other, refuseOtherArguments)
	r.check(ok, scenario+"/the key with other arguments "+r.w.otherArgs, "%s", other.detail)
	if m != nil {
		r.marker(scenario, *m)
	}
	r.effect(ctx, scenario+"/still one effect", key, r.cfg.Body)
}

func (r *runner) concurrent(ctx context.Context) {
	const scenario = "concurrent"
	key := r.key(scenario)
	n := r.cfg.Concurrency
	answers := together(n, func() reply { return r.call(ctx, key, r.cfg.Body, r.cfg.Timeout) })
	oks, inFlight, unmarked := 0, 0, 0
	distinct := map[string]bool{}
	var others []string
	var firstOK reply
	for _, a := range answers {
		switch {
		case a.ok:
			if oks == 0 {
				firstOK = a
			}
			oks++
			distinct[a.content] = true
			if !a.marked {
				unmarked++
			}
		case a.inFlight:
			inFlight++
		default:
			others = append(others, a.detail)
		}
	}
	seen := fmt.Sprintf("%d %ss: %d %s (%d distinct), %d %s", n, r.w.unit, oks, r.w.oks, len(distinct), inFlight, r.w.inFlights)
	if len(others) > 0 {
		seen += fmt.Sprintf(", %d others, e.g. %s", len(others), strings.Join(others[:min(len(others), 3)], "; "))
	}
	res := r.probe(ctx, r.probeKey(key), r.cfg.Body)
	r.judgeEffect(scenario+"/exactly one "+r.w.unit+" executed", res, " at the sink; "+seen)
	r.check(oks >= 1 && len(distinct) == 1, scenario+"/the "+r.w.oks+" are one "+r.w.outcome+" and its replays", "%s; e.g. %s", seen, firstOK.shown)
	r.check(len(others) == 0, scenario+"/every other "+r.w.unit+" "+r.w.inFlight, "%s", seen)
	r.marker(scenario, finding{name: "exactly one " + r.w.ok + " not marked as a replay", ok: unmarked == 1,
		seen: fmt.Sprintf("%d of %d %s unmarked", unmarked, oks, r.w.oks)})
}

func (r *runner) missingKey(ctx context.Context) {
	const scenario = "missing-key"
	name := scenario + "/" + r.w.missingKey
	if r.cfg.AllowMissingKey {
		r.record(Skip, name, "the tool accepts %ss without a key (--allow-missing-key)", r.w.unit)
		return
	}
	a := r.call(ctx, "", r.cfg.Body, r.cfg.Timeout)
	ok, m := r.t.refused(a, refuseMissingKey)
	r.check(ok, name, "%s", a.detail)
	if m != nil {
		r.marker(scenario, *m)
	}
}

func (r *runner) clientDeadline(ctx context.Context) {
	const scenario = "client-deadline"
	const prefix = scenario + "/"
	if len(r.cfg.SlowBody) == 0 {
		r.record(Skip, prefix+"the retry after a client deadline "+r.w.retry+", never a second effect",
			"needs a slow-path %s (--slow-body) that takes longer than the client deadline", r.w.unit)
		return
	}
	key := r.key(scenario)
	first := r.call(ctx, key, r.cfg.SlowBody, r.cfg.SlowDeadline)
	if !r.check(errors.Is(first.err, context.DeadlineExceeded), prefix+"the slow "+r.w.unit+" outlives the client deadline",
		"%s within %s", first, r.cfg.SlowDeadline) {
		return
	}
	retry := r.call(ctx, key, r.cfg.SlowBody, r.cfg.Timeout)
	r.check(retry.inFlight || retry.ok, prefix+"the immediate retry "+r.w.retry+" or the stored "+r.w.outcome+" (a second execution shows at the sink)", "%s", retry.detail)
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
	again := r.call(ctx, key, r.cfg.SlowBody, r.cfg.Timeout)
	r.check(last.ok && again.replays(last), prefix+"once finished, retries get one stored "+r.w.outcome,
		"%s, then %s", last.shown, again.shown)
	r.marker(scenario, finding{name: "the stored " + r.w.outcome + " marked as a replay", ok: again.marked, seen: again.detail})
	r.effect(ctx, prefix+"one effect", key, r.cfg.SlowBody)
}

// noCachedFailure fails a request on purpose (FailBody) and retries it
// with its key: the retry must not be the failure replayed. A retry that is
// the failure again could also be the request failing again the same way;
// a second key's failure tells them apart: if it differs from the first
// (a request id, a time), the tool's failures vary, and a retry identical
// to the first is a replay.
func (r *runner) noCachedFailure(ctx context.Context) {
	prefix := r.w.noCached + "/"
	name := prefix + "the retry after " + r.w.failure + " is not that " + r.w.failureNoun + " replayed"
	if len(r.cfg.FailBody) == 0 {
		r.record(Skip, name, "needs a %s the tool answers with %s (--fail-body)", r.w.unit, r.w.failure)
		return
	}
	key := r.key(r.w.noCached)
	first := r.call(ctx, key, r.cfg.FailBody, r.cfg.Timeout)
	if !r.check(first.failed, prefix+"the --fail-body "+r.w.unit+" gets "+r.w.failure, "%s", first.detail) {
		r.record(Skip, name, "--fail-body did not fail, so nothing was retried")
		return
	}
	control := r.call(ctx, r.key(r.w.noCached+"-control"), r.cfg.FailBody, r.cfg.Timeout)
	retry := r.call(ctx, key, r.cfg.FailBody, r.cfg.Timeout)
	switch {
	case !retry.replays(first):
		r.check(true, name, "first %s, retry %s", first.shown, retry.shown)
	case control.replays(first):
		r.record(Skip, name, "the retry got the same answer (%s), but so did another key (%s): the tool's failure is the same for every request, so a replay cannot be told from a second failure (%s)",
			first.shown, r.key(r.w.noCached+"-control"), r.w.failureHint)
	default:
		r.check(false, name, "the retry got the first answer again, %s, while another key got %s: the failure was stored and replayed", first.shown, control.shown)
	}
}

// sfString is s as an RFC 8941 sf-string (§3.3.3, serialised per §4.1.6):
// in double quotes, with `"` and `\` escaped. Validate keeps keys to the
// printable ASCII an sf-string allows.
func sfString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for i := range len(s) {
		if c := s[i]; c == '"' || c == '\\' {
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
	b.WriteByte('"')
	return b.String()
}

// clipAt is how much of a body evidence shows.
const clipAt = 160

// quote is a body as evidence: trimmed, clipped to clipAt bytes and quoted,
// so that an HTML page or a multi-line body stays on its assertion's line.
func quote(b []byte) string {
	s := strings.TrimSpace(string(b))
	if len(s) > clipAt {
		cut := clipAt
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut] + "…"
	}
	return strconv.Quote(s)
}

// oneLine keeps a name or its evidence on one line.
func oneLine(s string) string {
	return strings.NewReplacer("\r\n", `\n`, "\n", `\n`, "\r", `\r`).Replace(s)
}

// Print writes one line per assertion: STATUS name: seen.
func Print(w io.Writer, rep Report) error {
	var b strings.Builder
	for _, a := range rep.Assertions {
		fmt.Fprintf(&b, "%s %s: %s\n", a.Status, oneLine(a.Name), oneLine(a.Seen))
	}
	how := "profile " + rep.Profile
	if rep.KeyFormat != "" {
		how += ", keys " + rep.KeyFormat
	}
	fmt.Fprintf(&b, "%d passed, %d failed, %d skipped (%s; keys %s*)\n", rep.Passed, rep.Failed, rep.Skipped, how, rep.KeyPrefix)
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
