package reconcile

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/big"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/internal/safetext"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/probes"
	"github.com/ledgerkeeper/ledgerkeeper/store"
)

// Self-check outcomes, as stored in probe_self_checks.outcome.
const (
	// CheckTrusted: the absent side came back not_found and the present
	// side did not fail on most samples. The tool's verdicts are acted on.
	CheckTrusted = "trusted"
	// CheckUntrusted: the probe is broken (typo'd path, renamed field,
	// ignored filter, wrong credentials). No key of the tool changes state
	// and on-call gets one probe_untrusted alert.
	CheckUntrusted = "untrusted"
	// CheckInconclusive: the downstream did not answer (transport error,
	// timeout, 429, 5xx), so it could vouch for nothing. No key of the tool
	// changes state; the circuit breaker counts the failures.
	CheckInconclusive = "inconclusive"
)

// SelfCheckKeyPrefix starts the made-up key of a self-check's absent side:
// a key no tool server ever issued, so its effect cannot exist.
const SelfCheckKeyPrefix = "ledgerkeeper-self-check:"

// SampleCheck is one probe made by a self-check.
type SampleCheck struct {
	Key string `json:"key"`
	// Expect is found (a key its tool server completed) or not_found (the
	// made-up key).
	Expect  string `json:"expect"`
	Verdict string `json:"verdict"`
	Passed  bool   `json:"passed"`
	// Source says where a present-side sample came from: "completed" (a
	// key its tool server completed within self_check.max_age), "canary"
	// (an effect declared or marked to exist downstream), "newest" (the
	// tool's newest key completed by its tool server, at any age).
	Source string `json:"source,omitempty"`
	// Unreachable: the downstream did not answer (see probes.Unreachable).
	Unreachable bool `json:"unreachable,omitempty"`
	// NotRendered: the probe could not be built for this key (a request
	// field the key lacks): the downstream was never asked.
	NotRendered bool `json:"not_rendered,omitempty"`
	// WitnessOnly: the sample can witness presence (found) but its absence
	// is no failure: the newest completed key at any age may be gone
	// downstream by the downstream's own retention.
	WitnessOnly bool `json:"witness_only,omitempty"`
	// Mismatched lists the response_body fields whose value the probe
	// found differs from the stored outcome's.
	Mismatched []string        `json:"mismatched_fields,omitempty"`
	Error      string          `json:"error,omitempty"`
	Evidence   json.RawMessage `json:"evidence,omitempty"`
}

// CheckResult is one self-check of a tool's probe against the ledger's
// ground truth.
type CheckResult struct {
	Tool    string `json:"tool"`
	Outcome string `json:"outcome"`
	// Summary says in one line what was checked and what came back.
	Summary string `json:"summary"`
	// PresentUnverified: no present-side sample came back found (the tool
	// has no key completed by its tool server, no canary, or none was
	// found): nothing witnessed that the probe can find an effect, so its
	// not_found verdicts are held (unless require_witness is off).
	PresentUnverified bool          `json:"present_unverified,omitempty"`
	Samples           []SampleCheck `json:"samples"`
	Absent            SampleCheck   `json:"absent"`
	// Disagreements counts samples that failed while the probe was still
	// trusted: one record deleted or changed downstream.
	Disagreements int       `json:"disagreements"`
	Fingerprint   string    `json:"fingerprint,omitempty"`
	CheckedAt     time.Time `json:"checked_at"`
	Actor         string    `json:"actor,omitempty"`
	// Cached: the result is a stored check still fresh, not a new one.
	Cached bool `json:"cached,omitempty"`
	// Paused: the downstream asked to wait (429 or 503 with Retry-After)
	// during the check, so it vouches for nothing: inconclusive, neither
	// stored nor counted by the circuit breaker; the next pass after the
	// pause checks again.
	Paused bool `json:"paused,omitempty"`
	// SamplesNotSent counts present-side samples drawn but not probed:
	// the made-up key's probe went unanswered, so the check could conclude
	// nothing and sent no more requests to a downstream that may be down.
	SamplesNotSent int `json:"samples_not_sent,omitempty"`
}

// Trusted reports whether the tool's verdicts may change the ledger.
func (r CheckResult) Trusted() bool { return r.Outcome == CheckTrusted }

// Witnessed reports whether at least one present-side sample came back
// found: the probe was seen finding an effect, so its not_found means
// something.
func (r CheckResult) Witnessed() bool {
	return slices.ContainsFunc(r.Samples, func(s SampleCheck) bool { return s.Passed })
}

