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

// answer is one HTTP answer as the battery sees it.
type answer struct {
	code     int
	replayed string
	env      ledger.Envelope
	envOK    bool
	raw      []byte
	err      error
}

func (a answer) replay() bool { return a.envOK && a.env.IdempotentReplay }

func (a answer) String() string {
	if a.err != nil {
		return "no answer: " + a.err.Error()
	}
	s := fmt.Sprintf("%d", a.code)
	if a.replay() {
		s += " replay"
	}
	return s
}

type runner struct {
	cfg  Config
	rep  Report
	mu   sync.Mutex
	seen []answer
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
	if cfg.MCPTool != "" {
		return runMCP(ctx, r)
	}
	for _, s := range []func(context.Context){r.probeControl, r.sameKeyTwice, r.otherArguments, r.concurrent, r.missingKey, r.clientDeadline} {
		if ctx.Err() != nil {
			return r.rep, fmt.Errorf("conformance interrupted: %w", ctx.Err())
		}
		s(ctx)
	}
	r.noCached5xx()
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

// send POSTs body with key (none when key is empty) under timeout.
func (r *runner) send(ctx context.Context, key string, body json.RawMessage, timeout time.Duration) answer {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	a := r.do(ctx, key, body)
	r.mu.Lock()
	r.seen = append(r.seen, a)
	r.mu.Unlock()
	return a
}

func (r *runner) do(ctx context.Context, key string, body json.RawMessage) answer {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.cfg.URL, bytes.NewReader(body))
	if err != nil {
		return answer{err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set(ledger.HeaderIdempotencyKey, key)
	}
	resp, err := r.cfg.Client.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return answer{err: err}
	}
	a := answer{code: resp.StatusCode, replayed: resp.Header.Get(ledger.HeaderReplayed), raw: raw}
	var probe map[string]json.RawMessage
	if json.Unmarshal(raw, &probe) == nil && probe["idempotent_replay"] != nil {
		a.envOK = json.Unmarshal(raw, &a.env) == nil
	}
	return a
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

func is2xx(code int) bool { return code >= 200 && code < 300 }

func (r *runner) probeControl(ctx context.Context) {
	r.effect(ctx, "probe-control/a key never sent is not found", r.key("probe-control"), r.cfg.Body, probes.NotFound)
}

func (r *runner) sameKeyTwice(ctx context.Context) {
	key := r.key("same-key-twice")
	first := r.send(ctx, key, r.cfg.Body, r.cfg.Timeout)
	second := r.send(ctx, key, r.cfg.Body, r.cfg.Timeout)
	r.check(is2xx(first.code) && first.err == nil && !first.replay(), "same-key-twice/first answer 2xx, not a replay", "%s", first)
	r.check(is2xx(second.code) && second.err == nil, "same-key-twice/second answer 2xx", "%s", second)
	r.check(second.replay(), "same-key-twice/second answer says idempotent_replay true", "envelope %s", excerpt(second.raw))
	r.check(second.replayed == "true", "same-key-twice/second answer carries the header "+ledger.HeaderReplayed+" true", "header %q", second.replayed)
	n1, n2 := normalise(first.raw), normalise(second.raw)
	r.check(first.code == second.code && n1 != "" && n1 == n2, "same-key-twice/identical bodies after normalisation",
		"first %d %s, second %d %s", first.code, excerpt([]byte(n1)), second.code, excerpt([]byte(n2)))
	r.effect(ctx, "same-key-twice/one effect", key, r.cfg.Body, probes.Found)
}

func (r *runner) otherArguments(ctx context.Context) {
	key := r.key("other-arguments")
	first := r.send(ctx, key, r.cfg.Body, r.cfg.Timeout)
	other := r.send(ctx, key, r.cfg.OtherBody, r.cfg.Timeout)
	r.check(is2xx(first.code) && first.err == nil, "other-arguments/first answer 2xx", "%s", first)
	r.check(other.code == http.StatusUnprocessableEntity, "other-arguments/the key with other arguments gets 422", "%s %s", other, excerpt(other.raw))
	r.effect(ctx, "other-arguments/still one effect", key, r.cfg.Body, probes.Found)
}

func (r *runner) concurrent(ctx context.Context) {
	key := r.key("concurrent")
	n := r.cfg.Concurrency
	answers := together(n, func() answer { return r.send(ctx, key, r.cfg.Body, r.cfg.Timeout) })
	firsts, conflicts, replays := 0, 0, 0
	var others []string
	for _, a := range answers {
		switch {
		case a.err == nil && is2xx(a.code) && !a.replay():
			firsts++
		case a.err == nil && is2xx(a.code) && a.replay():
			replays++
		case a.err == nil && a.code == http.StatusConflict:
			conflicts++
		default:
			others = append(others, a.String())
		}
	}
	seen := fmt.Sprintf("%d requests: %d first answers, %d replays, %d conflicts (409)", n, firsts, replays, conflicts)
	if len(others) > 0 {
		seen += ", other answers: " + strings.Join(others[:min(len(others), 5)], "; ")
	}
	r.check(firsts == 1, "concurrent/exactly one request executed", "%s", seen)
	r.check(len(others) == 0, "concurrent/every other answer a 409 or a replay", "%s", seen)
	r.effect(ctx, "concurrent/exactly one effect", key, r.cfg.Body, probes.Found)
}

func (r *runner) missingKey(ctx context.Context) {
	const name = "missing-key/a request without Idempotency-Key gets 400"
	if r.cfg.AllowMissingKey {
		r.record(Skip, name, "the tool accepts requests without a key (--allow-missing-key)")
		return
	}
	a := r.send(ctx, "", r.cfg.Body, r.cfg.Timeout)
	r.check(a.code == http.StatusBadRequest, name, "%s %s", a, excerpt(a.raw))
}

func (r *runner) clientDeadline(ctx context.Context) {
	const prefix = "client-deadline/"
	if len(r.cfg.SlowBody) == 0 {
		r.record(Skip, prefix+"the retry after a client deadline gets 409, never a second effect", "needs a slow-path request (--slow-body) that takes longer than the client deadline")
		return
	}
	key := r.key("client-deadline")
	first := r.send(ctx, key, r.cfg.SlowBody, r.cfg.SlowDeadline)
	if !r.check(errors.Is(first.err, context.DeadlineExceeded), prefix+"the slow request outlives the client deadline",
		"%s within %s", first, r.cfg.SlowDeadline) {
		return
	}
	retry := r.send(ctx, key, r.cfg.SlowBody, r.cfg.Timeout)
	r.check(retry.err == nil && (retry.code == http.StatusConflict || (is2xx(retry.code) && retry.replay())),
		prefix+"the immediate retry gets 409 (or a replay), not a second execution", "%s %s", retry, excerpt(retry.raw))
	// Wait for the slow request to finish: retry until it is no longer in
	// flight.
	deadline := time.Now().Add(r.cfg.Settle)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	last := retry
	for last.err == nil && last.code == http.StatusConflict && time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		last = r.send(ctx, key, r.cfg.SlowBody, r.cfg.Timeout)
	}
	r.check(last.err == nil && is2xx(last.code) && last.replay(), prefix+"once finished, a retry gets the stored outcome replayed",
		"%s %s", last, excerpt(last.raw))
	r.effect(ctx, prefix+"one effect", key, r.cfg.SlowBody, probes.Found)
}

func (r *runner) noCached5xx() {
	var bad []string
	for _, a := range r.seen {
		if a.err == nil && a.code >= 500 && (a.replay() || a.replayed == "true") {
			bad = append(bad, fmt.Sprintf("%d %s", a.code, excerpt(a.raw)))
		}
	}
	seen := fmt.Sprintf("%d answers, none a replayed 5xx", len(r.seen))
	if len(bad) > 0 {
		seen = fmt.Sprintf("%d of %d answers a replayed 5xx, e.g. %s", len(bad), len(r.seen), bad[0])
	}
	r.check(len(bad) == 0, "no-cached-5xx/a 5xx is never stored and replayed", "%s", seen)
}

// normalise returns the body's canonical JSON with the replay flag set
// aside ("" when the body is not JSON).
func normalise(raw []byte) string {
	var m map[string]json.RawMessage
	if json.Unmarshal(raw, &m) == nil && m != nil {
		delete(m, "idempotent_replay")
		b, err := json.Marshal(m)
		if err != nil {
			return ""
		}
		raw = b
	}
	c, err := ledger.Canonical(raw)
	if err != nil {
		return ""
	}
	return string(c)
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
