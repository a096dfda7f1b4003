package reconcile

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/internal/safetext"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/ledger/store"
	"github.com/ledgerkeeper/ledgerkeeper/probes"
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
	// Unreachable: the downstream did not answer (see probes.Unreachable).
	Unreachable bool `json:"unreachable,omitempty"`
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
	// PresentUnverified: the tool had no key completed by its tool server
	// within self_check.max_age, so only the absent side was checked.
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
}

// Trusted reports whether the tool's verdicts may change the ledger.
func (r CheckResult) Trusted() bool { return r.Outcome == CheckTrusted }

// SelfCheck runs the self-check of tool's probe now and returns its result.
// It writes nothing (for `ledgerkeeper probe check` and dry runs).
func (e *Engine) SelfCheck(ctx context.Context, tool string) (CheckResult, error) {
	pol := e.Policy(tool)
	if pol.Probe == nil {
		return CheckResult{}, fmt.Errorf("tool %q has no probe to check", tool)
	}
	return e.runCheck(ctx, tool, pol)
}

// runCheck probes up to SelfCheckSamples keys of tool that its tool server
// completed within SelfCheckMaxAge (each should come back found, with the
// stored values) and one made-up key (it must come back not_found), and
// judges the probe.
func (e *Engine) runCheck(ctx context.Context, tool string, pol Policy) (CheckResult, error) {
	res := CheckResult{Tool: tool, Fingerprint: pol.ProbeFingerprint, Actor: e.cfg.Actor, CheckedAt: time.Now()}
	samples, err := store.SelfCheckSamples(ctx, e.pool, tool, e.cfg.SelfCheckMaxAge, e.cfg.SelfCheckSamples)
	if err != nil {
		return res, err
	}
	var absentBody json.RawMessage
	if len(samples) > 0 {
		absentBody = madeUpRequest(samples[0].RequestBody)
	}
	absent := probes.Key{Key: SelfCheckKeyPrefix + randomHex(12), Tool: tool, RequestBody: absentBody,
		CreatedAt: time.Now(), ClaimedAt: time.Now()}

	res.Samples = make([]SampleCheck, len(samples))
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
	var wg sync.WaitGroup
	for i, s := range samples {
		wg.Go(func() {
			r := probe(probes.Key{Key: s.Key, Tool: s.Tool, RequestBody: s.RequestBody, CreatedAt: s.CreatedAt, ClaimedAt: s.ClaimedAt})
			res.Samples[i] = e.judgePresent(s, r)
		})
	}
	wg.Go(func() {
		r := probe(absent)
		res.Absent = e.judgeAbsent(absent.Key, r)
	})
	wg.Wait()
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

func (e *Engine) sampleCheck(key, expect string, r probes.Result) SampleCheck {
	sc := SampleCheck{Key: key, Expect: expect, Verdict: string(r.Verdict), Evidence: e.cfg.Redactor.JSON(r.Evidence)}
	if r.Err != nil {
		sc.Error = safetext.Clip(e.cfg.Redactor.String(r.Err.Error()), 500)
	}
	sc.Unreachable = probes.Unreachable(r)
	return sc
}

func (e *Engine) judgePresent(k ledger.Key, r probes.Result) SampleCheck {
	sc := e.sampleCheck(k.Key, string(probes.Found), r)
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

// judge sets the outcome: untrusted when the absent side failed, or when
// the present side failed on most samples (on all of them when fewer than
// three were drawn); inconclusive when the downstream did not answer the
// absent side, or answered no sample; trusted otherwise, with the failed
// samples counted as disagreements.
func judge(r *CheckResult) {
	n := len(r.Samples)
	var failed, passed, unreachable int
	for _, s := range r.Samples {
		switch {
		case s.Passed:
			passed++
		case s.Unreachable:
			unreachable++
		default:
			failed++
		}
	}
	r.PresentUnverified = n == 0
	mostFailed := n > 0 && ((n >= 3 && 2*failed > n) || (n < 3 && failed == n))
	absentFailed := !r.Absent.Passed && !r.Absent.Unreachable
	switch {
	case absentFailed || mostFailed:
		r.Outcome = CheckUntrusted
	case r.Absent.Unreachable || (n > 0 && passed == 0):
		r.Outcome = CheckInconclusive
	default:
		r.Outcome = CheckTrusted
		r.Disagreements = failed
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s: the made-up key came back %s", r.Outcome, r.Absent.Verdict)
	if !r.Absent.Passed {
		b.WriteString(" (want not_found)")
	}
	if n == 0 {
		b.WriteString("; present side unverified (no key completed by its tool server within self_check.max_age)")
	} else {
		fmt.Fprintf(&b, "; %d of %d completed keys came back found with their stored values", passed, n)
		if unreachable > 0 {
			fmt.Fprintf(&b, " (%d unanswered)", unreachable)
		}
	}
	r.Summary = b.String()
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