// SelfCheck runs the self-check of tool's probe now and returns its result.
// It writes nothing (for `ledgerkeeper probe check` and dry runs).
func (e *Engine) SelfCheck(ctx context.Context, tool string) (CheckResult, error) {
	pol := e.Policy(tool)
	if pol.Probe == nil {
		return CheckResult{}, fmt.Errorf("tool %q has no probe to check", tool)
	}
	shape, err := store.PeekDue(ctx, e.pool, store.LeaseParams{Tool: tool, Limit: 1,
		Window: pol.ProcessingWindow + e.cfg.Grace, HeartbeatTimeout: pol.HeartbeatTimeout}, store.Leased{})
	if err = skipUnreachable(ctx, err); err != nil {
		return CheckResult{}, err
	}
	var body json.RawMessage
	if len(shape) > 0 {
		body = shape[0].RequestBody
	}
	samples, err := e.drawSamples(ctx, tool, pol)
	if err != nil {
		return CheckResult{}, err
	}
	return e.runCheck(ctx, tool, pol, body, samples)
}

// sample is one present-side sample of a self-check.
type sample struct {
	key    ledger.Key // ResponseBody: the stored outcome (nil for a canary)
	source string
}

// Present-side sample sources, in the order they are drawn.
const (
	SourceCompleted = "completed"
	SourceCanary    = "canary"
	SourceNewest    = "newest"
)

// newestSampleTimeout bounds the search for the tool's newest completed key
// at any age.
const newestSampleTimeout = 5 * time.Second

// drawSamples picks up to SelfCheckSamples present-side samples of tool, in
// order: keys its tool server completed within SelfCheckMaxAge; then
// canaries (the configuration's, then the operators'); then the tool's
// newest key completed by its tool server at any age still in the ledger.
func (e *Engine) drawSamples(ctx context.Context, tool string, pol Policy) ([]sample, error) {
	n := e.cfg.SelfCheck.Samples
	recent, err := store.SelfCheckSamples(ctx, e.pool, tool, e.cfg.SelfCheck.MaxAge, n)
	if err = skipUnreachable(ctx, err); err != nil {
		return nil, err
	}
	out := make([]sample, 0, n)
	seen := map[string]bool{}
	for _, k := range recent {
		out = append(out, sample{key: k, source: SourceCompleted})
		seen[k.Key] = true
	}
	if len(out) < n {
		canaries, err := e.canaries(ctx, tool, pol)
		if err != nil {
			return nil, err
		}
		for _, c := range canaries {
			if len(out) == n {
				break
			}
			if !seen[c.Key] {
				out = append(out, sample{key: ledger.Key{Key: c.Key, Tool: tool, RequestBody: c.Request}, source: SourceCanary})
				seen[c.Key] = true
			}
		}
	}
	if len(out) < n {
		// Bounded: on a big ledger whose tool has no ground truth at all,
		// the walk back through its keys could be long. Without an answer
		// in time there is simply no such sample.
		nctx, cancel := context.WithTimeout(ctx, newestSampleTimeout)
		k, ok, err := e.newestGroundTruth(nctx, tool, slices.Collect(maps.Keys(seen)))
		cancel()
		switch {
		case err != nil && ctx.Err() == nil && nctx.Err() != nil:
			e.logger.Warn("self-check: no older completed key found in time; drawn without it", "tool", tool, "timeout", newestSampleTimeout)
		case err != nil:
			return nil, err
		case ok:
			out = append(out, sample{key: k, source: SourceNewest})
		}
	}
	return out, nil
}

// runCheck probes the absent side first (a made-up key shaped like shape,
// or like a sample's request: it must come back not_found), then, if the
// downstream answered it, the present-side samples (each should come back
// found, with the stored values), and judges the probe. The absent side goes
// first and alone so that a downstream that answers nothing costs one
// request per check, counted by the breaker before any key is probed.
func (e *Engine) runCheck(ctx context.Context, tool string, pol Policy, shape json.RawMessage, samples []sample) (CheckResult, error) {
	res := CheckResult{Tool: tool, Fingerprint: pol.ProbeFingerprint, Actor: e.cfg.Actor, CheckedAt: time.Now()}
	absentBody := madeUpRequest(absentShape(samples, shape))
	absent := probes.Key{Key: SelfCheckKeyPrefix + randomHex(12), Tool: tool, RequestBody: absentBody,
		CreatedAt: time.Now(), ClaimedAt: time.Now()}

	// Probes of the same downstream: the tool's rate limit and pause apply.
	lim := e.limits[tool]
	var paused atomic.Bool
	probe := func(k probes.Key) probes.Result {
		if !lim.wait(ctx, nil, time.Time{}) {
			return probes.Result{Verdict: probes.Unknown, Err: fmt.Errorf("self-check probe not sent: %w", context.Cause(ctx))}
		}
		if lim.pausedFor() > 0 {
			paused.Store(true)
			return probes.Result{Verdict: probes.Unknown, Err: errors.New("self-check probe not sent: the downstream asked to wait (Retry-After)")}
		}
		r := pol.Probe.Probe(ctx, k)
		if after, ok := probes.Throttled(r); ok {
			paused.Store(true)
			if _, started := lim.pause(after); started {
				e.logger.Warn("downstream asked to wait during a self-check: probing paused", "tool", tool, "retry_after", after)
			}
		}
		return r
	}
	res.Absent = e.judgeAbsent(absent.Key, probe(absent))
	if !res.Absent.Unreachable && !paused.Load() {
		res.Samples = make([]SampleCheck, len(samples))
		var wg sync.WaitGroup
		for i, s := range samples {
			wg.Go(func() {
				k := s.key
				r := probe(probes.Key{Key: k.Key, Tool: k.Tool, RequestBody: k.RequestBody, CreatedAt: k.CreatedAt, ClaimedAt: k.ClaimedAt})
				res.Samples[i] = e.judgePresent(s, r)
			})
		}
		wg.Wait()
	} else {
		res.SamplesNotSent = len(samples)
	}
	if err := context.Cause(ctx); err != nil {
		return res, fmt.Errorf("self-check of tool %q interrupted: %w", tool, err)
	}
	judge(&res)
	if paused.Load() {
		res.Paused, res.Outcome = true, CheckInconclusive
		res.Summary = "inconclusive: the downstream asked to wait (Retry-After) during the check; " + res.Summary
	}
	return res, nil
}

// absentShape is the request body the made-up key's is modelled on: a
// sample's (a real request of the tool), else the due key's.
func absentShape(samples []sample, due json.RawMessage) json.RawMessage {
	for _, s := range samples {
		if len(s.key.RequestBody) > 0 {
			return s.key.RequestBody
		}
	}
	return due
}

func (e *Engine) sampleCheck(key, expect string, r probes.Result) SampleCheck {
	sc := SampleCheck{Key: key, Expect: expect, Verdict: string(r.Verdict), Evidence: e.cfg.Redactor.JSON(r.Evidence)}
	if r.Err != nil {
		sc.Error = safetext.Clip(e.cfg.Redactor.String(r.Err.Error()), 500)
	}
	sc.NotRendered = notRendered(r)
	sc.Unreachable = !sc.NotRendered && probes.Unreachable(r)
	return sc
}

func (e *Engine) judgePresent(s sample, r probes.Result) SampleCheck {
	k := s.key
	sc := e.sampleCheck(k.Key, string(probes.Found), r)
	sc.Source, sc.WitnessOnly = s.source, s.source == SourceNewest
	if r.Verdict != probes.Found {
		return sc
	}
	sc.Mismatched = mismatchedFields(k.ResponseBody, r.Outcome.Body)
	sc.Passed = len(sc.Mismatched) == 0
	return sc
}

func (e *Engine) judgeAbsent(key string, r probes.Result) SampleCheck {
	sc := e.sampleCheck(key, string(probes.NotFound), r)
	sc.Passed = r.Verdict == probes.NotFound
	return sc
}

// judge sets the outcome:
//
//	untrusted     the absent side answered anything but not_found, or the
//	              present side failed on most samples (on all of them
//	              when fewer than three were drawn)
//	inconclusive  the absent side was not answered or could not be
//	              rendered, or samples were drawn and none was answered
//	trusted       otherwise; failed samples are disagreements
//
// A sample that was not answered or not rendered is neither failed nor
// passed; a witness-only sample (an old key, maybe gone downstream) counts
// only when it came back found.
func judge(r *CheckResult) {
	var failed, passed, unanswered int
	for _, s := range r.Samples {
		switch {
		case s.Passed:
			passed++
		case s.Unreachable || s.NotRendered:
			unanswered++
		case s.WitnessOnly:
		default:
			failed++
		}
	}
	n := passed + failed + unanswered
	r.PresentUnverified = passed == 0
	mostFailed := n > 0 && ((n >= 3 && 2*failed > n) || (n < 3 && failed == n))
	absentUnanswered := r.Absent.Unreachable || r.Absent.NotRendered
	absentFailed := !r.Absent.Passed && !absentUnanswered
	switch {
	case absentFailed || mostFailed:
		r.Outcome = CheckUntrusted
	case absentUnanswered || (n > 0 && passed == 0):
		r.Outcome = CheckInconclusive
	default:
		r.Outcome = CheckTrusted
		r.Disagreements = failed
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s: the made-up key came back %s", r.Outcome, r.Absent.Verdict)
	switch {
	case r.Absent.NotRendered:
		b.WriteString(" (the probe could not be rendered for it: " + r.Absent.Error + ")")
	case !r.Absent.Passed:
		b.WriteString(" (want not_found)")
	}
	switch {
	case r.SamplesNotSent > 0:
		fmt.Fprintf(&b, "; %d present-side samples not sent (the made-up key's probe was not answered)", r.SamplesNotSent)
	case len(r.Samples) == 0:
		b.WriteString("; present side unverified (no key completed by its tool server, no canary): add a canary with `ledgerkeeper probe canary add`")
	default:
		fmt.Fprintf(&b, "; %d of %d %s came back found with their stored values", passed, len(r.Samples), sampleNoun(r.Samples))
		if unanswered > 0 {
			fmt.Fprintf(&b, " (%d unanswered)", unanswered)
		}
		if passed == 0 {
			b.WriteString("; present side unverified")
		}
	}
	r.Summary = b.String()
}

// sampleNoun names what the samples are: "completed keys" when all are
// keys completed recently by the tool server, else the mix.
func sampleNoun(samples []SampleCheck) string {
	var canaries, older int
	for _, s := range samples {
		switch s.Source {
		case SourceCanary:
			canaries++
		case SourceNewest:
			older++
		}
	}
	if canaries == 0 && older == 0 {
		return "completed keys"
	}
	return fmt.Sprintf("present-side samples (%d completed recently, %d canaries, %d older completed)", len(samples)-canaries-older, canaries, older)
}

// evidenceText is the check's evidence for an alert: which sample, what
// came back, one line each.
func (r CheckResult) evidenceText() string {
	var b strings.Builder
	line := func(s SampleCheck) {
		fmt.Fprintf(&b, "%s (want %s): %s", s.Key, s.Expect, s.Verdict)
		if len(s.Mismatched) > 0 {
			fmt.Fprintf(&b, ", fields differ from the stored outcome: %s", strings.Join(s.Mismatched, ", "))
		}
		if s.Error != "" {
			b.WriteString(": " + s.Error)
		}
		b.WriteString("\n")
	}
	line(r.Absent)
	for _, s := range r.Samples {
		line(s)
	}
	return strings.TrimRight(b.String(), "\n")
}

// mismatchedFields compares a found outcome with the outcome the tool
// server stored: every top-level member both objects have must be equal
// (numbers by value). Members only one side has are not compared: the
// probe may map a subset, the tool may store more.
func mismatchedFields(stored, got json.RawMessage) []string {
	var s, g map[string]any
	if decodeObject(stored, &s) != nil || decodeObject(got, &g) != nil {
		return nil
	}
	var out []string
	for name, gv := range g {
		sv, ok := s[name]
		if ok && !reflect.DeepEqual(normalize(sv), normalize(gv)) {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

func decodeObject(raw json.RawMessage, into *map[string]any) error {
	if len(raw) == 0 {
		return errors.New("empty")
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	return dec.Decode(into)
}

// normalize makes numbers comparable by value (12 and 12.0 are equal;
// 12345678901234567890 and ...891 are not).
func normalize(v any) any {
	switch x := v.(type) {
	case json.Number:
		if r, ok := new(big.Rat).SetString(string(x)); ok {
			return "n:" + r.RatString()
		}
		return "n:" + string(x)
	case []any:
		out := make([]any, len(x))
		for i, el := range x {
			out[i] = normalize(el)
		}
		return out
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, el := range x {
			out[k] = normalize(el)
		}
		return out
	}
	return v
}
